// Runs a measurement in a forked child process and hands its result back through a pipe.
//
// Why: libgomp counts the OpenMP workers of every thread that ran a parallel region, and once they
// outnumber the cores it stops spin-waiting in every team (kernels/cpu/ops.hpp, release_thread_pool).
// An engine run in a process that already ran others can inherit that count and measure slower than
// the single run a user makes with `megatrain train` (the plan bench's later configurations measured
// 13-21% slow). A fresh process per run rules it out. The parent ends its own pool first: a child of a
// process whose workers still exist would wait on them forever at its first parallel region.
#pragma once
#include <cstdio>
#include <exception>
#include <functional>
#include <optional>
#include <type_traits>

#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cpu/ops.hpp"

namespace mt::bench {

// A measurement running in a forked child: start() forks and runs fn there; wait() collects its result
// (nothing when the child failed: it printed why on stderr, or could not start). Several may run at
// once (the contention benchmark runs two engines side by side).
template <class Result>
class ChildRun {
  static_assert(std::is_trivially_copyable_v<Result>, "the result crosses a pipe as bytes");

 public:
  explicit ChildRun(const std::function<Result()>& fn) {
    cpu::release_thread_pool();
    std::fflush(stdout);
    std::fflush(stderr);
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ < 0) {
      close(fds[0]);
      close(fds[1]);
      return;
    }
    if (pid_ == 0) {
      close(fds[0]);
      bool ok = false;
      Result r{};
      try {
        r = fn();
        ok = true;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ok = ok && write(fds[1], &r, sizeof r) == static_cast<ssize_t>(sizeof r);
      _exit(ok ? 0 : 1);
    }
    close(fds[1]);
    fd_ = fds[0];
  }
  ChildRun(const ChildRun&) = delete;
  ChildRun& operator=(const ChildRun&) = delete;
  ~ChildRun() { wait(); }

  std::optional<Result> wait() {
    if (pid_ <= 0) return result_;
    Result r{};
    const bool got = read(fd_, &r, sizeof r) == static_cast<ssize_t>(sizeof r);
    close(fd_);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    if (got && WIFEXITED(status) && WEXITSTATUS(status) == 0) result_ = r;
    return result_;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::optional<Result> result_;
};

// fn's result from a child process of its own, or nothing when the child failed.
template <class Result>
std::optional<Result> in_child_process(const std::function<Result()>& fn) {
  return ChildRun<Result>(fn).wait();
}

}  // namespace mt::bench
