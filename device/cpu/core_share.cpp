#include "device/cpu/core_share.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace mt {

CpuTimes parse_proc_stat(std::string_view text, const std::vector<int>& cpus, double ticks_per_s) {
  CpuTimes out;
  std::vector<char> seen(cpus.size(), 0);
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || line[3] < '0' || line[3] > '9') continue;
    std::istringstream fields(line.substr(3));
    int cpu = -1;
    fields >> cpu;
    const auto it = std::find(cpus.begin(), cpus.end(), cpu);
    if (it == cpus.end()) continue;
    // user nice system idle iowait irq softirq steal [guest guest_nice: already in user, nice]
    double v[8] = {};
    for (double& x : v) fields >> x;
    if (!fields) throw std::runtime_error("/proc/stat: malformed line for cpu" + std::to_string(cpu) + ": " + line);
    out.busy_s += (v[0] + v[1] + v[2] + v[5] + v[6]) / ticks_per_s;
    out.steal_s += v[7] / ticks_per_s;
    seen[static_cast<std::size_t>(it - cpus.begin())] = 1;
  }
  for (std::size_t i = 0; i < cpus.size(); ++i)
    if (!seen[i]) throw std::runtime_error("/proc/stat: no line for cpu" + std::to_string(cpus[i]));
  return out;
}

CoreShareMeter::CoreShareMeter() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus_.push_back(c);
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (hz > 0) ticks_per_s_ = static_cast<double>(hz);
  last_ = read();
}

double CoreShareMeter::wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::optional<CoreShareMeter::Reading> CoreShareMeter::read() const {
  if (cpus_.empty()) return std::nullopt;
  std::ifstream f("/proc/stat");
  if (!f) return std::nullopt;
  std::stringstream text;
  text << f.rdbuf();
  Reading r;
  try {
    r.cpus = parse_proc_stat(text.str(), cpus_, ticks_per_s_);
  } catch (const std::runtime_error&) {
    return std::nullopt;  // a /proc we cannot read: no adaptation, never a failed run
  }
  timespec cpu{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
  r.self_cpu_s = static_cast<double>(cpu.tv_sec) + 1e-9 * static_cast<double>(cpu.tv_nsec);
  r.wall_s = wall_now();
  return r;
}

std::optional<CoreShare> CoreShareMeter::sample(double min_window_s) {
  if (!last_) {
    last_ = read();
    return std::nullopt;
  }
  if (wall_now() - last_->wall_s < min_window_s) return std::nullopt;  // /proc/stat read only per window
  const std::optional<Reading> now = read();
  if (!now) return std::nullopt;
  const double window = now->wall_s - last_->wall_s;
  CoreShare s;
  s.window_s = window;
  s.cores = cores();
  const double others_busy = (now->cpus.busy_s - last_->cpus.busy_s) - (now->self_cpu_s - last_->self_cpu_s);
  s.steal_cores = std::max(0.0, now->cpus.steal_s - last_->cpus.steal_s) / window;
  s.others_cores = std::clamp(std::max(0.0, others_busy) / window + s.steal_cores, 0.0, static_cast<double>(s.cores));
  last_ = now;
  return s;
}

int ThreadsForShare::update(const CoreShare& share) {
  const double left = static_cast<double>(share.cores) - share.others_cores;
  const int want = std::clamp(static_cast<int>(std::lround(left)), 1, configured_);
  if (want == current_) {
    pending_ = 0;
    return current_;
  }
  if (pending_ == want) {
    current_ = want;
    pending_ = 0;
  } else {
    pending_ = want;
  }
  return current_;
}

}  // namespace mt
