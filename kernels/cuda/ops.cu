// CudaOps (cuda_ops.hpp): the elementwise, normalisation, rotary, embedding and loss kernels, the
// products (cuBLASLt, with bf16 operands rounded here first), and the op set's own device scratch. Each
// kernel mirrors its CPU kernel (kernels/cpu/ops.hpp: same shapes, layouts and "added into"
// conventions). Deterministic: no atomics; reductions across rows go through fixed splits (plan.hpp's
// colsum_plan) summed in order. Attention is attention.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/plan.hpp"

namespace mt::cuda {
namespace {

constexpr unsigned kBlock = 256;
constexpr int kRowsPerBlock = kBlock / 32;  // row kernels: one warp a row

// ---------------- elementwise ----------------
__global__ void to_bf16_kernel(const float* __restrict__ x, bf16_t* __restrict__ y, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const unsigned u = __float_as_uint(x[i]);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      y[i] = static_cast<bf16_t>((u >> 16) | 0x0040u);  // NaN: quiet it
    } else {
      const unsigned lsb = (u >> 16) & 1u;
      y[i] = static_cast<bf16_t>((u + 0x7fffu + lsb) >> 16);
    }
  }
}

__global__ void add_into_kernel(float* __restrict__ y, const float* __restrict__ x, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    y[i] += x[i];
}

__global__ void add_bias_kernel(float* __restrict__ y, const void* b, bool bf16, std::size_t n, std::int64_t D) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    y[i] += load_w(b, static_cast<std::int64_t>(i % static_cast<std::size_t>(D)), bf16);
}

__device__ __forceinline__ float sigmoidf_(float g) { return 1.0f / (1.0f + expf(-g)); }

__global__ void swiglu_fwd_kernel(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ h,
                                  std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    h[i] = g[i] * sigmoidf_(g[i]) * u[i];
}

__global__ void swiglu_bwd_kernel(const float* __restrict__ g, const float* __restrict__ u,
                                  const float* __restrict__ dh, float* __restrict__ dg, float* __restrict__ du,
                                  std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float sig = sigmoidf_(g[i]);
    const float silu = g[i] * sig;
    dg[i] = dh[i] * u[i] * (sig * (1.0f + g[i] * (1.0f - sig)));
    du[i] = dh[i] * silu;
  }
}

// gpt-oss's expert activation (cpu::clamped_swiglu_forward): c = min(g, limit), uc = clamp(u, -limit, limit),
// h = (uc + 1) * (c * sigmoid(alpha c)). The clamps are written as std::min / std::max are (a NaN g or u
// stays NaN, as torch.clamp keeps it).
__device__ __forceinline__ float clamp_max_(float x, float hi) { return hi < x ? hi : x; }
__device__ __forceinline__ float clamp_min_(float x, float lo) { return x < lo ? lo : x; }

__global__ void clamped_swiglu_fwd_kernel(const float* __restrict__ g, const float* __restrict__ u,
                                          float* __restrict__ h, std::size_t n, float alpha, float limit) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float c = clamp_max_(g[i], limit), uc = clamp_min_(clamp_max_(u[i], limit), -limit);
    h[i] = (uc + 1.0f) * (c * sigmoidf_(alpha * c));
  }
}

// d(c sigmoid(alpha c)) / dc = s (1 + alpha c (1 - s)); torch.clamp's gradient passes only where
// min <= x <= max, so dg is 0 where g > limit and du where |u| > limit (and where either is NaN).
__global__ void clamped_swiglu_bwd_kernel(const float* __restrict__ g, const float* __restrict__ u,
                                          const float* __restrict__ dh, float* __restrict__ dg, float* __restrict__ du,
                                          std::size_t n, float alpha, float limit) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float gi = g[i], ui = u[i];
    const float c = clamp_max_(gi, limit), uc = clamp_min_(clamp_max_(ui, limit), -limit);
    const float sig = sigmoidf_(alpha * c);
    dg[i] = gi <= limit ? dh[i] * (uc + 1.0f) * sig * (1.0f + alpha * c * (1.0f - sig)) : 0.0f;
    du[i] = ui <= limit && ui >= -limit ? dh[i] * c * sig : 0.0f;
  }
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

