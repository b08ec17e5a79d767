// Optional time accounting by kernel category, for the benchmarks' time split. Off by default: a
// disabled Scope costs one relaxed atomic load. Counters are atomics, so concurrent callers are safe.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>

namespace mt::prof {

enum Cat { matmul, attention, elementwise, loss, optimizer, kNumCats };
inline const char* cat_name(Cat c) {
  static const char* names[] = {"matmul", "attention", "elementwise", "loss", "optimizer"};
  return names[c];
}

inline std::atomic<bool>& enabled() {
  static std::atomic<bool> on{false};
  return on;
}
inline std::atomic<std::int64_t>* counters() {
  static std::atomic<std::int64_t> ns[kNumCats];
  return ns;
}
inline void reset() {
  for (int i = 0; i < kNumCats; ++i) counters()[i].store(0);
}
inline double seconds(Cat c) { return static_cast<double>(counters()[c].load()) * 1e-9; }

class Scope {
 public:
  explicit Scope(Cat c) : cat_(c), on_(enabled().load(std::memory_order_relaxed)) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~Scope() {
    if (on_)
      counters()[cat_].fetch_add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count());
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Cat cat_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace mt::prof
