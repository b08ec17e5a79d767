// CudaOps' mixture-of-experts ops (contracts in kernels/ops.hpp, CPU kernels in kernels/cpu/moe.cpp):
// the router's choice per token (one thread a token; k <= 32), its backward, the grouping of the
// choices by expert (moe_plan.hpp: per-chunk counts, their prefix sums, then each chunk's rows of each
// expert in slot order, so the grouping is the CPU's, stable and atomic-free), and the gathers and combines (one thread
// an output element; a token's k choices summed in j order; dweight one warp a choice, lanes reduced in a fixed tree).
// Deterministic: every output has one owner. The grouped products are Ops' default, one cuBLASLt product per expert
// with rows (the offsets come back to the host in moe_dispatch, which waits).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/moe_plan.hpp"

namespace mt::cuda {
namespace {

constexpr unsigned kBlock = 256;
constexpr std::int64_t kMaxTopK = 32;

// The j-th best of v (as f(e)), excluding the j choices before it in chosen[]: strict > so ties go to
// the lower index, as on the CPU.
template <class F>
__device__ std::int32_t next_best(F f, std::int64_t E, const std::int32_t* chosen, std::int64_t j) {
  std::int32_t best = -1;
  float bv = 0.0f;
  for (std::int64_t e = 0; e < E; ++e) {
    bool taken = false;
    for (std::int64_t i = 0; i < j; ++i) taken = taken || chosen[i] == e;
    if (taken) continue;
    const float v = f(e);
    if (best < 0 || v > bv) best = static_cast<std::int32_t>(e), bv = v;
  }
  return best;
}

__global__ void route_kernel(const float* __restrict__ logits, RouteShape s, std::int32_t* __restrict__ expert,
                             float* __restrict__ weight) {
  const std::int64_t n = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (n >= s.tokens) return;
  const std::int64_t E = s.experts, k = s.top_k;
  const float* l = logits + n * E;
  std::int32_t* idx = expert + n * k;
  float* w = weight + n * k;
  if (s.kind == RouterKind::softmax_topk) {
    float m = l[0], z = 0.0f;
    for (std::int64_t e = 1; e < E; ++e) m = fmaxf(m, l[e]);
    for (std::int64_t e = 0; e < E; ++e) z += expf(l[e] - m);
    auto p = [&](std::int64_t e) { return expf(l[e] - m) / z; };
    float sum = 0.0f;
    for (std::int64_t j = 0; j < k; ++j) {
      idx[j] = next_best(p, E, idx, j);
      sum += (w[j] = p(idx[j]));
    }
    if (s.renormalize)
      for (std::int64_t j = 0; j < k; ++j) w[j] /= sum;
  } else {
    auto raw = [&](std::int64_t e) { return l[e]; };
    for (std::int64_t j = 0; j < k; ++j) idx[j] = next_best(raw, E, idx, j);
    float z = 0.0f;
    for (std::int64_t j = 0; j < k; ++j) z += (w[j] = expf(l[idx[j]] - l[idx[0]]));
    for (std::int64_t j = 0; j < k; ++j) w[j] /= z;
  }
}

__global__ void route_bwd_kernel(const float* __restrict__ logits, const std::int32_t* __restrict__ expert,
                                 const float* __restrict__ weight, const float* __restrict__ dweight,
                                 float* __restrict__ dlogits, RouteShape s) {
  const std::int64_t n = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (n >= s.tokens) return;
  const std::int64_t E = s.experts, k = s.top_k;
  const std::int32_t* idx = expert + n * k;
  const float* w = weight + n * k;
  const float* dw = dweight + n * k;
  float* dl = dlogits + n * E;
  float wdw = 0.0f;
  for (std::int64_t j = 0; j < k; ++j) wdw += w[j] * dw[j];
  if (s.kind == RouterKind::topk_softmax || s.renormalize) {
    for (std::int64_t e = 0; e < E; ++e) dl[e] = 0.0f;
    for (std::int64_t j = 0; j < k; ++j) dl[idx[j]] = w[j] * (dw[j] - wdw);
  } else {
    const float* l = logits + n * E;
    float m = l[0], z = 0.0f;
    for (std::int64_t e = 1; e < E; ++e) m = fmaxf(m, l[e]);
    for (std::int64_t e = 0; e < E; ++e) z += expf(l[e] - m);
    for (std::int64_t e = 0; e < E; ++e) dl[e] = -(expf(l[e] - m) / z) * wdw;
    for (std::int64_t j = 0; j < k; ++j) dl[idx[j]] += (expf(l[idx[j]] - m) / z) * dw[j];
  }
}

// The grouping by expert in three launches (moe_plan.hpp): a block a chunk of choices (its ids in shared
// memory), one thread an expert in each.
__device__ std::int64_t load_chunk(const std::int32_t* __restrict__ expert, std::int64_t P, std::int32_t* ids) {
  const std::int64_t q0 = static_cast<std::int64_t>(blockIdx.x) * kDispatchChunk;
  const std::int64_t n = min(kDispatchChunk, P - q0);
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) ids[i] = expert[q0 + i];
  __syncthreads();
  return n;
}

__global__ void dispatch_count_kernel(const std::int32_t* __restrict__ expert, std::int64_t P, std::int64_t E,
                                      std::int64_t* __restrict__ counts) {
  __shared__ std::int32_t ids[kDispatchChunk];
  const std::int64_t n = load_chunk(expert, P, ids);
  for (std::int64_t e = threadIdx.x; e < E; e += blockDim.x)
    counts[static_cast<std::int64_t>(blockIdx.x) * E + e] = dispatch_count(ids, n, e);
}

__global__ void dispatch_scan_kernel(std::int64_t chunks, std::int64_t E, std::int64_t* __restrict__ offsets,
                                     std::int64_t* __restrict__ counts) {
  for (std::int64_t e = threadIdx.x; e < E; e += blockDim.x)
    offsets[e + 1] = dispatch_column_prefix(counts, chunks, E, e);
  __syncthreads();
  if (threadIdx.x == 0) dispatch_offsets(offsets, E);
  __syncthreads();
  for (std::int64_t e = threadIdx.x; e < E; e += blockDim.x)
    for (std::int64_t c = 0; c < chunks; ++c) counts[c * E + e] += offsets[e];
}

__global__ void dispatch_place_kernel(const std::int32_t* __restrict__ expert, std::int64_t P, std::int64_t E,
                                      const std::int64_t* __restrict__ first, std::int32_t* __restrict__ order,
                                      std::int32_t* __restrict__ slot_pos) {
  __shared__ std::int32_t ids[kDispatchChunk];
  const std::int64_t n = load_chunk(expert, P, ids);
  const std::int64_t q0 = static_cast<std::int64_t>(blockIdx.x) * kDispatchChunk;
  for (std::int64_t e = threadIdx.x; e < E; e += blockDim.x)
    dispatch_place(ids, n, q0, e, first[static_cast<std::int64_t>(blockIdx.x) * E + e], order, slot_pos);
}

__global__ void gather_kernel(const float* __restrict__ x, const std::int32_t* __restrict__ order, std::int64_t P,
                              std::int64_t k, std::int64_t d, float* __restrict__ xe) {
  const std::size_t n = static_cast<std::size_t>(P * d);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::int64_t p = static_cast<std::int64_t>(i) / d, c = static_cast<std::int64_t>(i) % d;
    xe[i] = x[(order[p] / k) * d + c];
  }
}

