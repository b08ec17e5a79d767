#include "kernels/host_memory.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

namespace mt {

std::size_t host_alignment(std::size_t bytes, std::size_t min_alignment) {
  return std::max(bytes >= kHugePageBytes ? kHugePageBytes : kCacheLineBytes, min_alignment);
}

void* allocate_host_bytes(std::size_t bytes, std::size_t alignment) {
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* p = nullptr;
  if (posix_memalign(&p, alignment, rounded) != 0) return nullptr;
  if (alignment == kHugePageBytes) madvise(p, rounded, MADV_HUGEPAGE);  // advisory: failure is harmless
  return p;
}

}  // namespace mt