__global__ void gelu_fwd_kernel(const float* __restrict__ x, float* __restrict__ y, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(kGeluC * (v + kGeluA * v * v * v)));
  }
}

__global__ void gelu_bwd_kernel(const float* __restrict__ x, const float* __restrict__ dy, float* __restrict__ dx,
                                std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    const float t = tanhf(kGeluC * (v + kGeluA * v * v * v));
    const float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = dy[i] * d;
  }
}

// ---------------- deterministic column sums ----------------
// partial[split, j] = sum of f(r, j) over the split's rows, 8 row lanes summed in lane order.
template <class F>
__global__ void colsum_partial_kernel(F f, std::int64_t N, std::int64_t D, std::int64_t rows_per_split,
                                      float* __restrict__ partial) {
  __shared__ float part[8][33];
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * rows_per_split;
  const std::int64_t r1 = min(N, r0 + rows_per_split);
  float acc = 0.0f;
  if (j < D)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += f(r, j);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < D) {
    float s = 0.0f;
    for (int k = 0; k < 8; ++k) s += part[k][threadIdx.x];
    partial[static_cast<std::int64_t>(blockIdx.y) * D + j] = s;
  }
}

__global__ void colsum_finish_kernel(const float* __restrict__ partial, std::int64_t splits, std::int64_t D,
                                     float* __restrict__ acc) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= D) return;
  float s = 0.0f;
  for (std::int64_t k = 0; k < splits; ++k) s += partial[k * D + j];
  acc[j] += s;
}

template <class F>
void colsum(F f, std::int64_t N, std::int64_t D, float* acc, float* partial, cudaStream_t st) {
  const ColsumPlan p = colsum_plan(N);
  const dim3 grid(static_cast<unsigned>((D + 31) / 32), static_cast<unsigned>(p.splits));
  colsum_partial_kernel<<<grid, dim3(32, 8), 0, st>>>(f, N, D, p.rows_per_split, partial);
  MT_CUDA_LAUNCH_CHECK("colsum_partial_kernel");
  colsum_finish_kernel<<<static_cast<unsigned>((D + 255) / 256), 256, 0, st>>>(partial, p.splits, D, acc);
  MT_CUDA_LAUNCH_CHECK("colsum_finish_kernel");
}

struct PlainTerm {  // dy[r, j]
  const float* dy;
  std::int64_t D;
  __device__ float operator()(std::int64_t r, std::int64_t j) const { return dy[r * D + j]; }
};
struct RmsWeightTerm {  // dy * (x * rstd)
  const float *dy, *x, *rstd;
  std::int64_t D;
  __device__ float operator()(std::int64_t r, std::int64_t j) const { return dy[r * D + j] * (x[r * D + j] * rstd[r]); }
};
struct LnWeightTerm {  // dy * ((x - mean) * rstd)
  const float *dy, *x, *mean, *rstd;
  std::int64_t D;
  __device__ float operator()(std::int64_t r, std::int64_t j) const {
    return dy[r * D + j] * ((x[r * D + j] - mean[r]) * rstd[r]);
  }
};

// ---------------- norms: one warp a row ----------------
__global__ void rmsnorm_fwd_kernel(const float* __restrict__ x, const void* w, bool bf16, float* __restrict__ y,
                                   float* __restrict__ rstd, std::int64_t N, std::int64_t D, float eps) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= N) return;
  const float* xr = x + r * D;
  float ss = 0.0f;
  for (std::int64_t j = lane; j < D; j += 32) ss += xr[j] * xr[j];
  ss = warp_sum(ss);
  const float s = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  if (lane == 0) rstd[r] = s;
  float* yr = y + r * D;
  for (std::int64_t j = lane; j < D; j += 32) yr[j] = load_w(w, j, bf16) * (xr[j] * s);
}

