// The plain reference loops beside the fast CPU kernels, written as templates so the tests can run
// them in double (finite-difference gradient checks) and in float (the fast kernels must match them).
// Readability over speed: one formula per line, no threading, no vector intrinsics, no tiling.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/op_shapes.hpp"

namespace mt::ref {

using i64 = std::int64_t;

// transformers' inv_freq [hd/2] for a forward over `seq` positions, every rope_scaling type, in T
// precision throughout (the formulas of modeling_rope_utils.py read as math, not its fp32 order);
// returns the attention scaling cos and sin are multiplied by (yarn's; 1 for the others).
template <class T>
T rope_inv_freq(const RopeParams& p, i64 seq, i64 hd, std::vector<T>& inv) {
  const T pi = T(3.14159265358979323846), dim = T(hd);
  inv.assign(static_cast<std::size_t>(hd / 2), T(0));
  T base = T(p.theta);
  if (p.kind == RopeKind::dynamic && seq > p.original_max_position)
    base *= std::pow(T(p.factor) * T(seq) / T(p.original_max_position) - (T(p.factor) - T(1)), dim / (dim - T(2)));
  T low = 0, high = 0;
  if (p.kind == RopeKind::yarn) {
    auto correction_dim = [&](T rot) {
      return dim * std::log(T(p.original_max_position) / (rot * T(2) * pi)) / (T(2) * std::log(T(p.theta)));
    };
    low = correction_dim(T(p.beta_fast)), high = correction_dim(T(p.beta_slow));
    if (p.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, T(0)), high = std::min(high, dim - T(1));
    if (low == high) high += T(0.001);
  }
  for (i64 i = 0; i < hd / 2; ++i) {
    T f = T(1) / std::pow(base, T(2 * i) / dim);
    switch (p.kind) {
      case RopeKind::plain:
      case RopeKind::dynamic:
        break;
      case RopeKind::linear:
        f /= T(p.factor);
        break;
      case RopeKind::llama3: {
        const T old_len = T(p.original_max_position), wavelen = T(2) * pi / f;
        const T lo = T(p.low_freq_factor), hi = T(p.high_freq_factor);
        if (wavelen > old_len / lo) {
          f /= T(p.factor);
        } else if (!(wavelen < old_len / hi)) {
          const T smooth = (old_len / wavelen - lo) / (hi - lo);
          f = (T(1) - smooth) * f / T(p.factor) + smooth * f;
        }
        break;
      }
      case RopeKind::yarn: {
        // extrapolated (1) below the range, interpolated (f / factor) above it, a linear ramp between
        const T ramp = std::min(std::max((T(i) - low) / (high - low), T(0)), T(1));
        f = f / T(p.factor) * ramp + f * (T(1) - ramp);
        break;
      }
    }
    inv[static_cast<std::size_t>(i)] = f;
  }
  return p.kind == RopeKind::yarn ? T(p.attention_scaling) : T(1);
}

// y[N, out] = x[N, in] W^T + b
template <class T>
void linear(const T* x, const T* W, const T* b, T* y, i64 N, i64 in, i64 out) {
  for (i64 r = 0; r < N; ++r)
    for (i64 o = 0; o < out; ++o) {
      T acc = b ? b[o] : T(0);
      for (i64 i = 0; i < in; ++i) acc += x[r * in + i] * W[o * in + i];
      y[r * out + o] = acc;
    }
}
// dx += dy W ; dW += dy^T x ; db += colsum(dy)
template <class T>
void linear_backward(const T* x, const T* W, const T* dy, T* dx, T* dW, T* db, i64 N, i64 in, i64 out) {
  for (i64 r = 0; r < N; ++r)
    for (i64 o = 0; o < out; ++o) {
      const T g = dy[r * out + o];
      if (db) db[o] += g;
      for (i64 i = 0; i < in; ++i) {
        dx[r * in + i] += g * W[o * in + i];
        dW[o * in + i] += g * x[r * in + i];
      }
    }
}

template <class T>
void rmsnorm(const T* x, const T* w, T* y, i64 N, i64 D, T eps) {
  for (i64 r = 0; r < N; ++r) {
    T ss = 0;
    for (i64 j = 0; j < D; ++j) ss += x[r * D + j] * x[r * D + j];
    const T s = T(1) / std::sqrt(ss / T(D) + eps);
    for (i64 j = 0; j < D; ++j) y[r * D + j] = w[j] * (x[r * D + j] * s);
  }
}
// dx += ..., dw += ...
template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, i64 N, i64 D, T eps) {
  for (i64 r = 0; r < N; ++r) {
    T ss = 0;
    for (i64 j = 0; j < D; ++j) ss += x[r * D + j] * x[r * D + j];
    const T s = T(1) / std::sqrt(ss / T(D) + eps);
    T dot = 0;  // sum_j dy_j w_j x_j
    for (i64 j = 0; j < D; ++j) dot += dy[r * D + j] * w[j] * x[r * D + j];
    for (i64 j = 0; j < D; ++j) {
      dx[r * D + j] += s * dy[r * D + j] * w[j] - s * s * s * x[r * D + j] * dot / T(D);
      dw[j] += dy[r * D + j] * x[r * D + j] * s;
    }
  }
}

