#include "storage/host/aligned_buffer.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace mt {

AlignedBuffer::AlignedBuffer(std::size_t bytes, const char* what, bool zero_fill, std::size_t min_alignment) {
  if (bytes == 0) return;
  // Huge-page alignment only pays for buffers of at least one huge page; smaller ones would waste it.
  alignment_ = host_alignment(bytes, min_alignment);
  const std::size_t rounded = (bytes + alignment_ - 1) / alignment_ * alignment_;
  void* p = allocate_host_bytes(bytes, alignment_);
  if (p == nullptr)
    throw std::runtime_error(std::string("cannot allocate ") + format_bytes(bytes) + " of host memory for " + what);
  data_ = static_cast<std::byte*>(p);
  bytes_ = bytes;
  if (zero_fill) std::memset(data_, 0, rounded);  // also commits the pages now, not mid-run
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      alignment_(std::exchange(other.alignment_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    alignment_ = std::exchange(other.alignment_, 0);
  }
  return *this;
}

std::string format_bytes(std::size_t bytes) {
  char text[64];
  const double b = static_cast<double>(bytes);
  if (bytes < 1024)
    std::snprintf(text, sizeof text, "%zu B", bytes);
  else if (b < 1024.0 * 1024)
    std::snprintf(text, sizeof text, "%.1f KiB", b / 1024);
  else if (b < 1024.0 * 1024 * 1024)
    std::snprintf(text, sizeof text, "%.1f MiB", b / (1024.0 * 1024));
  else
    std::snprintf(text, sizeof text, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  return text;
}

}  // namespace mt
