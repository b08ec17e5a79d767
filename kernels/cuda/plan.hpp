// Host-side arithmetic of the CUDA backend: the arena fit check, the deterministic column-sum split,
// the attention kernels' shape check, head-dim dispatch, tiling, grids and causal bounds. Plain C++ (no
// CUDA headers), so CI tests it on machines without a GPU; the .cu files launch exactly what these
// functions say.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/op_shapes.hpp"

// The attention bounds below run in the kernels too (one definition, tested here on the host).
#ifdef __CUDACC__
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace mt::cuda {

// Device memory the backend needs beside the arena that is not allocated when the arena is: the CUDA
// context's own use after cudaMemGetInfo, cuBLAS's lazy allocations, the token buffers and RoPE tables,
// and the ops' scratch of a run without a scratch plan. A fixed reserve keeps the check a pure function.
// The ops' scratch of a planned run (scratch_plan.hpp) is allocated before the arena, outside it.
inline constexpr std::size_t kDeviceReserveBytes = std::size_t{1536} << 20;  // 1.5 GiB

// Throws std::runtime_error naming the keys that size the arena when `arena_bytes` + the reserve does
// not fit in `free_bytes` (what cudaMemGetInfo reported for `gpu`); scratch_bytes: the ops' scratch
// already allocated (named in the message only, free_bytes is net of it).
inline void check_arena_fits(std::size_t arena_bytes, std::size_t free_bytes, std::size_t total_bytes, int gpu,
                             std::size_t reserve = kDeviceReserveBytes, std::size_t scratch_bytes = 0) {
  if (arena_bytes <= free_bytes && free_bytes - arena_bytes >= reserve) return;
  const auto gib = [](std::size_t b) { return std::to_string(static_cast<double>(b) / (1 << 30)).substr(0, 6); };
  throw std::runtime_error("the device arena of " + gib(arena_bytes) + " GiB does not fit on GPU " +
                           std::to_string(gpu) + ": " + gib(free_bytes) + " GiB free of " + gib(total_bytes) +
                           " GiB, and the backend keeps " + gib(reserve) + " GiB for the CUDA context and cuBLASLt" +
                           (scratch_bytes ? " (its ops' scratch, " + gib(scratch_bytes) + " GiB, already taken)" : "") +
                           "; lower device.max_vram_gb, the batch, or the sequence length");
}

// Deterministic column sums (norm weight and bias gradients): rows are cut into `splits` fixed ranges
// of `rows_per_split`; each range's partial sums go to scratch, then one pass adds the partials in
// split order. Depends on N only, so the bits depend on the shape only.
struct ColsumPlan {
  std::int64_t rows_per_split = 0;
  std::int64_t splits = 0;
};
inline constexpr std::int64_t kColsumMaxSplits = 128;
inline ColsumPlan colsum_plan(std::int64_t rows) {
  if (rows <= 0) throw std::invalid_argument("colsum_plan: rows must be > 0");
  ColsumPlan p;
  const std::int64_t even = (rows + kColsumMaxSplits - 1) / kColsumMaxSplits;
  p.rows_per_split = even < 32 ? 32 : even;
  p.splits = (rows + p.rows_per_split - 1) / p.rows_per_split;
  return p;
}
inline std::size_t colsum_scratch_floats(std::int64_t rows, std::int64_t cols) {
  return static_cast<std::size_t>(colsum_plan(rows).splits * cols);
}

// Attention tiling: a block owns kAttnRowsPerBlock rows (queries in the forward and dq kernels, keys in
// the dk/dv kernel), kAttnRowsPerWarp per warp, and walks the other side in tiles of 32 (one per lane).
inline constexpr int kAttnWarps = 4;
inline constexpr int kAttnRowsPerWarp = 4;
inline constexpr int kAttnRowsPerBlock = kAttnWarps * kAttnRowsPerWarp;
inline constexpr int kAttnTile = 32;
inline constexpr int kAttnMaxHeadDim = 256;

// Which compiled kernel serves a head dimension: the four common sizes have their own instantiation
// (loops unrolled at compile time); any other even size up to 256 runs the generic one (run-time loop
// bounds, eight elements a lane: slower, same results within rounding).
enum class AttnPath { d64, d80, d96, d128, generic };
inline AttnPath attention_path(std::int64_t head_dim) {
  if (head_dim <= 0 || head_dim > kAttnMaxHeadDim || head_dim % 2 != 0)
    throw std::invalid_argument("CUDA attention: head_dim " + std::to_string(head_dim) +
                                " is not an even size in [2, 256]");
  switch (head_dim) {
    case 64:
      return AttnPath::d64;
    case 80:
      return AttnPath::d80;
    case 96:
      return AttnPath::d96;
    case 128:
      return AttnPath::d128;
    default:
      return AttnPath::generic;
  }
}
inline const char* attention_path_name(AttnPath p) {
  switch (p) {
    case AttnPath::d64:
      return "d64";
    case AttnPath::d80:
      return "d80";
    case AttnPath::d96:
      return "d96";
    case AttnPath::d128:
      return "d128";
    default:
      return "generic";
  }
}

// Dynamic shared memory (bytes) of the three attention kernels for a head dimension: the block's own
// rows unpadded, the walked tile padded to D + 1 floats a row (lanes read different rows of one column).
inline std::size_t attn_forward_smem(std::int64_t D) {
  return sizeof(float) * static_cast<std::size_t>(kAttnRowsPerBlock * D + kAttnTile * (D + 1) + kAttnTile * D);
}
inline std::size_t attn_dq_smem(std::int64_t D) {
  return sizeof(float) * static_cast<std::size_t>(2 * kAttnRowsPerBlock * D + 2 * kAttnTile * (D + 1));
}
inline std::size_t attn_dkv_smem(std::int64_t D) {
  return sizeof(float) * static_cast<std::size_t>(2 * kAttnRowsPerBlock * D + 2 * kAttnTile * (D + 1) + 2 * kAttnTile);
}

// Blocks of an attention launch: (row blocks, heads, batch).
inline std::int64_t attn_row_blocks(std::int64_t seq) { return (seq + kAttnRowsPerBlock - 1) / kAttnRowsPerBlock; }

// Row blocks of the query-side kernels (forward, dq) cover the q_rows() query rows of a sequence; those
// of the dk/dv kernel its seq keys.
inline std::int64_t attn_query_blocks(const AttnShape& a) { return attn_row_blocks(a.q_rows()); }
inline std::int64_t attn_key_blocks(const AttnShape& a) { return attn_row_blocks(a.seq); }

// Causal bounds under AttnShape::q_start (query row i sits at position q_start + i). A query block of rows
// [r0, r0 + kAttnRowsPerBlock) sees keys [0, attn_key_end): one past its last row's position, within seq.
MT_HOST_DEVICE inline std::int64_t attn_key_end(std::int64_t q_start, std::int64_t r0, std::int64_t seq) {
  const std::int64_t end = q_start + r0 + kAttnRowsPerBlock;
  return end < seq ? end : seq;
}
// A key block starting at key k0 is seen by query rows from attn_first_query_row on (position >= k0):
// the earlier rows see none of its keys.
MT_HOST_DEVICE inline std::int64_t attn_first_query_row(std::int64_t q_start, std::int64_t k0) {
  return k0 > q_start ? k0 - q_start : 0;
}

// The shapes the attention kernels take: throws std::invalid_argument for the others.
inline void check_attention_shape(const AttnShape& a) {
  if (a.batch <= 0 || a.seq <= 0 || a.q_heads <= 0 || a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0)
    throw std::invalid_argument("CUDA attention: bad shape (batch, seq, heads must be > 0, kv heads dividing heads)");
  if (a.q_start < 0 || a.q_start >= a.seq)
    throw std::invalid_argument("CUDA attention: q_start " + std::to_string(a.q_start) + " is not in [0, seq " +
                                std::to_string(a.seq) + ")");
  if (a.q_heads > 65535 || a.batch > 65535)
    throw std::invalid_argument("CUDA attention: more than 65535 heads or batch rows");
  attention_path(a.head_dim);  // throws for unsupported head dims
}

}  // namespace mt::cuda
