// The benchmark harness: timing (best of several repetitions, the machines are noisy) and the report
// format every benchmark ends with: one JSON object per line per figure,
//   {"bench", "metric", "value", "unit", "ceiling", "ratio"}.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::bench {

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

struct Figure {
  std::string metric;
  double value;
  std::string unit;
  double ceiling;  // what value is measured against, in the same unit (0 when there is none)
};

// Collects figures while the benchmark prints readable lines, then prints the JSON lines last.
class Report {
 public:
  explicit Report(std::string bench) : bench_(std::move(bench)) {}
  void add(const Figure& f) { figures_.push_back(f); }
  void print() const {
    for (const auto& f : figures_) {
      nlohmann::json j{{"bench", bench_}, {"metric", f.metric},   {"value", f.value},
                       {"unit", f.unit},  {"ceiling", f.ceiling}, {"ratio", f.ceiling > 0 ? f.value / f.ceiling : 0.0}};
      std::printf("%s\n", j.dump().c_str());
    }
    std::fflush(stdout);
  }

 private:
  std::string bench_;
  std::vector<Figure> figures_;
};

}  // namespace mt::bench
