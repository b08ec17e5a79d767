// Host allocations for tensors and buffers: large ones aligned to 2 MiB and advised as transparent huge
// page candidates, small ones to a cache line. Huge pages matter beyond streaming: the attention reads
// each head's slice of every row, a few cache lines in each 4 KiB page, and on 4 KiB pages its
// prefetches stalled the core (perf; the stalls went with huge pages: TLB misses, by all signs).
#pragma once
#include <cstddef>

namespace mt {

inline constexpr std::size_t kCacheLineBytes = 64;
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// The alignment an allocation of `bytes` gets: a huge page from one huge page up, else a cache line; at
// least min_alignment (a power of two, or 0).
std::size_t host_alignment(std::size_t bytes, std::size_t min_alignment = 0);

// `bytes` rounded up to `alignment` (host_alignment's), advised MADV_HUGEPAGE when that is a huge page;
// nullptr when the allocation fails. Freed with std::free.
void* allocate_host_bytes(std::size_t bytes, std::size_t alignment);

}  // namespace mt
