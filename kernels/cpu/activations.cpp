// SwiGLU (Llama MLP) and tanh-GELU (GPT-2 MLP), forward and backward, 8 lanes at a time. exp() is the
// polynomial in simd.hpp; tanh(u) = 1 - 2 / (exp(2u) + 1), accurate to ~1e-7 absolute, which is what
// GELU needs (it multiplies 1 + tanh).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/profile.hpp"

namespace mt::cpu {

namespace {

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

#ifdef MT_AVX2
inline __m256 sigmoid8(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, simd::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
}
inline __m256 tanh8(__m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
  return _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(simd::exp8(_mm256_mul_ps(two, u)), one)));
}
inline __m256 gelu_inner(__m256 x) {  // sqrt(2/pi) * (x + a x^3)
  const __m256 x2 = _mm256_mul_ps(x, x);
  return _mm256_mul_ps(_mm256_set1_ps(kGeluC), _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(kGeluA), x2), x, x));
}

// Applies f to 8-lane groups of [begin, end), padding the tail.
template <int In, int Out, class F>
void lanes(const float* const (&in)[In], float* const (&out)[Out], std::size_t begin, std::size_t end, F f) {
  std::size_t i = begin;
  __m256 a[In], r[Out];
  for (; i + 8 <= end; i += 8) {
    for (int k = 0; k < In; ++k) a[k] = _mm256_loadu_ps(in[k] + i);
    f(a, r);
    for (int k = 0; k < Out; ++k) _mm256_storeu_ps(out[k] + i, r[k]);
  }
  if (i < end) {
    const std::size_t m = end - i;
    for (int k = 0; k < In; ++k) a[k] = simd::load_tail(in[k] + i, m);
    f(a, r);
    for (int k = 0; k < Out; ++k) simd::store_tail(out[k] + i, r[k], m);
  }
}
#endif

}  // namespace

void swiglu_forward(const float* g, const float* u, float* h, std::size_t n, int threads) {
  prof::Scope prof_scope(prof::elementwise);
  parallel_chunks(n, threads, [&](std::size_t b, std::size_t e) {
#ifdef MT_AVX2
    lanes<2, 1>({g, u}, {h}, b, e,
                [](const __m256* a, __m256* r) { r[0] = _mm256_mul_ps(_mm256_mul_ps(a[0], sigmoid8(a[0])), a[1]); });
#else
    for (std::size_t i = b; i < e; ++i) h[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
#endif
  });
}

void swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, std::size_t n,
                     int threads) {
  prof::Scope prof_scope(prof::elementwise);
  parallel_chunks(n, threads, [&](std::size_t b, std::size_t e) {
#ifdef MT_AVX2
    lanes<3, 2>({g, u, dh}, {dg, du}, b, e, [](const __m256* a, __m256* r) {
      const __m256 one = _mm256_set1_ps(1.0f);
      const __m256 sig = sigmoid8(a[0]);
      const __m256 silu = _mm256_mul_ps(a[0], sig);
      // d silu / dg = sig * (1 + g * (1 - sig))
      const __m256 dsilu = _mm256_mul_ps(sig, _mm256_fmadd_ps(a[0], _mm256_sub_ps(one, sig), one));
      r[0] = _mm256_mul_ps(_mm256_mul_ps(a[2], a[1]), dsilu);
      r[1] = _mm256_mul_ps(a[2], silu);
    });
#else
    for (std::size_t i = b; i < e; ++i) {
      const float sig = 1.0f / (1.0f + std::exp(-g[i]));
      dg[i] = dh[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
      du[i] = dh[i] * g[i] * sig;
    }
#endif
  });
}

void clamped_swiglu_forward(const float* g, const float* u, float* h, std::size_t n, float alpha, float limit,
                            int threads) {
  prof::Scope prof_scope(prof::elementwise);
  parallel_chunks(n, threads, [&](std::size_t b, std::size_t e) {
#ifdef MT_AVX2
    const __m256 va = _mm256_set1_ps(alpha), vl = _mm256_set1_ps(limit), one = _mm256_set1_ps(1.0f);
    const __m256 neg_l = _mm256_set1_ps(-limit);
    lanes<2, 1>({g, u}, {h}, b, e, [&](const __m256* a, __m256* r) {
      // min_ps/max_ps return their second operand when either is NaN: the input goes second, so a NaN
      // stays NaN (torch.clamp's, and the scalar path's).
      const __m256 c = _mm256_min_ps(vl, a[0]);
      const __m256 uc = _mm256_max_ps(neg_l, _mm256_min_ps(vl, a[1]));
      const __m256 glu = _mm256_mul_ps(c, sigmoid8(_mm256_mul_ps(va, c)));
      r[0] = _mm256_mul_ps(_mm256_add_ps(uc, one), glu);
    });
#else
    for (std::size_t i = b; i < e; ++i) {
      const float c = std::min(g[i], limit), uc = std::max(std::min(u[i], limit), -limit);
      h[i] = (uc + 1.0f) * (c / (1.0f + std::exp(-alpha * c)));
    }
#endif
  });
}

void clamped_swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, std::size_t n,
                             float alpha, float limit, int threads) {
  prof::Scope prof_scope(prof::elementwise);
  parallel_chunks(n, threads, [&](std::size_t b, std::size_t e) {
#ifdef MT_AVX2
    const __m256 va = _mm256_set1_ps(alpha), vl = _mm256_set1_ps(limit), one = _mm256_set1_ps(1.0f);
    const __m256 neg_l = _mm256_set1_ps(-limit);
    lanes<3, 2>({g, u, dh}, {dg, du}, b, e, [&](const __m256* a, __m256* r) {
      const __m256 c = _mm256_min_ps(vl, a[0]);  // NaN stays NaN, as in the forward
      const __m256 uc = _mm256_max_ps(neg_l, _mm256_min_ps(vl, a[1]));
      const __m256 sig = sigmoid8(_mm256_mul_ps(va, c));
      // d(c sigmoid(alpha c)) / dc = sig (1 + alpha c (1 - sig))
      const __m256 dglu = _mm256_mul_ps(sig, _mm256_fmadd_ps(_mm256_mul_ps(va, c), _mm256_sub_ps(one, sig), one));
      const __m256 g_in = _mm256_cmp_ps(a[0], vl, _CMP_LE_OQ);  // clamp's gradient passes where g <= limit
      const __m256 u_in = _mm256_and_ps(_mm256_cmp_ps(a[1], vl, _CMP_LE_OQ), _mm256_cmp_ps(a[1], neg_l, _CMP_GE_OQ));
      r[0] = _mm256_and_ps(g_in, _mm256_mul_ps(_mm256_mul_ps(a[2], _mm256_add_ps(uc, one)), dglu));
      r[1] = _mm256_and_ps(u_in, _mm256_mul_ps(a[2], _mm256_mul_ps(c, sig)));
    });
#else
    for (std::size_t i = b; i < e; ++i) {
      const float c = std::min(g[i], limit), uc = std::max(std::min(u[i], limit), -limit);
      const float sig = 1.0f / (1.0f + std::exp(-alpha * c));
      dg[i] = g[i] <= limit ? dh[i] * (uc + 1.0f) * sig * (1.0f + alpha * c * (1.0f - sig)) : 0.0f;
      du[i] = u[i] <= limit && u[i] >= -limit ? dh[i] * c * sig : 0.0f;
    }
#endif
  });
}

