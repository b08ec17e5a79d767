// Mixture of experts on the CPU: the router's choice and weights, the grouping of a token's choices by
// expert, and the gather and combine between token rows and expert rows. Every loop owns its outputs by
// row (a token or an expert row), so results never depend on the thread count; the sums over a token's
// k choices run in j order. The grouped products themselves are linear products (Ops' default loop).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.hpp"

namespace mt::cpu {

namespace {

// The k best of v[0..E) into idx (descending, ties to the lower index): a partial selection sort, as k is
// small (2..8) and E at most a few hundred.
void top_k(const float* v, std::int64_t E, std::int64_t k, std::int32_t* idx) {
  for (std::int64_t j = 0; j < k; ++j) {
    std::int64_t best = -1;
    for (std::int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (std::int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
      if (taken) continue;
      if (best < 0 || v[e] > v[best]) best = e;  // strict: an equal later value loses to the lower index
    }
    idx[j] = static_cast<std::int32_t>(best);
  }
}

// Softmax of the E logits of one token into p (fp32, max subtracted, summed in expert order).
void softmax_row(const float* l, std::int64_t E, float* p) {
  float m = l[0];
  for (std::int64_t e = 1; e < E; ++e) m = std::max(m, l[e]);
  float z = 0.0f;
  for (std::int64_t e = 0; e < E; ++e) z += (p[e] = std::exp(l[e] - m));
  for (std::int64_t e = 0; e < E; ++e) p[e] /= z;
}

// A thread's room for one token's probabilities, grown once.
std::vector<float>& probabilities(std::int64_t E) {
  thread_local std::vector<float> p;
  if (p.size() < static_cast<std::size_t>(E)) p.resize(static_cast<std::size_t>(E));
  return p;
}
// ... and for the row the load-balancing loss takes a softmax of (gpt-oss's scattered scores).
std::vector<float>& balance_row(std::int64_t E) {
  thread_local std::vector<float> r;
  if (r.size() < static_cast<std::size_t>(E)) r.resize(static_cast<std::size_t>(E));
  return r;
}

// Tokens per partial sum of the load-balancing statistics (the CUDA kernel uses the same chunks).
constexpr std::int64_t kBalanceChunk = 256;

// The router output the load-balancing loss takes a softmax of (transformers' "router_logits"): the logits
// themselves, or gpt-oss's router scores (the k weights scattered into zeros).
const float* balance_input(const float* logits, const std::int32_t* expert, const float* weight, const RouteShape& s,
                           std::int64_t n, float* row) {
  const std::int64_t E = s.experts, k = s.top_k;
  if (s.kind == RouterKind::softmax_topk) return logits + n * E;
  std::fill(row, row + E, 0.0f);
  for (std::int64_t j = 0; j < k; ++j) row[expert[n * k + j]] = weight[n * k + j];
  return row;
}

}  // namespace

void moe_balance_stats(const float* logits, const std::int32_t* expert, const float* weight, const RouteShape& s,
                       float* prob_sums, int threads) {
  const std::int64_t E = s.experts, chunks = (s.tokens + kBalanceChunk - 1) / kBalanceChunk;
  // Per expert: each chunk of kBalanceChunk tokens summed in token order, then the chunks in order (a
  // fixed tree whatever the thread count; chunks x E floats, not tokens x E).
  thread_local std::vector<float> partial;  // grown once per shape: nothing allocates in steady state
  partial.assign(static_cast<std::size_t>(chunks * E), 0.0f);
#pragma omp parallel num_threads(threads)
  {
    std::vector<float>& row = balance_row(E);
    std::vector<float>& p = probabilities(E);
#pragma omp for schedule(static)
    for (std::int64_t ch = 0; ch < chunks; ++ch) {
      float* acc = partial.data() + ch * E;
      for (std::int64_t n = ch * kBalanceChunk; n < std::min(s.tokens, (ch + 1) * kBalanceChunk); ++n) {
        softmax_row(balance_input(logits, expert, weight, s, n, row.data()), E, p.data());
        for (std::int64_t e = 0; e < E; ++e) acc[e] += p[static_cast<std::size_t>(e)];
      }
    }
  }
  for (std::int64_t e = 0; e < E; ++e) prob_sums[e] = 0.0f;
  for (std::int64_t ch = 0; ch < chunks; ++ch)
    for (std::int64_t e = 0; e < E; ++e) prob_sums[e] += partial[static_cast<std::size_t>(ch * E + e)];
}

void moe_balance_backward(const float* logits, const std::int32_t* expert, const float* weight, const float* grad,
                          const RouteShape& s, float* dlogits, float* dweight, int threads) {
  const std::int64_t E = s.experts, k = s.top_k;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float>& row = balance_row(E);
    std::vector<float>& p = probabilities(E);
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < s.tokens; ++n) {
      softmax_row(balance_input(logits, expert, weight, s, n, row.data()), E, p.data());
      float t = 0.0f;  // p . g, in expert order
      for (std::int64_t e = 0; e < E; ++e) t += p[static_cast<std::size_t>(e)] * grad[e];
      if (s.kind == RouterKind::softmax_topk) {
        for (std::int64_t e = 0; e < E; ++e) dlogits[n * E + e] += p[static_cast<std::size_t>(e)] * (grad[e] - t);
      } else {  // through the scores: only the chosen entries are the weights
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int32_t e = expert[n * k + j];
          dweight[n * k + j] += p[static_cast<std::size_t>(e)] * (grad[e] - t);
        }
      }
    }
  }
}

