// Test helpers for sharing cores: two CPUs of this process's mask, and a process that burns one CPU.
#pragma once
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

namespace mt::test {

// The first two CPUs this process may run on (fewer on a one-CPU machine).
inline std::vector<int> first_two_cpus() {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof mine, &mine) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &mine)) cpus.push_back(c);
  return cpus;
}

// Runs the calling thread (and the threads it starts) on `cpus` until the scope ends.
class PinnedTo {
 public:
  explicit PinnedTo(const std::vector<int>& cpus) {
    ::sched_getaffinity(0, sizeof saved_, &saved_);
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus) CPU_SET(c, &set);
    ok_ = ::sched_setaffinity(0, sizeof set, &set) == 0;
  }
  ~PinnedTo() { ::sched_setaffinity(0, sizeof saved_, &saved_); }
  PinnedTo(const PinnedTo&) = delete;
  PinnedTo& operator=(const PinnedTo&) = delete;
  bool ok() const { return ok_; }

 private:
  cpu_set_t saved_{};
  bool ok_ = false;
};

// A child process that burns CPU `cpu` until the scope ends.
class BusyLoop {
 public:
  explicit BusyLoop(int cpu) {
    pid_ = ::fork();
    if (pid_ == 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      ::sched_setaffinity(0, sizeof one, &one);
      volatile unsigned long x = 0;
      for (;;) x = x + 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let it take its CPU
  }
  ~BusyLoop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  BusyLoop(const BusyLoop&) = delete;
  BusyLoop& operator=(const BusyLoop&) = delete;
  bool ok() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

}  // namespace mt::test
