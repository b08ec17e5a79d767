// Causal grouped-query attention, flash-style: the T x T scores never exist. A block owns 16 rows
// (4 warps x 4 rows) and walks the other side in tiles of 32, one per lane: a lane computes one whole
// dot product (its key against the warp's query, both in shared memory), the warp then shares the 32
// probabilities by shuffles and each lane accumulates the head-dim elements it owns (lane + 32 c).
// Forward: online softmax per query row, out and lse as cpu::attention_forward. Backward, without
// atomics (deterministic): one kernel per query row block for dq, one per key row block for dk and dv
// (looping over the query heads of its kv group), both recomputing the probabilities from lse, plus a
// row-dot kernel for D_i = dout_i . out_i.
// Sequence tiles (AttnShape::q_start): the query rows are positions q_start.. against keys from 0, so
// the query-side grids (forward, dq, row dots) cover q_rows() rows and the dk/dv grid seq keys, each key
// block starting at the first query row that sees it; with add_kv_grads the dk/dv kernel adds to dk and
// dv (each element has one writing thread, so still no atomics) and a sequence's tiles accumulate.
// Sliding window (AttnShape::window > 0): position p sees keys p - window + 1 .. p. Each side starts at
// the first tile any of the block's rows can see (tiles stay aligned to 0) and ends past the last; a row
// (a key row in dk/dv) skips the tiles wholly outside its own window, so it meets the same tiles whichever
// block it is in, and every tile a query row walks holds at least one of its keys (its softmax state
// stays finite). Elements outside the window are masked. Documents (AttnShape::positions): each row's
// first key is also its document's start, the later of the two (first_key); the same skipping and masks,
// and the dk/dv side stops at the first query whose document starts past the block's keys.
// Sinks (gpt-oss): one logit per query head joins each row's softmax at the end of the forward; the lse
// saved includes it, so the backward's probabilities are exact as they are, and d(sink) is a pass of its
// own over lse and the row dots.
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/plan.hpp"