__global__ void gather_bwd_kernel(const float* __restrict__ dxe, const std::int32_t* __restrict__ slot_pos,
                                  std::int64_t N, std::int64_t k, std::int64_t d, float* __restrict__ dx, bool add) {
  const std::size_t n = static_cast<std::size_t>(N * d);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::int64_t t = static_cast<std::int64_t>(i) / d, c = static_cast<std::int64_t>(i) % d;
    float acc = add ? dx[i] : 0.0f;
    for (std::int64_t j = 0; j < k; ++j) {
      const float g = dxe[static_cast<std::int64_t>(slot_pos[t * k + j]) * d + c];
      acc = (j == 0 && !add) ? g : acc + g;
    }
    dx[i] = acc;
  }
}

__global__ void combine_kernel(const float* __restrict__ ye, const std::int32_t* __restrict__ slot_pos,
                               const float* __restrict__ weight, std::int64_t N, std::int64_t k, std::int64_t d,
                               float* __restrict__ y) {
  const std::size_t n = static_cast<std::size_t>(N * d);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::int64_t t = static_cast<std::int64_t>(i) / d, c = static_cast<std::int64_t>(i) % d;
    float acc = 0.0f;
    for (std::int64_t j = 0; j < k; ++j) {
      const float v = weight[t * k + j] * ye[static_cast<std::int64_t>(slot_pos[t * k + j]) * d + c];
      acc = j == 0 ? v : acc + v;
    }
    y[i] = acc;
  }
}

