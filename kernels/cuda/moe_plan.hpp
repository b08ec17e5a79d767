// The CUDA grouping of a mixture's choices by expert (CudaOps::moe_dispatch), in three launches that
// scale with the tokens: each block counts its chunk's choices per expert; one block turns the counts
// into every (chunk, expert)'s first row; each block then writes its chunk's rows. The result is the
// CPU's counting sort (cpu::moe_dispatch: each expert's rows in slot order), bit for bit, with no atomics.
// The per-block steps are these functions, run by the kernels (moe.cu) and, serially, by the host test.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define MT_MOE_HOST_DEVICE __host__ __device__
#else
#define MT_MOE_HOST_DEVICE
#endif

namespace mt::cuda {

inline constexpr std::int64_t kDispatchChunk = 1024;  // choices one block groups (its shared-memory copy)

MT_MOE_HOST_DEVICE inline std::int64_t dispatch_chunks(std::int64_t choices) {
  return (choices + kDispatchChunk - 1) / kDispatchChunk;
}
// Bytes of the dispatch's device scratch: the offsets (experts + 1) and a count per (chunk, expert).
inline std::size_t dispatch_scratch_bytes(std::int64_t choices, std::int64_t experts) {
  return static_cast<std::size_t>(experts + 1 + dispatch_chunks(choices) * experts) * sizeof(std::int64_t);
}

// Step 1, block `chunk`, one thread an expert: the choices of expert e among ids[0..n) (the chunk's).
MT_MOE_HOST_DEVICE inline std::int64_t dispatch_count(const std::int32_t* ids, std::int64_t n, std::int64_t e) {
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < n; ++i) count += ids[i] == e;
  return count;
}

// Step 2, one block: column e of counts[chunk * experts + e] becomes exclusive prefix sums over the
// chunks (one thread an expert); returns the column's total, the expert's row count.
MT_MOE_HOST_DEVICE inline std::int64_t dispatch_column_prefix(std::int64_t* counts, std::int64_t chunks,
                                                              std::int64_t experts, std::int64_t e) {
  std::int64_t run = 0;
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t k = counts[c * experts + e];
    counts[c * experts + e] = run;
    run += k;
  }
  return run;
}
// ... then offsets[0..experts] from the totals in offsets[1..experts] (one thread), and every
// (chunk, expert)'s first row is its prefix plus offsets[e] (one thread an expert again).
MT_MOE_HOST_DEVICE inline void dispatch_offsets(std::int64_t* offsets, std::int64_t experts) {
  offsets[0] = 0;
  for (std::int64_t e = 0; e < experts; ++e) offsets[e + 1] += offsets[e];
}

// Step 3, block `chunk`, one thread an expert: expert e's rows of the chunk's choices ids[0..n) (slots
// q0..q0+n), in slot order from row `first`.
MT_MOE_HOST_DEVICE inline void dispatch_place(const std::int32_t* ids, std::int64_t n, std::int64_t q0, std::int64_t e,
                                              std::int64_t first, std::int32_t* order, std::int32_t* slot_pos) {
  std::int64_t p = first;
  for (std::int64_t i = 0; i < n; ++i)
    if (ids[i] == e) {
      order[p] = static_cast<std::int32_t>(q0 + i);
      slot_pos[q0 + i] = static_cast<std::int32_t>(p);
      ++p;
    }
}

}  // namespace mt::cuda
