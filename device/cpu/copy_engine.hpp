// The CPU backend's stand-in for a PCIe link: copies between host tiles and device arena slots on its
// own worker thread(s), in FIFO order per direction, with an optional bandwidth limit per direction
// (PCIe is full duplex), so overlap of transfers with compute can be measured on a laptop.
//
// Pacing: each direction is a link that is busy until `link_free_at`; a chunk of c bytes finishes no
// earlier than max(start, link_free_at) + c / limit, and the worker sleeps until then. A job of N bytes
// therefore takes >= N / limit seconds, and back-to-back jobs cannot exceed the limit on average.
//
// Completion: a callback on the worker thread (keep it short: send a message, set a flag) and/or a
// future. A job's bytes are in stats() before its callback runs; wait_idle() returns after every
// callback ran. Shutdown (explicit or in the destructor) finishes every queued job, then joins the
// workers; call it from one thread.
#pragma once
#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace mt {

enum class CopyDirection { host_to_device = 0, device_to_host = 1 };

struct CopyJob {
  CopyDirection direction = CopyDirection::host_to_device;
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t bytes = 0;
  std::function<void()> on_done;  // optional; runs on the worker thread after the bytes landed
};

struct CopyEngineOptions {
  // 1: one worker serves both directions in submission order; 2: one worker per direction (full duplex).
  int workers = 2;
  // Per direction, bytes per second; 0 = unlimited (memcpy speed).
  double bandwidth_bytes_per_s = 0.0;
  // Copies are done (and paced) in chunks of this size, so a long copy is paced smoothly.
  std::size_t chunk_bytes = std::size_t{1} << 20;
};

struct CopyDirectionStats {
  std::uint64_t jobs = 0;
  std::uint64_t bytes = 0;
  double busy_seconds = 0.0;      // wall time spent on jobs of this direction, pacing included
  double throttle_seconds = 0.0;  // of which sleeping for the bandwidth limit
};

struct CopyEngineStats {
  std::array<CopyDirectionStats, 2> direction{};  // indexed by CopyDirection
  std::uint64_t queued_jobs = 0;                  // submitted, not yet finished
  std::uint64_t max_queued_jobs = 0;              // high-water mark of queued_jobs
  std::uint64_t callback_errors = 0;              // on_done callbacks that threw (caught, counted)
  const CopyDirectionStats& of(CopyDirection d) const { return direction[static_cast<int>(d)]; }
};

class CopyEngine {
 public:
  // Starts the workers. Throws std::invalid_argument for workers outside 1..2, a negative limit or a
  // zero chunk size.
  explicit CopyEngine(const CopyEngineOptions& options = {});
  ~CopyEngine();  // shutdown()
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Queues a copy; returns its sequence number (1, 2, ... in submission order).
  // Throws std::logic_error after shutdown, std::invalid_argument for null pointers with bytes > 0.
  std::uint64_t submit(CopyJob job);
  // Queues a copy and returns a future that becomes ready when it is done (after job.on_done ran).
  std::future<void> submit_with_future(CopyJob job);

  void wait_idle();  // blocks until every job submitted so far is finished
  void shutdown();   // finishes queued jobs, joins workers; idempotent
  CopyEngineStats stats() const;
  const CopyEngineOptions& options() const { return options_; }

 private:
  struct Pending {
    std::uint64_t sequence;
    CopyJob job;
  };
  struct Link {
    std::deque<Pending> queue;
    double free_at_seconds = 0.0;  // pacing: when this direction's link is next free (steady clock)
  };
  void worker_loop(int worker_index);
  bool take_next(int worker_index, Pending& out, int& direction);  // false: stop
  void run_job(int direction, Pending& pending);

  CopyEngineOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable work_available_;
  std::condition_variable idle_;
  std::array<Link, 2> links_;
  CopyEngineStats stats_;
  std::uint64_t next_sequence_ = 1;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace mt
