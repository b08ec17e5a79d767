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

// fn's result, or nothing when the child failed (it printed why on stderr) or could not start.
template <class Result>
std::optional<Result> in_child_process(const std::function<Result()>& fn) {
  static_assert(std::is_trivially_copyable_v<Result>, "the result crosses a pipe as bytes");
  cpu::release_thread_pool();
  std::fflush(stdout);
  std::fflush(stderr);
  int fds[2];
  if (pipe(fds) != 0) return std::nullopt;
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return std::nullopt;
  }
  if (pid == 0) {
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
  Result r{};
  const bool got = read(fds[0], &r, sizeof r) == static_cast<ssize_t>(sizeof r);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return r;
}

}  // namespace mt::bench
