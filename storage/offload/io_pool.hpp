// Direct I/O for the NVMe tier: a transfer (one buffer, one file range) is cut into chunks that a pool
// of threads moves with pread / pwrite, `threads` chunks in flight (the queue depth). Every call's
// byte count is checked: a short transfer continues where it stopped, an error or an end of file
// (truncation) fails the transfer with a message naming the file, the offset and the errno text.
// (io_uring was measured against this pool on the same files: tools/bench/run offload.)
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mt::offload {

inline constexpr std::size_t kDirectAlign = 4096;  // O_DIRECT: buffer, offset and length multiples of this

class IoPool {
 public:
  IoPool(int threads, std::size_t chunk_bytes);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  // Reads or writes `bytes` at `offset` of fd (path: for messages); blocks until done. Throws
  // MomentStoreError on failure. Several callers may transfer at once; their chunks share the pool.
  void transfer(int fd, const std::string& path, bool write, std::byte* buf, std::size_t bytes, std::uint64_t offset);

  int threads() const { return static_cast<int>(workers_.size()); }
  std::size_t chunk_bytes() const { return chunk_; }

 private:
  struct Batch;
  struct Chunk {
    Batch* batch;
    std::byte* buf;
    std::size_t bytes;
    std::uint64_t offset;
  };
  void work();

  std::size_t chunk_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Chunk> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace mt::offload
