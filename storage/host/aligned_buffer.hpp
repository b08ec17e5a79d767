// One aligned heap allocation, owned. Large buffers are aligned to 2 MiB and advised as huge-page
// candidates (transparent huge pages: fewer TLB misses when streaming hundreds of MiB); small ones to
// 64 bytes (a cache line, the alignment every tensor offset in a ParamLayout keeps).
#pragma once
#include <cstddef>
#include <string>

#include "kernels/host_memory.hpp"  // the alignment policy, kCacheLineBytes, kHugePageBytes

namespace mt {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Throws std::runtime_error naming `what` and the size when the allocation fails. min_alignment (a
  // power of two): at least this alignment (O_DIRECT buffers: 4096).
  AlignedBuffer(std::size_t bytes, const char* what, bool zero_fill, std::size_t min_alignment = 0);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  std::size_t alignment() const { return alignment_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t alignment_ = 0;
};

// "12.0 MiB" / "512 B": sizes in error messages and reports.
std::string format_bytes(std::size_t bytes);

}  // namespace mt