__global__ void rmsnorm_bwd_kernel(const float* __restrict__ x, const void* w, bool bf16,
                                   const float* __restrict__ rstd, const float* __restrict__ dy, float* __restrict__ dx,
                                   std::int64_t N, std::int64_t D, bool add) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= N) return;
  const float* xr = x + r * D;
  const float* dyr = dy + r * D;
  float* dxr = dx + r * D;
  const float s = rstd[r];
  float acc = 0.0f;
  for (std::int64_t j = lane; j < D; j += 32) acc += dyr[j] * load_w(w, j, bf16) * xr[j];
  acc = warp_sum(acc);
  const float c = acc * s * s / static_cast<float>(D);
  for (std::int64_t j = lane; j < D; j += 32) {
    const float v = s * (dyr[j] * load_w(w, j, bf16) - xr[j] * c);
    dxr[j] = add ? dxr[j] + v : v;
  }
}

__global__ void layernorm_fwd_kernel(const float* __restrict__ x, const void* w, const void* b, bool bf16,
                                     float* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                                     std::int64_t N, std::int64_t D, float eps) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= N) return;
  const float* xr = x + r * D;
  float sum = 0.0f;
  for (std::int64_t j = lane; j < D; j += 32) sum += xr[j];
  const float m = warp_sum(sum) / static_cast<float>(D);
  float var = 0.0f;
  for (std::int64_t j = lane; j < D; j += 32) var += (xr[j] - m) * (xr[j] - m);
  const float s = 1.0f / sqrtf(warp_sum(var) / static_cast<float>(D) + eps);
  if (lane == 0) mean[r] = m, rstd[r] = s;
  float* yr = y + r * D;
  for (std::int64_t j = lane; j < D; j += 32) yr[j] = (xr[j] - m) * s * load_w(w, j, bf16) + load_w(b, j, bf16);
}

__global__ void layernorm_bwd_kernel(const float* __restrict__ x, const void* w, bool bf16,
                                     const float* __restrict__ mean, const float* __restrict__ rstd,
                                     const float* __restrict__ dy, float* __restrict__ dx, std::int64_t N,
                                     std::int64_t D, bool add) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= N) return;
  const float* xr = x + r * D;
  const float* dyr = dy + r * D;
  float* dxr = dx + r * D;
  const float m = mean[r], s = rstd[r];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (std::int64_t j = lane; j < D; j += 32) {
    const float g = dyr[j] * load_w(w, j, bf16);
    sum_g += g;
    sum_gx += g * ((xr[j] - m) * s);
  }
  const float mg = warp_sum(sum_g) / static_cast<float>(D);
  const float mgx = warp_sum(sum_gx) / static_cast<float>(D);
  for (std::int64_t j = lane; j < D; j += 32) {
    const float v = s * (dyr[j] * load_w(w, j, bf16) - mg - (xr[j] - m) * s * mgx);
    dxr[j] = add ? dxr[j] + v : v;
  }
}

unsigned row_grid(std::int64_t N) { return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock); }

// ---------------- rotary ----------------
__global__ void rope_kernel(float* __restrict__ x, std::int64_t rows, std::int64_t seq, std::int64_t heads,
                            std::int64_t half, std::int64_t row_stride, const float* __restrict__ cos_t,
                            const float* __restrict__ sin_t, float sgn, const std::int32_t* __restrict__ positions) {
  const std::int64_t total = rows * heads * half;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = idx % half;
    const std::int64_t h = (idx / half) % heads;
    const std::int64_t r = idx / (half * heads);
    const std::int64_t t = positions ? positions[r] : r % seq;  // documents: the row's own position
    float* v = x + r * row_stride + h * 2 * half;
    const float c = cos_t[t * half + i], si = sgn * sin_t[t * half + i];
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * si;
    v[i + half] = b * c + a * si;
  }
}