namespace mt::cuda {
namespace {

using AttnDims = AttnShape;  // in the kernels Q = seq - q_start is AttnShape::q_rows() (a host function)

constexpr int R = kAttnRowsPerBlock;
constexpr int RW = kAttnRowsPerWarp;
constexpr int TILE = kAttnTile;
constexpr int kThreads = kAttnWarps * 32;
static_assert(TILE == 32, "one tile row per lane");

// Dot product of two shared-memory rows of D floats.
template <int DT>
__device__ __forceinline__ float dot_row(const float* a, const float* b, int D) {
  float s = 0.0f;
  if constexpr (DT > 0) {
#pragma unroll 16
    for (int e = 0; e < DT; ++e) s += a[e] * b[e];
  } else {
    for (int e = 0; e < D; ++e) s += a[e] * b[e];
  }
  return s;
}

// rows [t0, t0 + rows) of a [T, stride] matrix, D columns, into shared memory with row pitch `pitch`;
// rows at or past T are zero.
__device__ __forceinline__ void load_rows(float* dst, int pitch, const float* src, std::int64_t stride, std::int64_t t0,
                                          int rows, std::int64_t T, int D) {
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int r = idx / D, e = idx % D;
    const std::int64_t t = t0 + r;
    dst[r * pitch + e] = t < T ? src[t * stride + e] : 0.0f;
  }
}

// The first key position p sees: 0 causal, p - window + 1 (or 0) with a sliding window.
__device__ __forceinline__ std::int64_t window_first_key(std::int64_t p, std::int64_t window) {
  return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}
// The first key position p of sequence b sees: its window's start and, with documents, its document's
// (p - positions[b * seq + p]). Never decreasing in p.
__device__ __forceinline__ std::int64_t first_key(std::int64_t p, const AttnDims& a, std::int64_t b) {
  const std::int64_t lo = window_first_key(p, a.window);
  if (!a.positions) return lo;
  const std::int64_t doc = p - a.positions[b * a.seq + p];
  return doc > lo ? doc : lo;
}
// The first key tile (a multiple of TILE) a query block whose first row sits at position pos0 meets.
__device__ __forceinline__ std::int64_t first_key_tile(std::int64_t pos0, const AttnDims& a, std::int64_t b) {
  return first_key(pos0, a, b) / TILE * TILE;
}
// One past the last query row that sees a key block whose last key is k_last (the window's far edge).
__device__ __forceinline__ std::int64_t query_row_end(std::int64_t q_start, std::int64_t k_last, std::int64_t Q,
                                                      std::int64_t window) {
  if (window <= 0) return Q;
  const std::int64_t end = k_last + window - q_start;  // positions k_last + window and later see none
  return end < 0 ? 0 : (end < Q ? end : Q);
}

template <int DT, int EPL>
__global__ void __launch_bounds__(kThreads)
    attn_fwd_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                    const void* sinks, bool sinks_bf16, float* __restrict__ out, float* __restrict__ lse, AttnDims a,
                    int Dr, float scale) {
  const int D = DT > 0 ? DT : Dr;
  extern __shared__ float smem[];
  float* Qs = smem;                 // [R][D]
  float* Ks = Qs + R * D;           // [TILE][D + 1]
  float* Vs = Ks + TILE * (D + 1);  // [TILE][D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t T = a.seq, Q = a.seq - a.q_start, b = blockIdx.z, h = blockIdx.y,
                     kvh = h / (a.q_heads / a.kv_heads);
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.x) * R;  // this block's first query row
  const float* kb = k + b * T * a.kv_stride + kvh * D;
  const float* vb = v + b * T * a.kv_stride + kvh * D;
  load_rows(Qs, D, q + b * Q * a.q_stride + h * D, a.q_stride, r0, R, Q, D);

  float m[RW], l[RW], acc[RW][EPL];
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    m[rr] = -INFINITY, l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < EPL; ++c) acc[rr][c] = 0.0f;
  }
  const std::int64_t k_end = attn_key_end(a.q_start, r0, T);  // causal: no row of this block sees keys past it
  for (std::int64_t k0 = first_key_tile(a.q_start + r0, a, b); k0 < k_end; k0 += TILE) {
    __syncthreads();  // the previous tile is no longer read
    load_rows(Ks, D + 1, kb, a.kv_stride, k0, TILE, T, D);
    load_rows(Vs, D, vb, a.kv_stride, k0, TILE, T, D);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
      const int row = warp * RW + rr;
      const std::int64_t i = a.q_start + r0 + row;  // the row's position
      if (r0 + row >= Q) continue;                  // uniform across the warp (and i < T below)
      const std::int64_t lo = first_key(i, a, b);
      // uniform across the warp; a tile kept holds a key in [lo, i], so m_new below is finite
      if (k0 > i || k0 + TILE <= lo) continue;
      const std::int64_t j = k0 + lane;
      const bool valid = j <= i && j >= lo;
      float s = dot_row<DT>(Qs + row * D, Ks + lane * (D + 1), D) * scale;
      s = valid ? s : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(s));  // finite: a key of [lo, i] is in the tile
      const float corr = expf(m[rr] - m_new);         // 0 on the row's first tile (m = -inf)
      const float p = valid ? expf(s - m_new) : 0.0f;
      l[rr] = l[rr] * corr + warp_sum(p);
      const int nvis = static_cast<int>(min(static_cast<std::int64_t>(TILE), i - k0 + 1));
      const int jj0 = static_cast<int>(lo > k0 ? lo - k0 : 0);  // keys before the window add nothing
#pragma unroll
      for (int c = 0; c < EPL; ++c) acc[rr][c] *= corr;
      for (int jj = jj0; jj < nvis; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
        for (int c = 0; c < EPL; ++c) {
          const int e = lane + 32 * c;
          if (e < D) acc[rr][c] += pj * Vs[jj * D + e];
        }
      }
      m[rr] = m_new;
    }
  }
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    const std::int64_t i = r0 + warp * RW + rr;  // query row
    if (i >= Q) continue;
    float mr = m[rr], lr = l[rr], corr = 1.0f;
    if (sinks) {  // the sink's column joins the row: rescale to the larger of the row's max and the sink
      const float sh = load_w(sinks, h, sinks_bf16), mx = fmaxf(mr, sh);
      corr = expf(mr - mx);
      lr = lr * corr + expf(sh - mx);
      mr = mx;
    }
    const float inv = corr / lr;
    float* o = out + (b * Q + i) * a.o_stride + h * D;
#pragma unroll
    for (int c = 0; c < EPL; ++c) {
      const int e = lane + 32 * c;
      if (e < D) o[e] = acc[rr][c] * inv;
    }
    if (lane == 0) lse[(b * a.q_heads + h) * Q + i] = mr + logf(lr);
  }
}