__global__ void combine_dye_kernel(const float* __restrict__ dy, const std::int32_t* __restrict__ slot_pos,
                                   const float* __restrict__ weight, std::int64_t P, std::int64_t k, std::int64_t d,
                                   float* __restrict__ dye) {
  const std::size_t n = static_cast<std::size_t>(P * d);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::int64_t q = static_cast<std::int64_t>(i) / d, c = static_cast<std::int64_t>(i) % d;  // slot q
    dye[static_cast<std::int64_t>(slot_pos[q]) * d + c] = weight[q] * dy[(q / k) * d + c];
  }
}

// dweight[q] = dy[q / k] . ye[slot_pos[q]]: one warp a slot, lanes over d, a fixed shuffle tree.
__global__ void combine_dweight_kernel(const float* __restrict__ dy, const float* __restrict__ ye,
                                       const std::int32_t* __restrict__ slot_pos, std::int64_t P, std::int64_t k,
                                       std::int64_t d, float* __restrict__ dweight) {
  const std::int64_t q = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  if (q >= P) return;  // whole warps leave together (blockDim is a multiple of 32)
  const float* g = dy + (q / k) * d;
  const float* v = ye + static_cast<std::int64_t>(slot_pos[q]) * d;
  float acc = 0.0f;
  for (std::int64_t c = lane; c < d; c += 32) acc += g[c] * v[c];
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  if (lane == 0) dweight[q] = acc;
}

void check_top_k(const RouteShape& s) {
  if (s.top_k < 1 || s.top_k > kMaxTopK)
    throw std::invalid_argument("cuda ops: moe_route supports top_k in [1, 32], got " + std::to_string(s.top_k));
}

// The load-balancing loss (ops.hpp): z per token is the logits or gpt-oss's scattered weights; the
// statistics sum softmax(z) over chunks of tokens, then over the chunks (below); the backward is one
// thread a token.
__device__ float balance_z(const float* logits, const std::int32_t* expert, const float* weight, const RouteShape& s,
                           std::int64_t n, std::int64_t e) {
  if (s.kind == RouterKind::softmax_topk) return logits[n * s.experts + e];
  for (std::int64_t j = 0; j < s.top_k; ++j)
    if (expert[n * s.top_k + j] == e) return weight[n * s.top_k + j];
  return 0.0f;
}

// One thread a chunk of kBalanceChunk tokens: its softmax rows summed per expert in token order into
// partial[chunk, E] (the CPU's chunks); then one thread an expert sums the chunks in order.
__global__ void balance_partial_kernel(const float* __restrict__ logits, const std::int32_t* __restrict__ expert,
                                       const float* __restrict__ weight, RouteShape s, float* __restrict__ partial) {
  const std::int64_t ch = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  const std::int64_t chunks = (s.tokens + kBalanceChunk - 1) / kBalanceChunk;
  if (ch >= chunks) return;
  const std::int64_t E = s.experts;
  float* acc = partial + ch * E;
  for (std::int64_t e = 0; e < E; ++e) acc[e] = 0.0f;
  const std::int64_t end = min(s.tokens, (ch + 1) * kBalanceChunk);
  for (std::int64_t n = ch * kBalanceChunk; n < end; ++n) {
    float m = balance_z(logits, expert, weight, s, n, 0), z = 0.0f;
    for (std::int64_t e = 1; e < E; ++e) m = fmaxf(m, balance_z(logits, expert, weight, s, n, e));
    for (std::int64_t e = 0; e < E; ++e) z += expf(balance_z(logits, expert, weight, s, n, e) - m);
    for (std::int64_t e = 0; e < E; ++e) acc[e] += expf(balance_z(logits, expert, weight, s, n, e) - m) / z;
  }
}

