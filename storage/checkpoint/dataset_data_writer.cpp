#include "storage/checkpoint/dataset_data_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "storage/checkpoint/checkpoint_error.hpp"

namespace mt::ckpt {

namespace {

constexpr std::uint64_t kPage = 4096;

}  // namespace

DatasetDataWriter::DatasetDataWriter(const std::filesystem::path& file, bool try_direct) : path_(file) {
  buffered_fd_ = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
  if (buffered_fd_ < 0) throw CheckpointError(file.string() + ": cannot open for writing: " + std::strerror(errno));
  // EINVAL: the file system has no O_DIRECT (tmpfs); everything then goes through the page cache.
  if (try_direct) direct_fd_ = ::open(file.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
}

DatasetDataWriter::~DatasetDataWriter() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (buffered_fd_ >= 0) ::close(buffered_fd_);
}

void DatasetDataWriter::write_all(int fd, std::uint64_t offset, const char* data, std::size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, data, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      throw CheckpointError(path_.string() + ": writing " + std::to_string(bytes) + " bytes at offset " +
                            std::to_string(offset) + " failed (disk full?): " + std::strerror(err));
    }
    data += n;
    offset += static_cast<std::uint64_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
}

void DatasetDataWriter::write(std::uint64_t offset, const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  if (direct_fd_ >= 0 && offset % kPage == 0 && address % memory_alignment_ == 0 && bytes >= kPage) {
    std::size_t body = bytes - bytes % kPage;
    while (body > 0) {
      const ssize_t n = ::pwrite(direct_fd_, p, body, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL && body == bytes - bytes % kPage) {
        // Refused before anything was written: this device wants page-aligned buffers, or this file
        // system takes no direct writes after all. The rest of this dataset goes buffered.
        if (address % kPage != 0)
          memory_alignment_ = kPage;
        else {
          ::close(direct_fd_);
          direct_fd_ = -1;
        }
        break;
      }
      if (n <= 0) {
        const int err = n < 0 ? errno : ENOSPC;
        throw CheckpointError(path_.string() + ": writing " + std::to_string(body) + " bytes at offset " +
                              std::to_string(offset) + " failed (disk full?): " + std::strerror(err));
      }
      const auto done = static_cast<std::size_t>(n);
      p += done;
      offset += done;
      bytes -= done;
      body -= done;
      direct_bytes_ += done;
      if (done % kPage != 0) break;  // a short write off a page boundary: the rest goes buffered
    }
  }
  write_all(buffered_fd_, offset, p, bytes);
  buffered_bytes_ += bytes;
}

void DatasetDataWriter::start_writeback() { ::sync_file_range(buffered_fd_, 0, 0, SYNC_FILE_RANGE_WRITE); }

}  // namespace mt::ckpt