// ---------------- embedding ----------------
__global__ void embedding_fwd_kernel(const void* wte, const void* wpe, bool bf16,
                                     const std::int32_t* __restrict__ tokens, std::int64_t N, std::int64_t seq,
                                     std::int64_t d, float* __restrict__ y,
                                     const std::int32_t* __restrict__ positions) {
  const std::int64_t total = N * d;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = idx / d, j = idx % d;
    float v = load_w(wte, static_cast<std::int64_t>(tokens[r]) * d + j, bf16);
    if (wpe) v += load_w(wpe, (positions ? positions[r] : r % seq) * d + j, bf16);
    y[idx] = v;
  }
}

// One block row per distinct token, threads over columns: the token's rows added in ascending order.
__global__ void embedding_bwd_tokens_kernel(const float* __restrict__ dx, const std::int32_t* __restrict__ unique,
                                            const std::int32_t* __restrict__ offsets,
                                            const std::int32_t* __restrict__ rows, std::int64_t d,
                                            float* __restrict__ dwte) {
  const std::int64_t u = blockIdx.x;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float* e = dwte + static_cast<std::int64_t>(unique[u]) * d + j;
  float acc = *e;
  for (std::int32_t k = offsets[u]; k < offsets[u + 1]; ++k) acc += dx[static_cast<std::int64_t>(rows[k]) * d + j];
  *e = acc;
}

__global__ void embedding_bwd_positions_kernel(const float* __restrict__ dx, std::int64_t batch, std::int64_t seq,
                                               std::int64_t d, float* __restrict__ dwpe) {
  const std::int64_t t = blockIdx.x;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float acc = dwpe[t * d + j];
  for (std::int64_t b = 0; b < batch; ++b) acc += dx[(b * seq + t) * d + j];
  dwpe[t * d + j] = acc;
}

// Documents: dwpe[p] += the dx rows at position p, in row order (as the CPU scatter adds them); one block
// row per position, threads over columns.
__global__ void embedding_bwd_doc_positions_kernel(const float* __restrict__ dx,
                                                   const std::int32_t* __restrict__ positions, std::int64_t N,
                                                   std::int64_t d, float* __restrict__ dwpe) {
  const std::int64_t p = blockIdx.x;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float acc = dwpe[p * d + j];
  for (std::int64_t r = 0; r < N; ++r)
    if (positions[r] == p) acc += dx[r * d + j];
  dwpe[p * d + j] = acc;
}

// ---------------- cross-entropy: one block a row ----------------
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* shared /* 32 */) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // `shared` may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T r = shared[0];
  for (int k = 1; k < warps; ++k) r = op(r, shared[k]);
  return r;
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

__global__ void cross_entropy_kernel(float* __restrict__ logits, const std::int32_t* __restrict__ targets,
                                     float* __restrict__ row_loss, std::int64_t V, bool want_grad) {
  __shared__ float fshared[32];
  __shared__ double dshared[32];
  const std::int64_t r = blockIdx.x;
  float* x = logits + r * V;
  const std::int32_t tgt = targets[r];
  if (tgt < 0) {  // ignored (-100): no loss, no gradient
    if (threadIdx.x == 0) row_loss[r] = 0.0f;
    if (want_grad)
      for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) x[j] = 0.0f;
    return;
  }
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
  m = block_reduce(m, MaxOp{}, fshared);
  float part = 0.0f;
  for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) part += expf(x[j] - m);
  const double sum = block_reduce(static_cast<double>(part), SumOp{}, dshared);
  const float target_logit = x[tgt];
  __syncthreads();  // every thread read x[tgt] before anyone overwrites it
  if (threadIdx.x == 0) row_loss[r] = (m + static_cast<float>(log(sum))) - target_logit;
  if (want_grad) {
    const float inv = static_cast<float>(1.0 / sum);
    for (std::int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float p = expf(x[j] - m) * inv;
      x[j] = j == tgt ? p - 1.0f : p;
    }
  }
}

