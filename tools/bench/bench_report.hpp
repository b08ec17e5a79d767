// The benchmark harness: timing (best of several repetitions, the machines are noisy) and the report
// format every benchmark ends with: one JSON object per line per figure,
//   {"bench", "metric", "value", "unit", "ceiling", "ratio", "target", "better"}.
// `ceiling` is measured in the same run (the best this machine offers for that work, or a peer) and
// `ratio` = value / ceiling; both are null when a figure has no measured reference. `target` is the
// goal an issue set (null when none); `better` says which way is better ("higher" or "lower").
// tools/bench/README.md lists every figure's reference.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::bench {

// Operands 64-byte aligned, as the engine's tiles and arena hold them: a library can run at another
// speed on malloc's 16-byte alignment (oneDNN's AVX2 sgemm runs faster on it, for one), and the
// benches measure what a run gets.
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(std::size_t n) {
    const std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    if (void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes)) return static_cast<T*>(p);
    throw std::bad_alloc();
  }
  void deallocate(T* p, std::size_t) { std::free(p); }
  template <class U>
  bool operator==(const Aligned64<U>&) const {
    return true;
  }
};
template <class T>
using AlignedVector = std::vector<T, Aligned64<T>>;

// Seconds of the fastest of `reps` runs of `fn`, after `warmup` unmeasured runs.
inline double best_seconds(const std::function<void()>& fn, int reps, int warmup = 1) {
  for (int i = 0; i < warmup; ++i) fn();
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The fastest of `reps` runs of each of a and b, run alternately (a, b, a, b, ...), so that this machine's
// drifting memory bandwidth affects both alike: for a kernel beside the probe of its access pattern.
inline std::pair<double, double> best_seconds_alternating(const std::function<void()>& a,
                                                          const std::function<void()>& b, int reps) {
  a();
  b();
  double best_a = 1e300, best_b = 1e300;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    a();
    best_a = std::min(best_a, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    t0 = std::chrono::steady_clock::now();
    b();
    best_b = std::min(best_b, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return {best_a, best_b};
}

// The median of `v` (0 when empty): the benchmarks' figure for repeated step times, so that one step
// disturbed by this noisy machine does not decide it.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Figure {
  std::string metric;
  double value;
  std::string unit;
  double ceiling;                 // measured in the same run, in the same unit (0 when there is none)
  double target = 0.0;            // the goal, in the unit of `value` (or of `ratio` when ceiling > 0); 0 = none
  std::string better = "higher";  // "higher" | "lower"
};

// Collects figures while the benchmark prints readable lines, then prints the JSON lines last.
class Report {
 public:
  explicit Report(std::string bench) : bench_(std::move(bench)) {}
  void add(const Figure& f) { figures_.push_back(f); }
  void print() const {
    for (const auto& f : figures_) {
      nlohmann::json j{{"bench", bench_}, {"metric", f.metric}, {"value", f.value}, {"unit", f.unit}};
      j["ceiling"] = f.ceiling > 0 ? nlohmann::json(f.ceiling) : nlohmann::json(nullptr);
      j["ratio"] = f.ceiling > 0 ? nlohmann::json(f.value / f.ceiling) : nlohmann::json(nullptr);
      j["target"] = f.target != 0.0 ? nlohmann::json(f.target) : nlohmann::json(nullptr);
      j["better"] = f.better;
      std::printf("%s\n", j.dump().c_str());
    }
    std::fflush(stdout);
  }

 private:
  std::string bench_;
  std::vector<Figure> figures_;
};

}  // namespace mt::bench