__global__ void balance_colsum_kernel(const float* __restrict__ partial, std::int64_t chunks, std::int64_t E,
                                      float* __restrict__ sums) {
  const std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (e >= E) return;
  float acc = 0.0f;
  for (std::int64_t c = 0; c < chunks; ++c) acc += partial[c * E + e];
  sums[e] = acc;
}

__global__ void balance_bwd_kernel(const float* __restrict__ logits, const std::int32_t* __restrict__ expert,
                                   const float* __restrict__ weight, const float* __restrict__ grad, RouteShape s,
                                   float* __restrict__ dlogits, float* __restrict__ dweight) {
  const std::int64_t n = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (n >= s.tokens) return;
  const std::int64_t E = s.experts, k = s.top_k;
  float m = balance_z(logits, expert, weight, s, n, 0), z = 0.0f;
  for (std::int64_t e = 1; e < E; ++e) m = fmaxf(m, balance_z(logits, expert, weight, s, n, e));
  for (std::int64_t e = 0; e < E; ++e) z += expf(balance_z(logits, expert, weight, s, n, e) - m);
  auto p = [&](std::int64_t e) { return expf(balance_z(logits, expert, weight, s, n, e) - m) / z; };
  float t = 0.0f;
  for (std::int64_t e = 0; e < E; ++e) t += p(e) * grad[e];
  if (s.kind == RouterKind::softmax_topk) {
    for (std::int64_t e = 0; e < E; ++e) dlogits[n * E + e] += p(e) * (grad[e] - t);
  } else {
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t e = expert[n * k + j];
      dweight[n * k + j] += p(e) * (grad[e] - t);
    }
  }
}

}  // namespace

void CudaOps::moe_route(const float* logits, const RouteShape& s, std::int32_t* expert, float* weight) {
  note_op("moe_route");
  check_top_k(s);
  if (s.tokens == 0) return;
  const unsigned blocks = static_cast<unsigned>((s.tokens + kBlock - 1) / kBlock);
  route_kernel<<<blocks, kBlock, 0, st_>>>(logits, s, expert, weight);
  MT_CUDA_LAUNCH_CHECK("route_kernel");
}

void CudaOps::moe_route_backward(const float* logits, const std::int32_t* expert, const float* weight,
                                 const float* dweight, float* dlogits, const RouteShape& s) {
  note_op("moe_route_backward");
  check_top_k(s);
  if (s.tokens == 0) return;
  const unsigned blocks = static_cast<unsigned>((s.tokens + kBlock - 1) / kBlock);
  route_bwd_kernel<<<blocks, kBlock, 0, st_>>>(logits, expert, weight, dweight, dlogits, s);
  MT_CUDA_LAUNCH_CHECK("route_bwd_kernel");
}

void CudaOps::moe_dispatch(const std::int32_t* expert, const RouteShape& s, std::int32_t* order, std::int32_t* slot_pos,
                           std::int64_t* offsets_host) {
  note_op("moe_dispatch");
  const std::int64_t P = s.choices(), E = s.experts, chunks = dispatch_chunks(P);
  const std::size_t bytes = static_cast<std::size_t>(E + 1) * sizeof(std::int64_t);
  auto* offsets = static_cast<std::int64_t*>(room(moe_offsets, dispatch_scratch_bytes(P, E)));
  std::int64_t* counts = offsets + E + 1;
  if (chunks > 0) {
    dispatch_count_kernel<<<static_cast<unsigned>(chunks), kBlock, 0, st_>>>(expert, P, E, counts);
    MT_CUDA_LAUNCH_CHECK("dispatch_count_kernel");
  }
  dispatch_scan_kernel<<<1, 1024, 0, st_>>>(chunks, E, offsets, counts);
  MT_CUDA_LAUNCH_CHECK("dispatch_scan_kernel");
  if (chunks > 0) {
    dispatch_place_kernel<<<static_cast<unsigned>(chunks), kBlock, 0, st_>>>(expert, P, E, counts, order, slot_pos);
    MT_CUDA_LAUNCH_CHECK("dispatch_place_kernel");
  }
  MT_CUDA_CHECK(cudaMemcpyAsync(offsets_host, offsets, bytes, cudaMemcpyDeviceToHost, st_));
  MT_CUDA_CHECK(cudaStreamSynchronize(st_));  // the grouped products need the shapes on the host
}