template <class T>
void layernorm(const T* x, const T* w, const T* b, T* y, i64 N, i64 D, T eps) {
  for (i64 r = 0; r < N; ++r) {
    T mean = 0, var = 0;
    for (i64 j = 0; j < D; ++j) mean += x[r * D + j];
    mean /= T(D);
    for (i64 j = 0; j < D; ++j) var += (x[r * D + j] - mean) * (x[r * D + j] - mean);
    const T s = T(1) / std::sqrt(var / T(D) + eps);
    for (i64 j = 0; j < D; ++j) y[r * D + j] = (x[r * D + j] - mean) * s * w[j] + b[j];
  }
}
template <class T>
void layernorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, i64 N, i64 D, T eps) {
  for (i64 r = 0; r < N; ++r) {
    T mean = 0, var = 0;
    for (i64 j = 0; j < D; ++j) mean += x[r * D + j];
    mean /= T(D);
    for (i64 j = 0; j < D; ++j) var += (x[r * D + j] - mean) * (x[r * D + j] - mean);
    const T s = T(1) / std::sqrt(var / T(D) + eps);
    T mg = 0, mgx = 0;
    for (i64 j = 0; j < D; ++j) {
      const T xhat = (x[r * D + j] - mean) * s;
      mg += dy[r * D + j] * w[j];
      mgx += dy[r * D + j] * w[j] * xhat;
    }
    mg /= T(D);
    mgx /= T(D);
    for (i64 j = 0; j < D; ++j) {
      const T xhat = (x[r * D + j] - mean) * s;
      dx[r * D + j] += s * (dy[r * D + j] * w[j] - mg - xhat * mgx);
      dw[j] += dy[r * D + j] * xhat;
      db[j] += dy[r * D + j];
    }
  }
}

