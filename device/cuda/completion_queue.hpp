// The CUDA backend's copy completions for one link direction: copies are queued in the order they were
// enqueued on their stream, and one poller thread waits for each in that order (the stream finishes them
// in order), then runs its callback, once, and counts its bytes and busy time. wait_idle() returns when
// every queued copy's callback has run. Plain C++ with the wait injected (a CUDA event in the backend, a
// fake completing in any order in the CI tests), so the ordering logic is tested without a GPU.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "device/backend.hpp"

namespace mt::cuda {

template <class Token>
class CompletionQueue {
 public:
  // Blocks until the token's copy finished; returns the seconds the copy itself took.
  using Wait = std::function<double(Token&)>;

  explicit CompletionQueue(Wait wait) : wait_(std::move(wait)), poller_([this] { run(); }) {}
  ~CompletionQueue() { stop(); }
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // Callers enqueue the copy on its stream and push it under one lock of their own, so the queue's order
  // is the stream's.
  void push(Token token, std::size_t bytes, std::function<void()> on_done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(Entry{std::move(token), bytes, std::move(on_done)});
    }
    work_.notify_one();
  }

  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return queue_.empty(); });
  }

  LinkDirectionStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  // Drains what is queued (every callback runs), then ends the poller. Idempotent.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_.notify_all();
    if (poller_.joinable()) poller_.join();
  }

 private:
  struct Entry {
    Token token;
    std::size_t bytes = 0;
    std::function<void()> on_done;
  };

  void run() {
    for (;;) {
      Entry* e = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopped, and everything drained
        e = &queue_.front();         // stays queued (wait_idle) until its callback ran; deque keeps it in place
      }
      const double busy = wait_(e->token);
      if (e->on_done) e->on_done();
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.copies += 1;
        stats_.bytes += e->bytes;
        stats_.busy_seconds += busy;
        queue_.pop_front();
      }
      idle_.notify_all();
    }
  }

  Wait wait_;
  mutable std::mutex mu_;
  std::condition_variable work_, idle_;
  std::deque<Entry> queue_;
  bool stop_ = false;
  LinkDirectionStats stats_;
  std::thread poller_;  // last: starts after everything it reads exists
};

}  // namespace mt::cuda