void gelu_forward(const float* x, float* y, std::size_t n, int threads) {
  prof::Scope prof_scope(prof::elementwise);
  parallel_chunks(n, threads, [&](std::size_t b, std::size_t e) {
#ifdef MT_AVX2
    lanes<1, 1>({x}, {y}, b, e, [](const __m256* a, __m256* r) {
      const __m256 t = tanh8(gelu_inner(a[0]));
      r[0] = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), a[0]), _mm256_add_ps(_mm256_set1_ps(1.0f), t));
    });
#else
    for (std::size_t i = b; i < e; ++i)
      y[i] = 0.5f * x[i] * (1.0f + std::tanh(kGeluC * (x[i] + kGeluA * x[i] * x[i] * x[i])));
#endif
  });
}

void gelu_backward(const float* x, const float* dy, float* dx, std::size_t n, int threads) {
  prof::Scope prof_scope(prof::elementwise);
  parallel_chunks(n, threads, [&](std::size_t b, std::size_t e) {
#ifdef MT_AVX2
    lanes<2, 1>({x, dy}, {dx}, b, e, [](const __m256* a, __m256* r) {
      const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
      const __m256 xv = a[0];
      const __m256 t = tanh8(gelu_inner(xv));
      const __m256 x2 = _mm256_mul_ps(xv, xv);
      // d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)
      const __m256 du = _mm256_mul_ps(_mm256_set1_ps(kGeluC), _mm256_fmadd_ps(_mm256_set1_ps(3.0f * kGeluA), x2, one));
      const __m256 sech2 = _mm256_fnmadd_ps(t, t, one);
      const __m256 d = _mm256_fmadd_ps(_mm256_mul_ps(half, xv), _mm256_mul_ps(sech2, du),
                                       _mm256_mul_ps(half, _mm256_add_ps(one, t)));
      r[0] = _mm256_mul_ps(a[1], d);
    });
#else
    for (std::size_t i = b; i < e; ++i) {
      const float t = std::tanh(kGeluC * (x[i] + kGeluA * x[i] * x[i] * x[i]));
      const float d = 0.5f * (1.0f + t) + 0.5f * x[i] * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * x[i] * x[i]);
      dx[i] = dy[i] * d;
    }
#endif
  });
}

}  // namespace mt::cpu