__global__ void loss_sum_kernel(const float* __restrict__ row_loss, const std::int32_t* __restrict__ targets,
                                std::int64_t N, double* out) {
  __shared__ double dshared[32];
  double s = 0.0, c = 0.0;
  for (std::int64_t r = threadIdx.x; r < N; r += blockDim.x)
    if (targets[r] != -100) s += row_loss[r], c += 1.0;
  s = block_reduce(s, SumOp{}, dshared);
  c = block_reduce(c, SumOp{}, dshared);
  if (threadIdx.x == 0) out[0] = s, out[1] = c;
}

// y[i] = RNE(x[i]) as bf16 (NaN kept quiet, as cpu::bf16_round_reference)
void to_bf16(const float* x, bf16_t* y, std::size_t n, cudaStream_t st) {
  if (n == 0) return;
  to_bf16_kernel<<<grid_for(n, kBlock), kBlock, 0, st>>>(x, y, n);
  MT_CUDA_LAUNCH_CHECK("to_bf16_kernel");
}

}  // namespace

CudaOps::CudaOps(Gemm& gemm, cudaStream_t stream, Precision precision, TokenRowsLookup token_rows)
    : gemm_(gemm), st_(stream), precision_(precision), token_rows_(std::move(token_rows)) {
  MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&loss_device_), 2 * sizeof(double)));
  MT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&loss_host_), 2 * sizeof(double)));
}

CudaOps::~CudaOps() {
  cudaStreamSynchronize(st_);  // nothing queued may still read the buffers freed below
  for (void* p : slots_) cudaFree(p);
  cudaFree(rope_.cos), cudaFree(rope_.sin);
  cudaFree(loss_device_);
  cudaFreeHost(loss_host_);
}

void CudaOps::reserve(const ScratchPlan& plan) {
  for (int s = 0; s < kSlots; ++s)
    if (plan.bytes[s] > 0) room(static_cast<Slot>(s), plan.bytes[s]);
  reserved_ = true;
}

void* CudaOps::room(Slot s, std::size_t bytes) {
  if (bytes > slot_bytes_[s]) {
    if (reserved_) {  // the plan missed a take: say so at each growth, and carry on (the run is not wrong)
      std::fprintf(stderr,
                   "megatrain: warning: the CUDA ops' %s need %zu bytes, %zu planned (cuda_scratch_plan); "
                   "allocating inside the step\n",
                   scratch_slot_name(s), bytes, slot_bytes_[s]);
    }
    MT_CUDA_CHECK(cudaStreamSynchronize(st_));  // queued kernels may still read the old buffer
    MT_CUDA_CHECK(cudaFree(slots_[s]));
    slots_[s] = nullptr;
    slot_bytes_[s] = 0;
    MT_CUDA_CHECK(cudaMalloc(&slots_[s], bytes));
    slot_bytes_[s] = bytes;
  }
  return slots_[s];
}

float* CudaOps::partial(std::int64_t rows, std::int64_t cols) {
  return static_cast<float*>(room(colsum_partial, colsum_bytes(rows, cols)));
}

const void* CudaOps::rounded(Slot s, const float* x, std::int64_t n) {
  auto* b = static_cast<bf16_t*>(room(s, bf16_operand_bytes(n)));
  to_bf16(x, b, static_cast<std::size_t>(n), st_);
  return b;
}

// ---------------- products ----------------
void CudaOps::round_bf16(const float* x, bf16_t* y, std::size_t n) { to_bf16(x, y, n, st_); }

void CudaOps::linear_forward(const float* x, const void* W, const void* b, float* y, std::int64_t N, std::int64_t in,
                             std::int64_t out) {
  note_op("linear_forward");
  gemm_.linear_forward(bf16() ? rounded(bf16_operand, x, N * in) : x, W, y, N, in, out, bf16(), st_);
  const std::size_t n = static_cast<std::size_t>(N * out);
  if (!b || n == 0) return;
  add_bias_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(y, b, bf16(), n, out);
  MT_CUDA_LAUNCH_CHECK("add_bias_kernel");
}

