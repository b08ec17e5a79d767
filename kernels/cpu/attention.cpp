// Causal grouped-query attention, flash-style on the CPU: queries go in blocks of kQueryBlock rows, keys in
// blocks of kKeyBlock; the block products (Q K^T, P V, and the backward's four) are single-threaded GEMMs
// (sgemm_serial: the linear layers' library, on this thread only, so a task's bits never depend on the pool), and the
// softmax is online (running max and sum per query row), so the memory is a few kQueryBlock x kKeyBlock tiles per
// thread, never T x T. The backward recomputes the probabilities from the saved log-sum-exp.
// Query head h reads kv head h / (q_heads / kv_heads), as transformers' repeat_kv does.
// Work is split over (batch, head) tasks -- (batch, kv head) in the backward, so each task owns the
// dk/dv rows it writes -- and every task runs the same sequence whatever the thread count.
// Sequence tiles (AttnShape::q_start): the query rows are positions q_start.. of each sequence; key
// blocks stay aligned to position 0, so a query row meets its keys in the same blocks either way.
// Sliding window (AttnShape::window): key blocks wholly before a query block's window are skipped, and
// each row masks its keys outside [p - window + 1, p]. Sinks (gpt-oss): one logit per head joins each
// row's softmax at the end of the forward; the saved lse includes it, so the backward's probabilities
// are exact as they are, and d(sink) is summed in a pass of its own (per head, batch and rows in order).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/profile.hpp"

namespace mt::cpu {

namespace {

// Key blocks twice as wide as query blocks: each block product does twice the work per call (at long
// context 1.3x the kernel's rate at 64 x 64, measured). Causal attention computes no pair more, since a
// query block's last key block is cut at the block's own last row (kn). Sliding windows do: key blocks
// before a window are skipped whole, so up to 127 masked keys a row are computed (63 before). A row meets
// its keys in blocks aligned to position 0, the last one cut at its query block's end: the same blocks
// whether the rows are tiled or not, as long as tiles start on a query block boundary of the whole sequence.
constexpr std::int64_t kQueryBlock = 64;
constexpr std::int64_t kKeyBlock = 128;
// Query blocks that walk the keys together: each key/value block is loaded once for kGroup query blocks
// and reused from cache (at 32k tokens a head's keys and values no longer fit it). Each query block
// still meets the key blocks in the same order with the same products: the grouping changes no bit.
constexpr std::int64_t kGroup = 4;

// C[m, n] (ldc) = op(A) op(B) (+ C when accumulate), single-threaded.
void mm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* A, std::int64_t lda,
        const float* B, std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc) {
  sgemm_serial(ta, tb, m, n, k, A, lda, B, ldb, accumulate ? 1.0f : 0.0f, C, ldc);
}

// s[j] = exp(s[j] - m) for j < n; returns their sum in a fixed order.
float exp_shift(float* s, std::int64_t n, float m) {
  std::int64_t j = 0;
#ifdef MT_AVX2
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 e = simd::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = simd::hsum(acc);
  if (j < n) {
    const std::size_t rest = static_cast<std::size_t>(n - j);
    const __m256 e = simd::exp8(_mm256_sub_ps(simd::load_tail(s + j, rest), vm));
    simd::store_tail(s + j, e, rest);
    alignas(32) float buf[8];
    _mm256_store_ps(buf, e);
    for (std::size_t i = 0; i < rest; ++i) sum += buf[i];
  }
  return sum;
#else
  float sum = 0.0f;
  for (; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
  return sum;
#endif
}

// s[j] *= scale for j < n; returns the largest of them and `m` (std::max's order: a NaN is skipped). Vectorised:
// the row's running max was a serial chain of dependent scalar max operations, half the forward's time.
float scale_max(float* s, std::int64_t n, float scale, float m) {
  std::int64_t j = 0;
#ifdef MT_AVX2
  const __m256 vs = _mm256_set1_ps(scale);
  __m256 acc = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + j), vs);
    _mm256_storeu_ps(s + j, x);
    acc = _mm256_max_ps(x, acc);  // x > acc ? x : acc, as std::max(acc, x)
  }
  m = simd::hmax(acc);
#endif
  for (; j < n; ++j) m = std::max(m, s[j] *= scale);
  return m;
}