void moe_route(const float* logits, const RouteShape& s, std::int32_t* expert, float* weight, int threads) {
  const std::int64_t E = s.experts, k = s.top_k;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float>& p = probabilities(E);
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < s.tokens; ++n) {
      const float* l = logits + n * E;
      std::int32_t* idx = expert + n * k;
      float* w = weight + n * k;
      if (s.kind == RouterKind::softmax_topk) {
        softmax_row(l, E, p.data());
        top_k(p.data(), E, k, idx);
        float sum = 0.0f;
        for (std::int64_t j = 0; j < k; ++j) sum += (w[j] = p[idx[j]]);
        if (s.renormalize)
          for (std::int64_t j = 0; j < k; ++j) w[j] /= sum;
      } else {  // topk_softmax: the k largest logits, softmax over them (the first is their max)
        top_k(l, E, k, idx);
        float z = 0.0f;
        for (std::int64_t j = 0; j < k; ++j) z += (w[j] = std::exp(l[idx[j]] - l[idx[0]]));
        for (std::int64_t j = 0; j < k; ++j) w[j] /= z;
      }
    }
  }
}

void moe_route_backward(const float* logits, const std::int32_t* expert, const float* weight, const float* dweight,
                        float* dlogits, const RouteShape& s, int threads) {
  const std::int64_t E = s.experts, k = s.top_k;
  const bool over_chosen = s.kind == RouterKind::topk_softmax || s.renormalize;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float>& p = probabilities(E);
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < s.tokens; ++n) {
      const std::int32_t* idx = expert + n * k;
      const float* w = weight + n * k;
      const float* dw = dweight + n * k;
      float* dl = dlogits + n * E;
      float wdw = 0.0f;  // sum_j w_j dw_j
      for (std::int64_t j = 0; j < k; ++j) wdw += w[j] * dw[j];
      if (over_chosen) {
        // w is a softmax over the chosen logits: dl_chosen = w (dw - w . dw), the others 0.
        std::fill(dl, dl + E, 0.0f);
        for (std::int64_t j = 0; j < k; ++j) dl[idx[j]] = w[j] * (dw[j] - wdw);
      } else {
        // w_j = p_{idx_j} of the softmax over all experts: dl_m = p_m ([m chosen] dw - w . dw).
        softmax_row(logits + n * E, E, p.data());
        for (std::int64_t e = 0; e < E; ++e) dl[e] = -p[e] * wdw;
        for (std::int64_t j = 0; j < k; ++j) dl[idx[j]] += p[idx[j]] * dw[j];
      }
    }
  }
}

void moe_dispatch(const std::int32_t* expert, const RouteShape& s, std::int32_t* order, std::int32_t* slot_pos,
                  std::int64_t* offsets) {
  const std::int64_t E = s.experts, P = s.choices();
  std::fill(offsets, offsets + E + 1, std::int64_t{0});
  for (std::int64_t q = 0; q < P; ++q) ++offsets[expert[q] + 1];
  for (std::int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  // A counting sort in slot order: each expert's rows come out by token (a token picks an expert once).
  thread_local std::vector<std::int64_t> next;
  next.assign(offsets, offsets + E);
  for (std::int64_t q = 0; q < P; ++q) {
    const std::int64_t p = next[static_cast<std::size_t>(expert[q])]++;
    order[p] = static_cast<std::int32_t>(q);
    slot_pos[q] = static_cast<std::int32_t>(p);
  }
}

void moe_gather(const float* x, const std::int32_t* order, const RouteShape& s, std::int64_t d, float* xe,
                int threads) {
  const std::int64_t P = s.choices(), k = s.top_k;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t p = 0; p < P; ++p)
    std::memcpy(xe + p * d, x + (order[p] / k) * d, static_cast<std::size_t>(d) * sizeof(float));
}

void moe_gather_backward(const float* dxe, const std::int32_t* slot_pos, const RouteShape& s, std::int64_t d, float* dx,
                         bool add, int threads) {
  const std::int64_t k = s.top_k;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t n = 0; n < s.tokens; ++n) {
    float* out = dx + n * d;
    for (std::int64_t j = 0; j < k; ++j) {
      const float* src = dxe + static_cast<std::int64_t>(slot_pos[n * k + j]) * d;
      if (j == 0 && !add)
        std::memcpy(out, src, static_cast<std::size_t>(d) * sizeof(float));
      else
        for (std::int64_t i = 0; i < d; ++i) out[i] += src[i];
    }
  }
}

void moe_combine(const float* ye, const std::int32_t* slot_pos, const float* weight, const RouteShape& s,
                 std::int64_t d, float* y, int threads) {
  const std::int64_t k = s.top_k;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t n = 0; n < s.tokens; ++n) {
    float* out = y + n * d;
    for (std::int64_t j = 0; j < k; ++j) {
      const float w = weight[n * k + j];
      const float* src = ye + static_cast<std::int64_t>(slot_pos[n * k + j]) * d;
      if (j == 0)
        for (std::int64_t i = 0; i < d; ++i) out[i] = w * src[i];
      else
        for (std::int64_t i = 0; i < d; ++i) out[i] += w * src[i];
    }
  }
}

void moe_combine_backward(const float* dy, const float* ye, const std::int32_t* slot_pos, const float* weight,
                          const RouteShape& s, std::int64_t d, float* dye, float* dweight, int threads) {
  const std::int64_t k = s.top_k;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t n = 0; n < s.tokens; ++n) {
    const float* g = dy + n * d;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t p = slot_pos[n * k + j];
      const float w = weight[n * k + j];
      const float* src = ye + p * d;
      float* out = dye + p * d;
      float dot = 0.0f;
      for (std::int64_t i = 0; i < d; ++i) {
        out[i] = w * g[i];
        dot += g[i] * src[i];
      }
      dweight[n * k + j] = dot;
    }
  }
}

}  // namespace mt::cpu