void CudaOps::moe_gather(const float* x, const std::int32_t* order, const RouteShape& s, std::int64_t d, float* xe) {
  note_op("moe_gather");
  const std::size_t n = static_cast<std::size_t>(s.choices() * d);
  if (n == 0) return;
  gather_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(x, order, s.choices(), s.top_k, d, xe);
  MT_CUDA_LAUNCH_CHECK("gather_kernel");
}

void CudaOps::moe_gather_backward(const float* dxe, const std::int32_t* slot_pos, const RouteShape& s, std::int64_t d,
                                  float* dx, bool add) {
  note_op("moe_gather_backward");
  const std::size_t n = static_cast<std::size_t>(s.tokens * d);
  if (n == 0) return;
  gather_bwd_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(dxe, slot_pos, s.tokens, s.top_k, d, dx, add);
  MT_CUDA_LAUNCH_CHECK("gather_bwd_kernel");
}

void CudaOps::moe_combine(const float* ye, const std::int32_t* slot_pos, const float* weight, const RouteShape& s,
                          std::int64_t d, float* y) {
  note_op("moe_combine");
  const std::size_t n = static_cast<std::size_t>(s.tokens * d);
  if (n == 0) return;
  combine_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(ye, slot_pos, weight, s.tokens, s.top_k, d, y);
  MT_CUDA_LAUNCH_CHECK("combine_kernel");
}

void CudaOps::moe_combine_backward(const float* dy, const float* ye, const std::int32_t* slot_pos, const float* weight,
                                   const RouteShape& s, std::int64_t d, float* dye, float* dweight) {
  note_op("moe_combine_backward");
  const std::int64_t P = s.choices();
  const std::size_t n = static_cast<std::size_t>(P * d);
  if (n == 0) return;
  combine_dye_kernel<<<grid_for(n, kBlock), kBlock, 0, st_>>>(dy, slot_pos, weight, P, s.top_k, d, dye);
  MT_CUDA_LAUNCH_CHECK("combine_dye_kernel");
  const unsigned blocks = static_cast<unsigned>((P * 32 + kBlock - 1) / kBlock);
  combine_dweight_kernel<<<blocks, kBlock, 0, st_>>>(dy, ye, slot_pos, P, s.top_k, d, dweight);
  MT_CUDA_LAUNCH_CHECK("combine_dweight_kernel");
}

void CudaOps::moe_balance_stats(const float* logits, const std::int32_t* expert, const float* weight,
                                const RouteShape& s, float* prob_sums_host) {
  note_op("moe_balance_stats");
  const std::int64_t E = s.experts, chunks = (s.tokens + kBalanceChunk - 1) / kBalanceChunk;
  auto* partial = static_cast<float*>(room(moe_balance, balance_bytes(s)));
  float* sums = partial + chunks * E;
  if (chunks > 0) {
    balance_partial_kernel<<<grid_for(static_cast<std::size_t>(chunks), kBlock), kBlock, 0, st_>>>(logits, expert,
                                                                                                   weight, s, partial);
    MT_CUDA_LAUNCH_CHECK("balance_partial_kernel");
  }
  balance_colsum_kernel<<<grid_for(static_cast<std::size_t>(E), kBlock), kBlock, 0, st_>>>(partial, chunks, E, sums);
  MT_CUDA_LAUNCH_CHECK("balance_colsum_kernel");
  MT_CUDA_CHECK(
      cudaMemcpyAsync(prob_sums_host, sums, static_cast<std::size_t>(E) * sizeof(float), cudaMemcpyDeviceToHost, st_));
  MT_CUDA_CHECK(cudaStreamSynchronize(st_));  // the host sums the layers' statistics
}

void CudaOps::moe_balance_backward(const float* logits, const std::int32_t* expert, const float* weight,
                                   const float* grad, const RouteShape& s, float* dlogits, float* dweight) {
  note_op("moe_balance_backward");
  if (s.tokens == 0) return;
  balance_bwd_kernel<<<grid_for(static_cast<std::size_t>(s.tokens), kBlock), kBlock, 0, st_>>>(
      logits, expert, weight, grad, s, dlogits, dweight);
  MT_CUDA_LAUNCH_CHECK("balance_bwd_kernel");
}

}  // namespace mt::cuda