// The keys query position `q` may see within the key block starting at k0 ([lo, hi) of its kn columns):
// causal, and within the window when there is one.
struct Visible {
  std::int64_t lo, hi;
  bool empty() const { return hi <= lo; }
};
inline Visible visible(std::int64_t q, std::int64_t k0, std::int64_t kn, std::int64_t window) {
  const std::int64_t hi = std::max<std::int64_t>(0, std::min(kn, q - k0 + 1));
  const std::int64_t lo = window > 0 ? std::clamp<std::int64_t>(q - window + 1 - k0, 0, hi) : 0;
  return {lo, hi};
}
// The first key block a query block starting at position pos0 meets (its first row's window start).
inline std::int64_t first_key_block(std::int64_t pos0, std::int64_t window) {
  if (window <= 0) return 0;
  const std::int64_t first = std::max<std::int64_t>(0, pos0 - window + 1);
  return first / kKeyBlock * kKeyBlock;
}

// Sink logits widened to fp32 (they arrive in the run's precision), into the calling thread's room.
const std::vector<float>& widen_sinks(const void* sinks, std::int64_t heads, bool bf16) {
  thread_local std::vector<float> s;
  s.resize(static_cast<std::size_t>(heads));
  for (std::int64_t h = 0; h < heads; ++h)
    s[static_cast<std::size_t>(h)] =
        bf16 ? bf16_to_float(static_cast<const bf16_t*>(sinks)[h]) : static_cast<const float*>(sinks)[h];
  return s;
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, const void* sinks, bool sinks_bf16, float* out,
                       float* lse, const AttnShape& a, int threads) {
  prof::Scope prof_scope(prof::attention);
  const std::int64_t T = a.seq, Q = a.q_rows(), q_start = a.q_start, hd = a.head_dim, group = a.q_heads / a.kv_heads;
  const std::int64_t W = a.window;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::int64_t tasks = a.batch * a.q_heads;
  const float* sink = sinks ? widen_sinks(sinks, a.q_heads, sinks_bf16).data() : nullptr;  // read by every thread
#pragma omp parallel num_threads(threads) if (tasks > 1 && Q * T * hd > 4096)
  {
    // Per-thread tiles, kept across calls by the pool's threads (allocated once, not per call).
    thread_local std::vector<float> S, O, m, l;
    S.resize(kQueryBlock * kKeyBlock);
    O.resize(static_cast<std::size_t>(kGroup * kQueryBlock * hd));
    m.resize(kGroup * kQueryBlock);
    l.resize(kGroup * kQueryBlock);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / a.q_heads, h = task % a.q_heads, kvh = h / group;
      const float* kb = k + b * T * a.kv_stride + kvh * hd;
      const float* vb = v + b * T * a.kv_stride + kvh * hd;
      for (std::int64_t g0 = 0; g0 < Q; g0 += kGroup * kQueryBlock) {  // g0: the group's first query row
        const std::int64_t blocks = std::min<std::int64_t>(kGroup, (Q - g0 + kQueryBlock - 1) / kQueryBlock);
        const std::int64_t g_end = q_start + std::min(Q, g0 + kGroup * kQueryBlock);  // the group's last position + 1
        std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.end(), 0.0f);
        std::fill(O.begin(), O.end(), 0.0f);
        for (std::int64_t k0 = first_key_block(q_start + g0, W); k0 < g_end; k0 += kKeyBlock) {
          for (std::int64_t j = 0; j < blocks; ++j) {  // each query block of the group that sees this key block
            const std::int64_t q0 = g0 + j * kQueryBlock, qn = std::min(kQueryBlock, Q - q0), pos0 = q_start + q0;
            if (k0 >= pos0 + qn || k0 < first_key_block(pos0, W)) continue;
            const std::int64_t kn = std::min(kKeyBlock, pos0 + qn - k0);
            const float* qb = q + (b * Q + q0) * a.q_stride + h * hd;
            float* Oj = O.data() + j * kQueryBlock * hd;
            float* mj = m.data() + j * kQueryBlock;
            float* lj = l.data() + j * kQueryBlock;
            mm(false, true, qn, kn, hd, qb, a.q_stride, kb + k0 * a.kv_stride, a.kv_stride, false, S.data(), kKeyBlock);
            for (std::int64_t i = 0; i < qn; ++i) {
              float* s = S.data() + i * kKeyBlock;
              const Visible vis = visible(pos0 + i, k0, kn, W);
              if (vis.empty()) {  // no key of this block: the row's state stays as it is
                std::fill(s, s + kn, 0.0f);
                continue;
              }
              const std::int64_t n = vis.hi - vis.lo;
              float* sv = s + vis.lo;
              const float mx = scale_max(sv, n, scale, mj[i]);
              const float corr = simd::exp1(mj[i] - mx);  // 0 on the row's first block (m = -inf)
              lj[i] = lj[i] * corr + exp_shift(sv, n, mx);
              std::fill(s, sv, 0.0f);  // masked keys: before the window, after the causal edge
              std::fill(s + vis.hi, s + kn, 0.0f);
              simd::scale(corr, Oj + i * hd, hd);
              mj[i] = mx;
            }
            mm(false, false, qn, hd, kn, S.data(), kKeyBlock, vb + k0 * a.kv_stride, a.kv_stride, true, Oj, hd);
          }
        }
        for (std::int64_t j = 0; j < blocks; ++j) {
          const std::int64_t q0 = g0 + j * kQueryBlock, qn = std::min(kQueryBlock, Q - q0);
          for (std::int64_t i = 0; i < qn; ++i) {
            const std::int64_t r = j * kQueryBlock + i;
            float* o = out + (b * Q + q0 + i) * a.o_stride + h * hd;
            float mr = m[static_cast<std::size_t>(r)], lr = l[static_cast<std::size_t>(r)], corr = 1.0f;
            if (sinks) {  // the sink's column joins the row: rescale to the larger of its max and the sink
              const float sh = sink[h], mx = std::max(mr, sh);
              corr = std::exp(mr - mx);
              lr = lr * corr + std::exp(sh - mx);
              mr = mx;
            }
            const float inv = corr / lr;
            for (std::int64_t c = 0; c < hd; ++c) o[c] = O[static_cast<std::size_t>(r * hd + c)] * inv;
            lse[(b * a.q_heads + h) * Q + q0 + i] = mr + std::log(lr);
          }
        }
      }
    }
  }
}