void CudaOps::linear_backward(const float* dy, const float* x, const void* W, float* dx, bool add, float* dW_acc,
                              float* db_acc, std::int64_t N, std::int64_t in, std::int64_t out) {
  note_op("linear_backward");
  const void* g = bf16() ? rounded(bf16_gradient, dy, N * out) : dy;
  if (dx) gemm_.linear_backward_input(g, W, dx, N, in, out, add, bf16(), st_);
  gemm_.linear_backward_weight(g, bf16() ? rounded(bf16_operand, x, N * in) : x, dW_acc, N, in, out, bf16(), st_);
  if (db_acc) colsum(PlainTerm{dy, out}, N, out, db_acc, partial(N, out), st_);  // bias gradients: the fp32 dy
}

// ---------------- norms ----------------
void CudaOps::rmsnorm_forward(const float* x, const void* w, float* y, float* rstd, std::int64_t N, std::int64_t D,
                              float eps) {
  note_op("rmsnorm_forward");
  rmsnorm_fwd_kernel<<<row_grid(N), kBlock, 0, st_>>>(x, w, bf16(), y, rstd, N, D, eps);
  MT_CUDA_LAUNCH_CHECK("rmsnorm_fwd_kernel");
}

void CudaOps::rmsnorm_backward(const float* x, const void* w, const float* rstd, const float* dy, float* dx,
                               float* dw_acc, std::int64_t N, std::int64_t D, bool add) {
  note_op("rmsnorm_backward");
  rmsnorm_bwd_kernel<<<row_grid(N), kBlock, 0, st_>>>(x, w, bf16(), rstd, dy, dx, N, D, add);
  MT_CUDA_LAUNCH_CHECK("rmsnorm_bwd_kernel");
  if (dw_acc) colsum(RmsWeightTerm{dy, x, rstd, D}, N, D, dw_acc, partial(N, D), st_);
}

void CudaOps::layernorm_forward(const float* x, const void* w, const void* b, float* y, float* mean, float* rstd,
                                std::int64_t N, std::int64_t D, float eps) {
  note_op("layernorm_forward");
  layernorm_fwd_kernel<<<row_grid(N), kBlock, 0, st_>>>(x, w, b, bf16(), y, mean, rstd, N, D, eps);
  MT_CUDA_LAUNCH_CHECK("layernorm_fwd_kernel");
}

void CudaOps::layernorm_backward(const float* x, const void* w, const float* mean, const float* rstd, const float* dy,
                                 float* dx, float* dw_acc, float* db_acc, std::int64_t N, std::int64_t D, bool add) {
  note_op("layernorm_backward");
  layernorm_bwd_kernel<<<row_grid(N), kBlock, 0, st_>>>(x, w, bf16(), mean, rstd, dy, dx, N, D, add);
  MT_CUDA_LAUNCH_CHECK("layernorm_bwd_kernel");
  // Both sums reuse the partials: stream order keeps the second partial pass after the first finish pass.
  float* p = partial(N, D);
  colsum(LnWeightTerm{dy, x, mean, rstd, D}, N, D, dw_acc, p, st_);
  colsum(PlainTerm{dy, D}, N, D, db_acc, p, st_);
}