// Rotary embedding with explicit cos/sin tables [seq, hd/2]; in place on x[rows, heads*hd] (row stride
// heads*hd unless given). inverse = the transpose (backward). positions (documents): row r's table row.
template <class T>
void rope(T* x, i64 rows, i64 seq, i64 heads, i64 hd, i64 stride, const T* cos_t, const T* sin_t, bool inverse,
          const std::int32_t* positions = nullptr) {
  const i64 half = hd / 2;
  for (i64 r = 0; r < rows; ++r)
    for (i64 h = 0; h < heads; ++h) {
      T* v = x + r * stride + h * hd;
      const i64 t = positions ? positions[r] : r % seq;
      for (i64 i = 0; i < half; ++i) {
        const T c = cos_t[t * half + i], s = inverse ? -sin_t[t * half + i] : sin_t[t * half + i];
        const T a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
}

// Naive causal GQA attention: the full softmax row per query. q_start > 0: the queries are only
// positions q_start..S-1 of each sequence (q, out, dq hold S - q_start rows per sequence; k, v S rows).
// window > 0: position p sees keys p - window + 1 .. p. sinks (null: none): one logit per query head,
// an extra softmax column without a value (gpt-oss), computed as transformers does: concatenated to the
// row, the row's max subtracted, softmax, the column dropped. positions (documents, [B * S]): position p
// of sequence b sees no key before p - positions[b * S + p] (its document's start).
template <class T>
void attention(const T* q, const T* k, const T* v, T* out, i64 B, i64 S, i64 Hq, i64 Hkv, i64 hd, i64 qs, i64 kvs,
               i64 os, i64 q_start = 0, i64 window = 0, const T* sinks = nullptr,
               const std::int32_t* positions = nullptr) {
  const T scale = T(1) / std::sqrt(T(hd));
  const i64 Q = S - q_start;
  std::vector<T> p(static_cast<std::size_t>(S));
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < Hq; ++h) {
      const i64 kh = h / (Hq / Hkv);
      for (i64 t = 0; t < Q; ++t) {
        const i64 pos = q_start + t;
        i64 first = window > 0 ? std::max<i64>(0, pos - window + 1) : 0;
        if (positions) first = std::max<i64>(first, pos - positions[b * S + pos]);
        T mx = sinks ? sinks[h] : -std::numeric_limits<T>::infinity(), sum = 0;
        for (i64 j = first; j <= pos; ++j) {
          T dot = 0;
          for (i64 i = 0; i < hd; ++i) dot += q[(b * Q + t) * qs + h * hd + i] * k[(b * S + j) * kvs + kh * hd + i];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        for (i64 j = first; j <= pos; ++j) sum += (p[j] = std::exp(p[j] - mx));
        if (sinks) sum += std::exp(sinks[h] - mx);
        for (i64 i = 0; i < hd; ++i) {
          T acc = 0;
          for (i64 j = first; j <= pos; ++j) acc += p[j] / sum * v[(b * S + j) * kvs + kh * hd + i];
          out[(b * Q + t) * os + h * hd + i] = acc;
        }
      }
    }
}
// dq, dk, dv += ... (q_start, window, sinks and positions as in attention); dsinks += with sinks
template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* dout, T* dq, T* dk, T* dv, i64 B, i64 S, i64 Hq,
                        i64 Hkv, i64 hd, i64 qs, i64 kvs, i64 os, i64 q_start = 0, i64 window = 0,
                        const T* sinks = nullptr, T* dsinks = nullptr, const std::int32_t* positions = nullptr) {
  const T scale = T(1) / std::sqrt(T(hd));
  const i64 Q = S - q_start;
  std::vector<T> p(static_cast<std::size_t>(S)), dp(static_cast<std::size_t>(S));
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < Hq; ++h) {
      const i64 kh = h / (Hq / Hkv);
      for (i64 t = 0; t < Q; ++t) {
        const i64 pos = q_start + t;
        i64 first = window > 0 ? std::max<i64>(0, pos - window + 1) : 0;
        if (positions) first = std::max<i64>(first, pos - positions[b * S + pos]);
        const T* qi = q + (b * Q + t) * qs + h * hd;
        const T* doi = dout + (b * Q + t) * os + h * hd;
        T mx = sinks ? sinks[h] : -std::numeric_limits<T>::infinity(), sum = 0;
        for (i64 j = first; j <= pos; ++j) {
          T dot = 0;
          for (i64 i = 0; i < hd; ++i) dot += qi[i] * k[(b * S + j) * kvs + kh * hd + i];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        for (i64 j = first; j <= pos; ++j) sum += (p[j] = std::exp(p[j] - mx));
        if (sinks) sum += std::exp(sinks[h] - mx);
        T pdp = 0;  // the sink's column has no value: its dp is 0
        for (i64 j = first; j <= pos; ++j) {
          p[j] /= sum;
          dp[j] = 0;
          for (i64 i = 0; i < hd; ++i) dp[j] += doi[i] * v[(b * S + j) * kvs + kh * hd + i];
          pdp += p[j] * dp[j];
        }
        if (sinks && dsinks) dsinks[h] -= std::exp(sinks[h] - mx) / sum * pdp;
        for (i64 j = first; j <= pos; ++j) {
          const T ds = p[j] * (dp[j] - pdp) * scale;
          for (i64 i = 0; i < hd; ++i) {
            dv[(b * S + j) * kvs + kh * hd + i] += p[j] * doi[i];
            dq[(b * Q + t) * qs + h * hd + i] += ds * k[(b * S + j) * kvs + kh * hd + i];
            dk[(b * S + j) * kvs + kh * hd + i] += ds * qi[i];
          }
        }
      }
    }
}

template <class T>
T silu(T g) {
  return g / (T(1) + std::exp(-g));
}
template <class T>
void swiglu(const T* g, const T* u, T* h, i64 n) {
  for (i64 i = 0; i < n; ++i) h[i] = silu(g[i]) * u[i];
}
template <class T>
void swiglu_backward(const T* g, const T* u, const T* dh, T* dg, T* du, i64 n) {
  for (i64 i = 0; i < n; ++i) {
    const T sig = T(1) / (T(1) + std::exp(-g[i]));
    dg[i] += dh[i] * u[i] * sig * (T(1) + g[i] * (T(1) - sig));
    du[i] += dh[i] * silu(g[i]);
  }
}

// gpt-oss's clamped SwiGLU (ops.hpp): h = (clamp(u, -L, L) + 1) * c * sigmoid(alpha c), c = min(g, L).
template <class T>
void clamped_swiglu(const T* g, const T* u, T* h, i64 n, T alpha, T limit) {
  for (i64 i = 0; i < n; ++i) {
    const T c = std::min(g[i], limit), uc = std::max(std::min(u[i], limit), -limit);
    h[i] = (uc + T(1)) * c / (T(1) + std::exp(-alpha * c));
  }
}
template <class T>
void clamped_swiglu_backward(const T* g, const T* u, const T* dh, T* dg, T* du, i64 n, T alpha, T limit) {
  for (i64 i = 0; i < n; ++i) {
    const T c = std::min(g[i], limit), uc = std::max(std::min(u[i], limit), -limit);
    const T sig = T(1) / (T(1) + std::exp(-alpha * c));
    if (g[i] <= limit) dg[i] += dh[i] * (uc + T(1)) * sig * (T(1) + alpha * c * (T(1) - sig));
    if (u[i] <= limit && u[i] >= -limit) du[i] += dh[i] * c * sig;
  }
}

template <class T>
T gelu(T x) {
  const T c = std::sqrt(T(2) / T(3.14159265358979323846));
  return T(0.5) * x * (T(1) + std::tanh(c * (x + T(0.044715) * x * x * x)));
}
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, i64 n) {
  const T c = std::sqrt(T(2) / T(3.14159265358979323846));
  for (i64 i = 0; i < n; ++i) {
    const T u = c * (x[i] + T(0.044715) * x[i] * x[i] * x[i]);
    const T t = std::tanh(u);
    dx[i] +=
        dy[i] * (T(0.5) * (T(1) + t) + T(0.5) * x[i] * (T(1) - t * t) * c * (T(1) + T(3) * T(0.044715) * x[i] * x[i]));
  }
}

