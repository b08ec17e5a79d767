#include "storage/offload/io_pool.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "storage/host/moment_store.hpp"

namespace mt::offload {

struct IoPool::Batch {
  int fd = -1;
  const std::string* path = nullptr;
  bool write = false;
  std::size_t pending = 0;
  std::string error;  // the first failure
  std::condition_variable done;
};

IoPool::IoPool(int threads, std::size_t chunk_bytes) : chunk_(chunk_bytes) {
  if (threads < 1) throw std::invalid_argument("IoPool: threads must be >= 1");
  if (chunk_bytes == 0 || chunk_bytes % kDirectAlign != 0)
    throw std::invalid_argument("IoPool: chunk bytes must be a positive multiple of 4096");
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

IoPool::~IoPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void IoPool::transfer(int fd, const std::string& path, bool write, std::byte* buf, std::size_t bytes,
                      std::uint64_t offset) {
  Batch b;
  b.fd = fd;
  b.path = &path;
  b.write = write;
  std::unique_lock<std::mutex> lock(mutex_);
  for (std::size_t done = 0; done < bytes; done += chunk_) {
    queue_.push_back(Chunk{&b, buf + done, std::min(chunk_, bytes - done), offset + done});
    ++b.pending;
  }
  cv_.notify_all();
  b.done.wait(lock, [&] { return b.pending == 0; });
  if (!b.error.empty()) throw MomentStoreError(b.error);
}

namespace {

// Moves one chunk; returns "" or what failed. A regular file transfers all it was asked for unless it
// ends (read: truncated) or cannot grow (write: disk full, file-size limit). A short count continues
// where it stopped (at a 4096-byte boundary: O_DIRECT), so the call that cannot go on reports why: the
// errno (ENOSPC, EFBIG, EIO) or, for a read, the end of the file.
std::string move_chunk(int fd, const std::string& path, bool write, std::byte* buf, std::size_t bytes,
                       std::uint64_t offset) {
  const std::string where = std::string("offload file ") + path + ": " + (write ? "write" : "read") + " of " +
                            std::to_string(bytes) + " bytes at offset " + std::to_string(offset);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t r = write ? ::pwrite(fd, buf + done, bytes - done, static_cast<off_t>(offset + done))
                            : ::pread(fd, buf + done, bytes - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    const std::string so_far = done > 0 ? " after " + std::to_string(done) + " bytes" : "";
    if (r < 0) return where + " failed" + so_far + ": " + std::strerror(errno);
    if (r == 0)
      return where + (write ? " wrote only " : " read only ") + std::to_string(done) + " bytes" +
             (write ? " (disk full or file-size limit)" : " (the file is truncated)");
    done += static_cast<std::size_t>(r);
    if (done < bytes && done % kDirectAlign != 0)  // cannot continue with O_DIRECT from here
      return where + (write ? " wrote only " : " read only ") + std::to_string(done) + " bytes" +
             (write ? " (disk full or file-size limit)" : " (the file is truncated)");
  }
  return "";
}

}  // namespace

void IoPool::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Chunk c = queue_.front();
    queue_.pop_front();
    Batch* b = c.batch;
    const bool skip = !b->error.empty();  // the transfer already failed: do not touch the file further
    lock.unlock();
    std::string err = skip ? "" : move_chunk(b->fd, *b->path, b->write, c.buf, c.bytes, c.offset);
    lock.lock();
    if (!err.empty() && b->error.empty()) b->error = std::move(err);
    if (--b->pending == 0) b->done.notify_all();
  }
}

}  // namespace mt::offload