// ---------------- rotary embeddings ----------------
// The CPU's own tables (cpu::rope_table), uploaded once per shape and params: both backends rotate by
// the same fp32 angles and scale by the same attention factor, every rope_scaling type included.
RopeTables CudaOps::rope_tables(const RopeParams& p, std::int64_t seq, std::int64_t head_dim, float*, float*) {
  note_op("rope_tables");
  CachedRope& r = rope_;
  // Every field (RopeParams::operator==) and the length: dynamic scaling's tables depend on seq.
  const bool same = r.cos && r.seq == seq && r.head_dim == head_dim && r.p == p;
  if (!same) {
    const std::size_t n = static_cast<std::size_t>(seq * (head_dim / 2));
    MT_CUDA_CHECK(cudaStreamSynchronize(st_));  // the old tables (and their host sources) may still be read
    r.host_cos.resize(n), r.host_sin.resize(n);
    cpu::rope_table(p, seq, head_dim, r.host_cos.data(), r.host_sin.data());
    cudaFree(r.cos), cudaFree(r.sin);
    r.cos = r.sin = nullptr;
    MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&r.cos), std::max<std::size_t>(n, 1) * sizeof(float)));
    MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&r.sin), std::max<std::size_t>(n, 1) * sizeof(float)));
    // On the stream whose kernels read them, from host tables kept until the next rebuild (after a sync).
    MT_CUDA_CHECK(cudaMemcpyAsync(r.cos, r.host_cos.data(), n * sizeof(float), cudaMemcpyHostToDevice, st_));
    MT_CUDA_CHECK(cudaMemcpyAsync(r.sin, r.host_sin.data(), n * sizeof(float), cudaMemcpyHostToDevice, st_));
    r.p = p, r.seq = seq, r.head_dim = head_dim;
  }
  return {r.cos, r.sin};
}

void CudaOps::rope_apply(float* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                         std::int64_t row_stride, const RopeTables& t, bool inverse) {
  note_op("rope_apply");
  const std::int64_t half = head_dim / 2;
  const std::size_t n = static_cast<std::size_t>(rows * heads * half);
  if (n == 0) return;
  rope_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(x, rows, seq, heads, half, row_stride, t.cos, t.sin,
                                                       inverse ? -1.0f : 1.0f, t.positions);
  MT_CUDA_LAUNCH_CHECK("rope_kernel");
}

// ---------------- activations, moves ----------------
void CudaOps::swiglu_forward(const float* g, const float* u, float* h, std::size_t n) {
  note_op("swiglu_forward");
  if (n == 0) return;
  swiglu_fwd_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(g, u, h, n);
  MT_CUDA_LAUNCH_CHECK("swiglu_fwd_kernel");
}

void CudaOps::swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, std::size_t n) {
  note_op("swiglu_backward");
  if (n == 0) return;
  swiglu_bwd_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(g, u, dh, dg, du, n);
  MT_CUDA_LAUNCH_CHECK("swiglu_bwd_kernel");
}

void CudaOps::clamped_swiglu_forward(const float* g, const float* u, float* h, std::size_t n, float alpha,
                                     float limit) {
  note_op("clamped_swiglu_forward");
  if (n == 0) return;
  clamped_swiglu_fwd_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(g, u, h, n, alpha, limit);
  MT_CUDA_LAUNCH_CHECK("clamped_swiglu_fwd_kernel");
}

void CudaOps::clamped_swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du,
                                      std::size_t n, float alpha, float limit) {
  note_op("clamped_swiglu_backward");
  if (n == 0) return;
  clamped_swiglu_bwd_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(g, u, dh, dg, du, n, alpha, limit);
  MT_CUDA_LAUNCH_CHECK("clamped_swiglu_bwd_kernel");
}

void CudaOps::gelu_forward(const float* x, float* y, std::size_t n) {
  note_op("gelu_forward");
  if (n == 0) return;
  gelu_fwd_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(x, y, n);
  MT_CUDA_LAUNCH_CHECK("gelu_fwd_kernel");
}

void CudaOps::gelu_backward(const float* x, const float* dy, float* dx, std::size_t n) {
  note_op("gelu_backward");
  if (n == 0) return;
  gelu_bwd_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(x, dy, dx, n);
  MT_CUDA_LAUNCH_CHECK("gelu_bwd_kernel");
}

void CudaOps::add_into(float* y, const float* x, std::size_t n) {
  note_op("add_into");
  if (n == 0) return;
  add_into_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(y, x, n);
  MT_CUDA_LAUNCH_CHECK("add_into_kernel");
}

void CudaOps::copy(float* dst, const float* src, std::size_t n) {
  note_op("copy");
  if (n) MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, st_));
}

