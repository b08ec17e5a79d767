// How many of this process's cores other processes are taking, so the engine can give them up instead
// of fighting for them (issue "fair on shared cores"). OpenMP's fork-join regions end in a barrier that
// waits for the slowest thread; when another process holds one of the cores, every region waits for the
// thread that is queued behind it, and a run loses far more than the core it shares (measured on the
// demo on 2 cores: 1.44x the 1-thread step beside one busy loop, 1.97x twice the solo step for two runs
// at once; tools/bench/run contention). Running one thread fewer while the core is taken costs only
// that core.
//
// Measured from /proc/stat over a window, on the CPUs this process may run on (its affinity mask):
//   others = (busy time of those CPUs - this process's CPU time) / window + their steal time / window
// in cores. Results never depend on the thread count (kernels/README.md), so changing it between steps
// keeps every bit.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

struct CpuTimes {
  double busy_s = 0.0;   // user + nice + system + irq + softirq
  double steal_s = 0.0;  // the hypervisor ran someone else
};

// Sums the times of the listed CPUs ("cpuN" lines) of /proc/stat's text. Throws std::runtime_error
// naming the CPU when one is missing or a line is malformed.
CpuTimes parse_proc_stat(std::string_view text, const std::vector<int>& cpus, double ticks_per_s);

struct CoreShare {
  double window_s = 0.0;
  int cores = 0;              // CPUs this process may run on
  double others_cores = 0.0;  // taken by other processes (and steal), in cores
  double steal_cores = 0.0;   // of those, the hypervisor's steal
};

class CoreShareMeter {
 public:
  // Reads the affinity mask and a first sample. A machine without /proc/stat gives no samples.
  CoreShareMeter();
  // The share since the previous sample that returned one, once at least `min_window_s` passed;
  // nullopt before that, or when /proc/stat cannot be read.
  std::optional<CoreShare> sample(double min_window_s = 0.2);
  int cores() const { return static_cast<int>(cpus_.size()); }

 private:
  struct Reading {
    double wall_s = 0.0, self_cpu_s = 0.0;
    CpuTimes cpus;
  };
  std::optional<Reading> read() const;
  static double wall_now();

  std::vector<int> cpus_;
  double ticks_per_s_ = 100.0;
  std::optional<Reading> last_;
};

// The compute threads to run with, given the configured count, the count in use and the last share:
// the cores left to this run, rounded, between 1 and `configured`. A change needs two windows in a row
// that ask for it (`pending` carries the first), so one burst of another process changes nothing.
class ThreadsForShare {
 public:
  explicit ThreadsForShare(int configured) : configured_(configured < 1 ? 1 : configured), current_(configured_) {}
  // Returns the count to use from now on (== current() when nothing changes).
  int update(const CoreShare& share);
  int current() const { return current_; }

 private:
  int configured_;
  int current_;
  int pending_ = 0;  // the count the previous window asked for, 0 = none
};

}  // namespace mt