// Returns the sum of losses; dlogits (may be null) = softmax - onehot for counted rows.
template <class T>
T cross_entropy(const T* logits, const std::int32_t* targets, T* dlogits, i64 N, i64 V) {
  T total = 0;
  for (i64 r = 0; r < N; ++r) {
    const T* x = logits + r * V;
    if (targets[r] < 0) {
      if (dlogits)
        for (i64 j = 0; j < V; ++j) dlogits[r * V + j] = 0;
      continue;
    }
    T mx = x[0], sum = 0;
    for (i64 j = 1; j < V; ++j) mx = std::max(mx, x[j]);
    for (i64 j = 0; j < V; ++j) sum += std::exp(x[j] - mx);
    total += mx + std::log(sum) - x[targets[r]];
    if (dlogits) {
      for (i64 j = 0; j < V; ++j) dlogits[r * V + j] = std::exp(x[j] - mx) / sum;
      dlogits[r * V + targets[r]] -= T(1);
    }
  }
  return total;
}

// ---- Mixture-of-experts routing (the contracts of moe_route / moe_route_backward in ops.hpp) ----

// The router's k choices of each of N tokens over E logits, and their weights, in T.
template <class T>
void moe_route(const T* logits, const RouteShape& s, std::int32_t* expert, T* weight) {
  const i64 E = s.experts, k = s.top_k;
  std::vector<T> p(static_cast<std::size_t>(E));
  std::vector<std::int32_t> idx(static_cast<std::size_t>(E));
  for (i64 n = 0; n < s.tokens; ++n) {
    const T* l = logits + n * E;
    T mx = l[0], z = 0;
    for (i64 e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    for (i64 e = 0; e < E; ++e) z += std::exp(l[e] - mx);
    for (i64 e = 0; e < E; ++e) p[e] = s.kind == RouterKind::softmax_topk ? std::exp(l[e] - mx) / z : l[e];
    for (i64 e = 0; e < E; ++e) idx[e] = static_cast<std::int32_t>(e);
    std::stable_sort(idx.begin(), idx.end(), [&](std::int32_t a, std::int32_t b) { return p[a] > p[b]; });
    T sum = 0, zk = 0;
    for (i64 j = 0; j < k; ++j) sum += p[idx[j]], zk += std::exp(l[idx[j]] - l[idx[0]]);
    for (i64 j = 0; j < k; ++j) {
      expert[n * k + j] = idx[j];
      if (s.kind == RouterKind::topk_softmax)
        weight[n * k + j] = std::exp(l[idx[j]] - l[idx[0]]) / zk;
      else
        weight[n * k + j] = s.renormalize ? p[idx[j]] / sum : p[idx[j]];
    }
  }
}

// The load-balancing loss (transformers' load_balancing_loss_func without an attention mask) over the
// router outputs z of `layers` MoE layers of N tokens each (z_l [N, E], the input its softmax takes:
// the logits, or gpt-oss's scores): R = layers N rows, p = softmax(z), f_e = (rows choosing e among
// their top k of p) / R, P_e = sum of p_e / R; loss = E sum_e f_e P_e. The choices count as constants
// (a one-hot), so the gradient is d loss / d z_r = (E / R) p_r (f - p_r . f) with f as given; returned
// via dz (added into, [layers N, E]) when non-null.
template <class T>
T load_balancing_loss(const std::vector<const T*>& z, i64 N, i64 E, i64 k, T* dz = nullptr) {
  const i64 R = static_cast<i64>(z.size()) * N;
  std::vector<T> p(static_cast<std::size_t>(R * E)), f(static_cast<std::size_t>(E), T(0)), P(f);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(E));
  for (std::size_t l = 0; l < z.size(); ++l)
    for (i64 n = 0; n < N; ++n) {
      const T* row = z[l] + n * E;
      T* pr = p.data() + (static_cast<i64>(l) * N + n) * E;
      T mx = row[0], sum = 0;
      for (i64 e = 1; e < E; ++e) mx = std::max(mx, row[e]);
      for (i64 e = 0; e < E; ++e) sum += (pr[e] = std::exp(row[e] - mx));
      for (i64 e = 0; e < E; ++e) pr[e] /= sum, P[e] += pr[e] / T(R);
      for (i64 e = 0; e < E; ++e) idx[e] = static_cast<std::int32_t>(e);
      std::stable_sort(idx.begin(), idx.end(), [&](std::int32_t a, std::int32_t b) { return pr[a] > pr[b]; });
      for (i64 j = 0; j < k; ++j) f[idx[j]] += T(1) / T(R);
    }
  T loss = 0;
  for (i64 e = 0; e < E; ++e) loss += f[e] * P[e];
  if (dz)
    for (i64 r = 0; r < R; ++r) {
      const T* pr = p.data() + r * E;
      T t = 0;
      for (i64 e = 0; e < E; ++e) t += pr[e] * f[e];
      for (i64 e = 0; e < E; ++e) dz[r * E + e] += T(E) / T(R) * pr[e] * (f[e] - t);
    }
  return T(E) * loss;
}