void CudaOps::fill_zero(float* dst, std::size_t n) {
  note_op("fill_zero");
  if (n) MT_CUDA_CHECK(cudaMemsetAsync(dst, 0, n * sizeof(float), st_));
}

// ---------------- embedding ----------------
void CudaOps::embedding_forward(const void* wte, const void* wpe, const token_t* tokens, std::int64_t N,
                                std::int64_t seq, std::int64_t d, float* x_out, const std::int32_t* positions) {
  note_op("embedding_forward");
  const std::size_t n = static_cast<std::size_t>(N * d);
  if (n == 0) return;
  embedding_fwd_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(wte, wpe, bf16(), tokens, N, seq, d, x_out,
                                                                wpe ? positions : nullptr);
  MT_CUDA_LAUNCH_CHECK("embedding_fwd_kernel");
}

// dwte rows += dx rows, per distinct token in token order (TokenRows, built on the host from the
// uploaded ids), so every row sums in the CPU's order; dwpe[t] += sum over b of dx[b * seq + t], or with
// documents the rows at position t in row order.
void CudaOps::embedding_backward(const token_t* tokens, const float* dx, std::int64_t N, std::int64_t seq,
                                 std::int64_t d, float* dwte_acc, float* dwpe_acc, const std::int32_t* positions) {
  note_op("embedding_backward");
  if (!token_rows_) throw std::logic_error("cuda ops: embedding_backward needs the backend's token rows");
  const TokenRows r = token_rows_(tokens, N);
  if (r.n_unique > 0) {
    const dim3 grid(static_cast<unsigned>(r.n_unique), static_cast<unsigned>((d + 127) / 128));
    embedding_bwd_tokens_kernel<<<grid, 128, 0, st_>>>(dx, r.unique, r.offsets, r.rows, d, dwte_acc);
    MT_CUDA_LAUNCH_CHECK("embedding_bwd_tokens_kernel");
  }
  if (dwpe_acc && positions) {  // documents: every position < seq
    const dim3 grid(static_cast<unsigned>(seq), static_cast<unsigned>((d + 127) / 128));
    embedding_bwd_doc_positions_kernel<<<grid, 128, 0, st_>>>(dx, positions, N, d, dwpe_acc);
    MT_CUDA_LAUNCH_CHECK("embedding_bwd_doc_positions_kernel");
  } else if (dwpe_acc) {
    const dim3 grid(static_cast<unsigned>(seq), static_cast<unsigned>((d + 127) / 128));
    embedding_bwd_positions_kernel<<<grid, 128, 0, st_>>>(dx, N / seq, seq, d, dwpe_acc);
    MT_CUDA_LAUNCH_CHECK("embedding_bwd_positions_kernel");
  }
}

// ---------------- the loss ----------------
void CudaOps::cross_entropy_rows(float* logits, const token_t* targets, float* row_loss, std::int64_t rows,
                                 std::int64_t V, bool want_grad) {
  note_op("cross_entropy_rows");
  if (rows == 0) return;
  cross_entropy_kernel<<<static_cast<unsigned>(rows), 512, 0, st_>>>(logits, targets, row_loss, V, want_grad);
  MT_CUDA_LAUNCH_CHECK("cross_entropy_kernel");
}

LossSum CudaOps::loss_sum(const float* row_loss, const token_t* targets, std::int64_t N) {
  note_op("loss_sum");
  loss_sum_kernel<<<1, 1024, 0, st_>>>(row_loss, targets, N, loss_device_);  // one block: row order fixed
  MT_CUDA_LAUNCH_CHECK("loss_sum_kernel");
  MT_CUDA_CHECK(cudaMemcpyAsync(loss_host_, loss_device_, 2 * sizeof(double), cudaMemcpyDeviceToHost, st_));
  MT_CUDA_CHECK(cudaStreamSynchronize(st_));
  LossSum out;
  out.loss_sum = loss_host_[0];
  out.counted = static_cast<std::int64_t>(loss_host_[1]);
  return out;
}

}  // namespace mt::cuda