// rowdot[(b * q_heads + h) * q_rows + t] = dout . out over the head's D elements; one warp a query row.
__global__ void attn_rowdot_kernel(const float* __restrict__ out, const float* __restrict__ dout,
                                   float* __restrict__ rowdot, AttnDims a) {
  const std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const std::int64_t Q = a.seq - a.q_start, total = a.batch * a.q_heads * Q;
  if (idx >= total) return;
  const std::int64_t t = idx % Q, h = (idx / Q) % a.q_heads, b = idx / (Q * a.q_heads);
  const float* o = out + (b * Q + t) * a.o_stride + h * a.head_dim;
  const float* d = dout + (b * Q + t) * a.o_stride + h * a.head_dim;
  float s = 0.0f;
  for (std::int64_t e = lane; e < a.head_dim; e += 32) s += o[e] * d[e];
  s = warp_sum(s);
  if (lane == 0) rowdot[idx] = s;
}

// dsinks_acc[h] += sum over (b, i) of -exp(sink_h - lse) * D, one block a head: the batch x rows terms, in
// (b, i) order, are cut into kSinkSplits consecutive ranges by the shape alone; each thread sums its range in
// order, then one thread adds the partials in range order (no atomics: the bits depend on the shape only).
constexpr int kSinkSplits = 256;
__global__ void __launch_bounds__(kSinkSplits)
    attn_dsinks_kernel(const void* sinks, bool sinks_bf16, const float* __restrict__ lse,
                       const float* __restrict__ rowdot, float* __restrict__ dsinks_acc, AttnDims a) {
  __shared__ float part[kSinkSplits];
  const std::int64_t h = blockIdx.x, Q = a.seq - a.q_start, n = a.batch * Q;
  const std::int64_t per = (n + kSinkSplits - 1) / kSinkSplits;
  const float sh = load_w(sinks, h, sinks_bf16);
  float acc = 0.0f;
  const std::int64_t t0 = threadIdx.x * per, t1 = min(n, t0 + per);
  for (std::int64_t t = t0; t < t1; ++t) {
    const std::int64_t idx = ((t / Q) * a.q_heads + h) * Q + t % Q;
    acc -= expf(sh - lse[idx]) * rowdot[idx];  // p_sink * (dP_sink - D) with dP_sink = 0: the sink has no value
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int w = 0; w < kSinkSplits; ++w) s += part[w];
    dsinks_acc[h] += s;
  }
}

template <int DT, int EPL>
__global__ void __launch_bounds__(kThreads)
    attn_dq_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                   const float* __restrict__ lse, const float* __restrict__ rowdot, const float* __restrict__ dout,
                   float* __restrict__ dq, AttnDims a, int Dr, float scale) {
  const int D = DT > 0 ? DT : Dr;
  extern __shared__ float smem[];
  float* Qs = smem;                 // [R][D]
  float* dOs = Qs + R * D;          // [R][D]
  float* Ks = dOs + R * D;          // [TILE][D + 1]
  float* Vs = Ks + TILE * (D + 1);  // [TILE][D + 1]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t T = a.seq, Q = a.seq - a.q_start, b = blockIdx.z, h = blockIdx.y,
                     kvh = h / (a.q_heads / a.kv_heads);
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.x) * R;  // this block's first query row
  const float* kb = k + b * T * a.kv_stride + kvh * D;
  const float* vb = v + b * T * a.kv_stride + kvh * D;
  load_rows(Qs, D, q + b * Q * a.q_stride + h * D, a.q_stride, r0, R, Q, D);
  load_rows(dOs, D, dout + b * Q * a.o_stride + h * D, a.o_stride, r0, R, Q, D);
  float acc[RW][EPL], row_lse[RW], row_dot[RW];
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    const std::int64_t i = r0 + warp * RW + rr;  // query row
    row_lse[rr] = i < Q ? lse[(b * a.q_heads + h) * Q + i] : 0.0f;
    row_dot[rr] = i < Q ? rowdot[(b * a.q_heads + h) * Q + i] : 0.0f;
