#include "device/cpu/copy_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace mt {

namespace {

using Clock = std::chrono::steady_clock;

double now_seconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

void sleep_until_seconds(double t) {
  std::this_thread::sleep_until(
      Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t))));
}

}  // namespace

CopyEngine::CopyEngine(const CopyEngineOptions& options) : options_(options) {
  if (options_.workers < 1 || options_.workers > 2)
    throw std::invalid_argument("copy engine: workers must be 1 or 2, got " + std::to_string(options_.workers));
  if (!(options_.bandwidth_bytes_per_s >= 0.0))
    throw std::invalid_argument("copy engine: bandwidth limit must be >= 0 bytes/s");
  if (options_.chunk_bytes == 0) throw std::invalid_argument("copy engine: chunk_bytes must be > 0");
  for (int w = 0; w < options_.workers; ++w) workers_.emplace_back([this, w] { worker_loop(w); });
}

CopyEngine::~CopyEngine() { shutdown(); }

std::uint64_t CopyEngine::submit(CopyJob job) {
  if (job.bytes > 0 && (job.src == nullptr || job.dst == nullptr))
    throw std::invalid_argument("copy engine: null source or destination for a copy of " + std::to_string(job.bytes) +
                                " bytes");
  std::uint64_t sequence;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw std::logic_error("copy engine: submit after shutdown");
    sequence = next_sequence_++;
    const int link = static_cast<int>(job.direction);  // read before job is moved from
    links_[link].queue.push_back(Pending{sequence, std::move(job)});
    stats_.queued_jobs++;
    stats_.max_queued_jobs = std::max(stats_.max_queued_jobs, stats_.queued_jobs);
  }
  work_available_.notify_all();  // with one worker per direction, only the right one may take it
  return sequence;
}

std::future<void> CopyEngine::submit_with_future(CopyJob job) {
  auto done = std::make_shared<std::promise<void>>();
  auto future = done->get_future();
  auto user_callback = std::move(job.on_done);
  job.on_done = [done, user_callback = std::move(user_callback)] {
    if (user_callback) {
      try {
        user_callback();
      } catch (...) {
        done->set_exception(std::current_exception());
        throw;  // also counted as a callback error
      }
    }
    done->set_value();
  };
  submit(std::move(job));
  return future;
}

bool CopyEngine::take_next(int worker_index, Pending& out, int& direction) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (options_.workers == 2) {
      direction = worker_index;  // worker 0 serves host_to_device, worker 1 device_to_host
    } else {
      // One worker: the oldest job of either direction (submission order overall).
      auto& h2d = links_[0].queue;
      auto& d2h = links_[1].queue;
      if (!h2d.empty() && (d2h.empty() || h2d.front().sequence < d2h.front().sequence))
        direction = 0;
      else
        direction = d2h.empty() ? -1 : 1;
    }
    if (direction >= 0 && !links_[direction].queue.empty()) {
      out = std::move(links_[direction].queue.front());
      links_[direction].queue.pop_front();
      return true;
    }
    if (stopping_) return false;  // queues drained
    work_available_.wait(lock);
  }
}

void CopyEngine::run_job(int direction, Pending& pending) {
  const CopyJob& job = pending.job;
  const double start = now_seconds();
  double throttled = 0.0;
  const double limit = options_.bandwidth_bytes_per_s;
  // Only this worker touches this link's pacing state (one worker per direction, or a single worker).
  double& link_free_at = links_[direction].free_at_seconds;
  const auto* src = static_cast<const std::byte*>(job.src);
  auto* dst = static_cast<std::byte*>(job.dst);
  for (std::size_t done = 0; done < job.bytes;) {
    const std::size_t chunk = std::min(options_.chunk_bytes, job.bytes - done);
    std::memcpy(dst + done, src + done, chunk);
    done += chunk;
    if (limit > 0.0) {
      // The link carries this chunk after whatever it carried before, at `limit` bytes per second.
      link_free_at = std::max(link_free_at, start) + static_cast<double>(chunk) / limit;
      const double now = now_seconds();
      if (link_free_at > now) {
        sleep_until_seconds(link_free_at);
        throttled += link_free_at - now;
      }
    }
  }
  const double busy = now_seconds() - start;
  {
    // Counted before the callback runs, so a caller woken by it (or by the future) sees this job.
    std::lock_guard<std::mutex> lock(mutex_);
    auto& s = stats_.direction[static_cast<std::size_t>(direction)];
    s.jobs++;
    s.bytes += job.bytes;
    s.busy_seconds += busy;
    s.throttle_seconds += throttled;
  }
  bool callback_failed = false;
  if (job.on_done) {
    try {
      job.on_done();
    } catch (...) {
      callback_failed = true;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.queued_jobs--;  // after the callback: wait_idle() returns once every callback has run
    if (callback_failed) stats_.callback_errors++;
  }
  idle_.notify_all();
}

void CopyEngine::worker_loop(int worker_index) {
  Pending pending{0, {}};
  int direction = 0;
  while (take_next(worker_index, pending, direction)) {
    run_job(direction, pending);
    pending.job = CopyJob{};  // drop the callback's captures now, not at the next job
  }
}

void CopyEngine::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] { return stats_.queued_jobs == 0; });
}

void CopyEngine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_available_.notify_all();
  for (auto& w : workers_)
    if (w.joinable()) w.join();
  workers_.clear();
}

CopyEngineStats CopyEngine::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace mt