// dlogits[N, E] (overwritten) from dweight, the choices held fixed: the chain rule through the full
// softmax Jacobian, dp_a / dl_m = p_a (delta_am - p_m), and the renormalisation's quotient rule (the
// fast kernels use the closed forms these reduce to).
template <class T>
void moe_route_backward(const T* logits, const std::int32_t* expert, const T* dweight, T* dlogits,
                        const RouteShape& s) {
  const i64 E = s.experts, k = s.top_k;
  std::vector<T> p(static_cast<std::size_t>(E));
  for (i64 n = 0; n < s.tokens; ++n) {
    const T* l = logits + n * E;
    const std::int32_t* idx = expert + n * k;
    const T* dw = dweight + n * k;
    T* dl = dlogits + n * E;
    // p: the softmax the weights come from (over all experts, or over the chosen ones for topk_softmax)
    const bool chosen_only = s.kind == RouterKind::topk_softmax;
    T mx = l[idx[0]], z = 0;
    for (i64 e = 0; e < E; ++e) mx = std::max(mx, l[e]);
    for (i64 e = 0; e < E; ++e) p[e] = 0;
    if (chosen_only) {
      for (i64 j = 0; j < k; ++j) z += std::exp(l[idx[j]] - mx);
      for (i64 j = 0; j < k; ++j) p[idx[j]] = std::exp(l[idx[j]] - mx) / z;
    } else {
      for (i64 e = 0; e < E; ++e) z += std::exp(l[e] - mx);
      for (i64 e = 0; e < E; ++e) p[e] = std::exp(l[e] - mx) / z;
    }
    const bool renorm = !chosen_only && s.renormalize;
    T S = 0;
    for (i64 j = 0; j < k; ++j) S += p[idx[j]];
    for (i64 m = 0; m < E; ++m) {
      if (chosen_only && p[m] == T(0)) {
        dl[m] = 0;
        continue;
      }
      auto dp = [&](i64 a) { return p[a] * ((a == m ? T(1) : T(0)) - p[m]); };  // dp_a / dl_m
      T dS = 0;
      for (i64 j = 0; j < k; ++j) dS += dp(idx[j]);
      T acc = 0;
      for (i64 j = 0; j < k; ++j) {
        const T dwj = renorm ? dp(idx[j]) / S - p[idx[j]] * dS / (S * S) : dp(idx[j]);
        acc += dw[j] * dwj;
      }
      dl[m] = acc;
    }
  }
}

}  // namespace mt::ref