#pragma unroll
    for (int c = 0; c < EPL; ++c) acc[rr][c] = 0.0f;
  }
  const std::int64_t k_end = attn_key_end(a.q_start, r0, T);
  for (std::int64_t k0 = first_key_tile(a.q_start + r0, a, b); k0 < k_end; k0 += TILE) {
    __syncthreads();
    load_rows(Ks, D + 1, kb, a.kv_stride, k0, TILE, T, D);
    load_rows(Vs, D + 1, vb, a.kv_stride, k0, TILE, T, D);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
      const int row = warp * RW + rr;
      const std::int64_t i = a.q_start + r0 + row;  // the row's position
      if (r0 + row >= Q) continue;
      const std::int64_t lo = first_key(i, a, b);
      if (k0 > i || k0 + TILE <= lo) continue;  // the forward's tiles for this row
      const std::int64_t j = k0 + lane;
      const bool valid = j <= i && j >= lo;
      const float s = dot_row<DT>(Qs + row * D, Ks + lane * (D + 1), D) * scale;
      const float dp = dot_row<DT>(dOs + row * D, Vs + lane * (D + 1), D);
      const float p = valid ? expf(s - row_lse[rr]) : 0.0f;
      const float ds = valid ? p * (dp - row_dot[rr]) * scale : 0.0f;
      const int nvis = static_cast<int>(min(static_cast<std::int64_t>(TILE), i - k0 + 1));
      const int jj0 = static_cast<int>(lo > k0 ? lo - k0 : 0);
      for (int jj = jj0; jj < nvis; ++jj) {
        const float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
        for (int c = 0; c < EPL; ++c) {
          const int e = lane + 32 * c;
          if (e < D) acc[rr][c] += dsj * Ks[jj * (D + 1) + e];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    const std::int64_t i = r0 + warp * RW + rr;  // query row
    if (i >= Q) continue;
    float* o = dq + (b * Q + i) * a.q_stride + h * D;
#pragma unroll
    for (int c = 0; c < EPL; ++c) {
      const int e = lane + 32 * c;
      if (e < D) o[e] = acc[rr][c];
    }
  }
}

template <int DT, int EPL>
__global__ void __launch_bounds__(kThreads)
    attn_dkv_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                    const float* __restrict__ lse, const float* __restrict__ rowdot, const float* __restrict__ dout,
                    float* __restrict__ dk, float* __restrict__ dv, AttnDims a, int Dr, float scale) {
  const int D = DT > 0 ? DT : Dr;
  extern __shared__ float smem[];
  float* Ks = smem;                  // [R][D]: this block's key rows
  float* Vs = Ks + R * D;            // [R][D]
  float* Qs = Vs + R * D;            // [TILE][D + 1]
  float* dOs = Qs + TILE * (D + 1);  // [TILE][D + 1]
  float* Ls = dOs + TILE * (D + 1);  // [TILE]
  float* Ds = Ls + TILE;             // [TILE]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t T = a.seq, Q = a.seq - a.q_start, b = blockIdx.z, kvh = blockIdx.y, group = a.q_heads / a.kv_heads;
  const std::int64_t k_start = static_cast<std::int64_t>(blockIdx.x) * R;
  // causal: query rows before this one (positions before k_start) see none of these keys; with a window,
  // none from q_end on (past the window of the block's last key)
  const std::int64_t q_first = attn_first_query_row(a.q_start, k_start);
  const std::int64_t q_end = query_row_end(a.q_start, k_start + R - 1, Q, a.window);
  load_rows(Ks, D, k + b * T * a.kv_stride + kvh * D, a.kv_stride, k_start, R, T, D);
  load_rows(Vs, D, v + b * T * a.kv_stride + kvh * D, a.kv_stride, k_start, R, T, D);
  float gk[RW][EPL], gv[RW][EPL];
#pragma unroll
  for (int rr = 0; rr < RW; ++rr)
#pragma unroll
    for (int c = 0; c < EPL; ++c) gk[rr][c] = gv[rr][c] = 0.0f;
  for (std::int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    const float* lb = lse + (b * a.q_heads + h) * Q;
    const float* db = rowdot + (b * a.q_heads + h) * Q;
    for (std::int64_t q0 = q_first; q0 < q_end; q0 += TILE) {  // q0: query row, at position q_start + q0
      // documents: from a query whose document starts past the block's last key on, none sees its keys
      // (block-uniform, and the same for every head)
      if (a.positions && first_key(a.q_start + q0, a, b) > k_start + R - 1) break;
      __syncthreads();
      load_rows(Qs, D + 1, q + b * Q * a.q_stride + h * D, a.q_stride, q0, TILE, Q, D);
      load_rows(dOs, D + 1, dout + b * Q * a.o_stride + h * D, a.o_stride, q0, TILE, Q, D);
      if (threadIdx.x < TILE) {
        const std::int64_t t = q0 + threadIdx.x;
        Ls[threadIdx.x] = t < Q ? lb[t] : 0.0f;
        Ds[threadIdx.x] = t < Q ? db[t] : 0.0f;
      }
      __syncthreads();
      const int nq = static_cast<int>(min(static_cast<std::int64_t>(TILE), Q - q0));
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const int row = warp * RW + rr;
        const std::int64_t j = k_start + row;
        // uniform across the warp: past T, or every query of the tile past this key's window or document
        if (j >= T || (a.window > 0 && a.q_start + q0 >= j + a.window) || first_key(a.q_start + q0, a, b) > j) continue;
        const std::int64_t i = q0 + lane, pos = a.q_start + i;  // query row i, at position pos
        const bool valid = pos >= j && (a.window <= 0 || pos < j + a.window) && i < Q &&
                           (!a.positions || pos - a.positions[b * T + pos] <= j);
        const float s = dot_row<DT>(Qs + lane * (D + 1), Ks + row * D, D) * scale;
        const float dp = dot_row<DT>(dOs + lane * (D + 1), Vs + row * D, D);
        const float p = valid ? expf(s - Ls[lane]) : 0.0f;
        const float ds = valid ? p * (dp - Ds[lane]) * scale : 0.0f;
        for (int ii = 0; ii < nq; ++ii) {
          const float pi = __shfl_sync(0xffffffffu, p, ii);
          const float dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
          for (int c = 0; c < EPL; ++c) {
            const int e = lane + 32 * c;
            if (e < D) {
              gv[rr][c] += pi * dOs[ii * (D + 1) + e];
              gk[rr][c] += dsi * Qs[ii * (D + 1) + e];
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    const std::int64_t j = k_start + warp * RW + rr;
    if (j >= T) continue;
    float* ok = dk + (b * T + j) * a.kv_stride + kvh * D;
    float* ov = dv + (b * T + j) * a.kv_stride + kvh * D;
    // this thread alone writes these elements, so adding (an earlier query tile's sums) needs no atomics
#pragma unroll
    for (int c = 0; c < EPL; ++c) {
      const int e = lane + 32 * c;
      if (e < D) {
        if (a.add_kv_grads)
          ok[e] += gk[rr][c], ov[e] += gv[rr][c];
        else
          ok[e] = gk[rr][c], ov[e] = gv[rr][c];
      }
    }
  }
}

// Runs `launch(kernel_instance)` with the kernel set up for `smem` bytes of dynamic shared memory.
template <class Kernel>
void prepare(Kernel kernel, std::size_t smem) {
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

template <int DT, int EPL>
void forward_as(const float* q, const float* k, const float* v, const void* sinks, bool sinks_bf16, float* out,
                float* lse, const AttnDims& a, cudaStream_t st) {
  const int D = static_cast<int>(a.head_dim);
  const std::size_t smem = attn_forward_smem(D);
  prepare(attn_fwd_kernel<DT, EPL>, smem);
  const dim3 grid(static_cast<unsigned>(attn_query_blocks(a)), static_cast<unsigned>(a.q_heads),
                  static_cast<unsigned>(a.batch));
  attn_fwd_kernel<DT, EPL>
      <<<grid, kThreads, smem, st>>>(q, k, v, sinks, sinks_bf16, out, lse, a, D, 1.0f / sqrtf(static_cast<float>(D)));
  MT_CUDA_LAUNCH_CHECK("attn_fwd_kernel");
}

template <int DT, int EPL>
void backward_as(const float* q, const float* k, const float* v, const float* lse, const float* rowdot,
                 const float* dout, float* dq, float* dk, float* dv, const AttnDims& a, cudaStream_t st) {
  const int D = static_cast<int>(a.head_dim);
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const std::size_t smem_q = attn_dq_smem(D), smem_kv = attn_dkv_smem(D);
  prepare(attn_dq_kernel<DT, EPL>, smem_q);
  prepare(attn_dkv_kernel<DT, EPL>, smem_kv);
  const auto q_blocks = static_cast<unsigned>(attn_query_blocks(a)),
             k_blocks = static_cast<unsigned>(attn_key_blocks(a));
  attn_dq_kernel<DT, EPL>
      <<<dim3(q_blocks, static_cast<unsigned>(a.q_heads), static_cast<unsigned>(a.batch)), kThreads, smem_q, st>>>(
          q, k, v, lse, rowdot, dout, dq, a, D, scale);
  MT_CUDA_LAUNCH_CHECK("attn_dq_kernel");
  attn_dkv_kernel<DT, EPL>
      <<<dim3(k_blocks, static_cast<unsigned>(a.kv_heads), static_cast<unsigned>(a.batch)), kThreads, smem_kv, st>>>(
          q, k, v, lse, rowdot, dout, dk, dv, a, D, scale);
  MT_CUDA_LAUNCH_CHECK("attn_dkv_kernel");
}

// The checks plan.hpp's check_attention_shape leaves to the window.
void check_window(const AttnShape& a) {
  if (a.window < 0)
    throw std::invalid_argument("CUDA attention: window " + std::to_string(a.window) + " is negative (0: causal)");
}

}  // namespace

// out and lse[(b * q_heads + h) * q_rows + i] as cpu::attention_forward
void CudaOps::attention_forward(const float* q, const float* k, const float* v, const void* sinks, float* out,
                                float* lse, const AttnShape& a) {
  note_op("attention_forward");
  check_attention_shape(a);
  check_window(a);
  switch (attention_path(a.head_dim)) {
    case AttnPath::d64:
      return forward_as<64, 2>(q, k, v, sinks, bf16(), out, lse, a, st_);
    case AttnPath::d80:
      return forward_as<80, 3>(q, k, v, sinks, bf16(), out, lse, a, st_);
    case AttnPath::d96:
      return forward_as<96, 3>(q, k, v, sinks, bf16(), out, lse, a, st_);
    case AttnPath::d128:
      return forward_as<128, 4>(q, k, v, sinks, bf16(), out, lse, a, st_);
    case AttnPath::generic:
      return forward_as<0, kAttnMaxHeadDim / 32>(q, k, v, sinks, bf16(), out, lse, a, st_);
  }
}

// dq overwritten, dk and dv overwritten or (add_kv_grads) added to, dsinks_acc added to; the row dots
// D_i = dout_i . out_i in the op set's scratch. The sinks change no kernel but their own: lse includes them.
void CudaOps::attention_backward(const float* q, const float* k, const float* v, const void* sinks, const float* out,
                                 const float* lse, const float* dout, float* dq, float* dk, float* dv,
                                 float* dsinks_acc, const AttnShape& a) {
  note_op("attention_backward");
  check_attention_shape(a);
  check_window(a);
  const std::int64_t rows = a.batch * a.q_heads * a.q_rows();
  auto* rowdot = static_cast<float*>(room(attention_rowdot, rowdot_bytes(a)));
  attn_rowdot_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, st_>>>(out, dout, rowdot, a);
  MT_CUDA_LAUNCH_CHECK("attn_rowdot_kernel");
  if (sinks && dsinks_acc) {
    attn_dsinks_kernel<<<static_cast<unsigned>(a.q_heads), kSinkSplits, 0, st_>>>(sinks, bf16(), lse, rowdot,
                                                                                  dsinks_acc, a);
    MT_CUDA_LAUNCH_CHECK("attn_dsinks_kernel");
  }
  switch (attention_path(a.head_dim)) {
    case AttnPath::d64:
      return backward_as<64, 2>(q, k, v, lse, rowdot, dout, dq, dk, dv, a, st_);
    case AttnPath::d80:
      return backward_as<80, 3>(q, k, v, lse, rowdot, dout, dq, dk, dv, a, st_);
    case AttnPath::d96:
      return backward_as<96, 3>(q, k, v, lse, rowdot, dout, dq, dk, dv, a, st_);
    case AttnPath::d128:
      return backward_as<128, 4>(q, k, v, lse, rowdot, dout, dq, dk, dv, a, st_);
    case AttnPath::generic:
      return backward_as<0, kAttnMaxHeadDim / 32>(q, k, v, lse, rowdot, dout, dq, dk, dv, a, st_);
  }
}

}  // namespace mt::cuda