void attention_backward(const float* q, const float* k, const float* v, const void* sinks, bool sinks_bf16,
                        const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv,
                        float* dsinks_acc, const AttnShape& a, int threads) {
  prof::Scope prof_scope(prof::attention);
  const std::int64_t T = a.seq, Q = a.q_rows(), q_start = a.q_start, hd = a.head_dim, group = a.q_heads / a.kv_heads;
  const std::int64_t W = a.window;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::int64_t tasks = a.batch * a.kv_heads;
#pragma omp parallel num_threads(threads) if (tasks > 1 && Q * T * hd > 4096)
  {
    thread_local std::vector<float> P, dP, dQ, D;  // per-thread tiles, allocated once
    P.resize(kQueryBlock * kKeyBlock);
    dP.resize(kQueryBlock * kKeyBlock);
    dQ.resize(static_cast<std::size_t>(kGroup * kQueryBlock * hd));
    D.resize(kGroup * kQueryBlock);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / a.kv_heads, kvh = task % a.kv_heads;
      const float* kb = k + b * T * a.kv_stride + kvh * hd;
      const float* vb = v + b * T * a.kv_stride + kvh * hd;
      float* dkb = dk + b * T * a.kv_stride + kvh * hd;
      float* dvb = dv + b * T * a.kv_stride + kvh * hd;
      if (!a.add_kv_grads)
        for (std::int64_t t = 0; t < T; ++t) {
          std::fill_n(dkb + t * a.kv_stride, hd, 0.0f);
          std::fill_n(dvb + t * a.kv_stride, hd, 0.0f);
        }
      for (std::int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (std::int64_t g0 = 0; g0 < Q; g0 += kGroup * kQueryBlock) {  // g0: the group's first query row
          const std::int64_t blocks = std::min<std::int64_t>(kGroup, (Q - g0 + kQueryBlock - 1) / kQueryBlock);
          const std::int64_t g_end = q_start + std::min(Q, g0 + kGroup * kQueryBlock);
          for (std::int64_t j = 0; j < blocks; ++j) {
            const std::int64_t q0 = g0 + j * kQueryBlock, qn = std::min(kQueryBlock, Q - q0);
            const float* dob = dout + (b * Q + q0) * a.o_stride + h * hd;
            for (std::int64_t i = 0; i < qn; ++i)
              D[static_cast<std::size_t>(j * kQueryBlock + i)] =
                  simd::dot(dob + i * a.o_stride, out + (b * Q + q0 + i) * a.o_stride + h * hd, hd);
          }
          std::fill(dQ.begin(), dQ.end(), 0.0f);
          for (std::int64_t k0 = first_key_block(q_start + g0, W); k0 < g_end; k0 += kKeyBlock) {
            for (std::int64_t j = 0; j < blocks; ++j) {  // each query block of the group that sees this key block
              const std::int64_t q0 = g0 + j * kQueryBlock, qn = std::min(kQueryBlock, Q - q0), pos0 = q_start + q0;
              if (k0 >= pos0 + qn || k0 < first_key_block(pos0, W)) continue;
              const std::int64_t kn = std::min(kKeyBlock, pos0 + qn - k0);
              const float* qb = q + (b * Q + q0) * a.q_stride + h * hd;
              const float* dob = dout + (b * Q + q0) * a.o_stride + h * hd;
              const float* lb = lse + (b * a.q_heads + h) * Q + q0;
              const float* Dj = D.data() + j * kQueryBlock;
              mm(false, true, qn, kn, hd, qb, a.q_stride, kb + k0 * a.kv_stride, a.kv_stride, false, P.data(),
                 kKeyBlock);
              mm(false, true, qn, kn, hd, dob, a.o_stride, vb + k0 * a.kv_stride, a.kv_stride, false, dP.data(),
                 kKeyBlock);
              for (std::int64_t i = 0; i < qn; ++i) {
                float* p = P.data() + i * kKeyBlock;
                float* dp = dP.data() + i * kKeyBlock;
                const Visible vis = visible(pos0 + i, k0, kn, W);
                for (std::int64_t c = vis.lo; c < vis.hi; ++c) p[c] *= scale;
                if (!vis.empty()) exp_shift(p + vis.lo, vis.hi - vis.lo, lb[i]);  // p = exp(s - lse)
                for (std::int64_t c = vis.lo; c < vis.hi; ++c) dp[c] = p[c] * (dp[c] - Dj[i]) * scale;  // dS, scaled
                std::fill(p, p + vis.lo, 0.0f);  // lo <= hi: visible() clamps it
                std::fill(dp, dp + vis.lo, 0.0f);
                std::fill(p + vis.hi, p + kn, 0.0f);
                std::fill(dp + vis.hi, dp + kn, 0.0f);
              }
              mm(true, false, kn, hd, qn, P.data(), kKeyBlock, dob, a.o_stride, true, dvb + k0 * a.kv_stride,
                 a.kv_stride);
              mm(false, false, qn, hd, kn, dP.data(), kKeyBlock, kb + k0 * a.kv_stride, a.kv_stride, true,
                 dQ.data() + j * kQueryBlock * hd, hd);
              mm(true, false, kn, hd, qn, dP.data(), kKeyBlock, qb, a.q_stride, true, dkb + k0 * a.kv_stride,
                 a.kv_stride);
            }
          }
          for (std::int64_t j = 0; j < blocks; ++j) {
            const std::int64_t q0 = g0 + j * kQueryBlock, qn = std::min(kQueryBlock, Q - q0);
            for (std::int64_t i = 0; i < qn; ++i)
              std::copy_n(dQ.data() + (j * kQueryBlock + i) * hd, hd, dq + (b * Q + q0 + i) * a.q_stride + h * hd);
          }
        }
      }
    }
  }
  if (!sinks || !dsinks_acc) return;
  // d(sink_h) = sum over rows of p_sink * (0 - D): the sink's column has no value, so dP_sink = 0.
  const float* sink = widen_sinks(sinks, a.q_heads, sinks_bf16).data();
#pragma omp parallel for num_threads(threads) schedule(static) if (a.q_heads > 1 && a.batch * Q * hd > 4096)
  for (std::int64_t h = 0; h < a.q_heads; ++h) {
    float acc = 0.0f;
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t i = 0; i < Q; ++i) {
        const std::int64_t row = (b * Q + i);
        const float D = simd::dot(dout + row * a.o_stride + h * hd, out + row * a.o_stride + h * hd, hd);
        acc -= std::exp(sink[h] - lse[(b * a.q_heads + h) * Q + i]) * D;
      }
    dsinks_acc[h] += acc;
  }
}

}  // namespace mt::cpu
