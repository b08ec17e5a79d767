// CPU AdamW: a reference loop and the fast kernel. The fast kernel is memory-bound (28 bytes per
// parameter), so the aim is to keep both cores streaming: 8 lanes per instruction, no errno checks on
// sqrt, and one contiguous chunk per thread.
#include "kernels/adamw.hpp"

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/cpu_info.hpp"
#include "kernels/master_halves.hpp"

#include <algorithm>
#include <cmath>

#include <omp.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MT_ADAMW_AVX2 1
#endif

namespace mt::cpu {

void adamw_reference(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWStep& s) {
  for (std::size_t i = 0; i < n; ++i) {
    const float grad = g[i] * s.grad_scale;
    m[i] = s.beta1 * m[i] + s.one_minus_beta1 * grad;
    v[i] = s.beta2 * v[i] + s.one_minus_beta2 * grad * grad;
    const float denom = std::sqrt(v[i]) * s.inv_sqrt_bias2 + s.eps;
    p[i] = p[i] * s.decay_factor - s.step_size * (m[i] / denom);
  }
}

namespace {

// One element with the same fused operations as one lane of the vector loop, so an element gives the
// same bits whether it lands in a vector body or a scalar tail.
inline void adamw_one(float& p, float g, float& m, float& v, const AdamWStep& s) {
  const float grad = g * s.grad_scale;
  m = std::fma(s.one_minus_beta1, grad, s.beta1 * m);
  v = std::fma(s.one_minus_beta2 * grad, grad, s.beta2 * v);
  const float denom = std::fma(std::sqrt(v), s.inv_sqrt_bias2, s.eps);
  p = std::fma(-s.step_size, m / denom, p * s.decay_factor);
}

#ifdef MT_ADAMW_AVX2
// RNE of 8 floats to bf16 in integer arithmetic (bf16_round_reference lane by lane: denormals kept,
// NaN quieted), packed to 8 x 16 bits.
inline __m128i bf16_round8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
  // packus works within 128-bit lanes: [a0..3 b0..3 | a4..7 b4..7] with b = a, then take qwords 0 and 2
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}
#endif

#ifdef MT_ADAMW_AVX2
// The update of 8 lanes, adamw_one's fused operations: every AVX2 loop calls this one, so they agree bit for bit.
struct AdamW8 {
  __m256 b1, b2, c1, c2, eps, decay, neg_step, isb2, scale;
  explicit AdamW8(const AdamWStep& s)
      : b1(_mm256_set1_ps(s.beta1)),
        b2(_mm256_set1_ps(s.beta2)),
        c1(_mm256_set1_ps(s.one_minus_beta1)),
        c2(_mm256_set1_ps(s.one_minus_beta2)),
        eps(_mm256_set1_ps(s.eps)),
        decay(_mm256_set1_ps(s.decay_factor)),
        neg_step(_mm256_set1_ps(-s.step_size)),
        isb2(_mm256_set1_ps(s.inv_sqrt_bias2)),
        scale(_mm256_set1_ps(s.grad_scale)) {}
  // m and v in, updated in place; returns the new p.
  __m256 update(__m256 p, __m256 g, __m256& m, __m256& v) const {
    const __m256 grad = _mm256_mul_ps(g, scale);
    m = _mm256_fmadd_ps(c1, grad, _mm256_mul_ps(b1, m));
    v = _mm256_fmadd_ps(_mm256_mul_ps(c2, grad), grad, _mm256_mul_ps(b2, v));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), isb2, eps);
    return _mm256_fmadd_ps(neg_step, _mm256_div_ps(m, denom), _mm256_mul_ps(p, decay));
  }
};
#endif

// kCopy: also writes RNE bf16(p) after the update, in the same pass (a template, so the fp32 loop is
// exactly the one it was).
template <bool kCopy>
void adamw_range(float* p, const float* g, float* m, float* v, bf16_t* copy, std::size_t begin, std::size_t end,
                 const AdamWStep& s) {
  std::size_t i = begin;
#ifdef MT_ADAMW_AVX2
  const AdamW8 k(s);
  for (; i + 8 <= end; i += 8) {
    __m256 mi = _mm256_loadu_ps(m + i), vi = _mm256_loadu_ps(v + i);
    const __m256 pi = k.update(_mm256_loadu_ps(p + i), _mm256_loadu_ps(g + i), mi, vi);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, pi);
    if constexpr (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(copy + i), bf16_round8(pi));
  }
#endif
  for (; i < end; ++i) {
    adamw_one(p[i], g[i], m[i], v[i], s);
    if constexpr (kCopy) copy[i] = bf16_round_reference(p[i]);
  }
}

// Runs range(begin, end) over n elements on `threads` threads. Chunks are whole multiples of 64 floats (a
// cache line of each of the four arrays per 16 floats), so only the global tail runs scalar and thread
// boundaries never split a vector.
template <typename Range>
void split_over_threads(std::size_t n, int threads, const Range& range) {
  constexpr std::size_t kGrain = 64;
  const std::size_t blocks = (n + kGrain - 1) / kGrain;
  const int t = std::max(1, std::min<int>(threads, static_cast<int>(std::max<std::size_t>(blocks, 1))));
  if (t == 1 || n < 4096) {
    range(std::size_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(t)
  {
    // Static contiguous split computed by hand (not omp for) to keep chunk edges on the grain.
    const std::size_t id = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t per = (blocks + t - 1) / t;
    const std::size_t begin = std::min(n, id * per * kGrain);
    const std::size_t end = std::min(n, (id + 1) * per * kGrain);
    if (begin < end) range(begin, end);
  }
}

template <bool kCopy>
void adamw_split(float* p, const float* g, float* m, float* v, bf16_t* copy, std::size_t n, const AdamWStep& s,
                 int threads) {
  split_over_threads(n, threads,
                     [&](std::size_t begin, std::size_t end) { adamw_range<kCopy>(p, g, m, v, copy, begin, end, s); });
}

// --- split masters (kernels/master_halves.hpp) ---------------------------------------------------------

// One element of split masters: join, update(p, plain v), split (the tie bit back into v's sign).
template <typename Update>
inline void update_halves(bf16_t& high, std::uint16_t& low, float& v, const Update& update) {
  float p = join_master_reference(high, low, tie_bit_of(v));
  float plain = plain_v(v);
  update(p, plain);
  const MasterHalves h = split_master_reference(p);
  high = h.high;
  low = h.low;
  v = v_with_tie_bit(plain, h.rounded_up);
}

#ifdef MT_ADAMW_AVX2
// 8 x 32-bit lanes holding values <= 0xffff, packed to 8 x 16 bits.
inline __m128i pack8_u16(__m256i x) {
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(x, x), 0x08));
}
#endif

void adamw_halves_range(bf16_t* high, std::uint16_t* low, const float* g, float* m, float* v, std::size_t begin,
                        std::size_t end, const AdamWStep& s) {
  std::size_t i = begin;
#ifdef MT_ADAMW_AVX2
  const AdamW8 k(s);
  const __m256i half = _mm256_set1_epi32(0x8000), low_mask = _mm256_set1_epi32(0xffff);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bf16_abs = _mm256_set1_epi32(0x7fff), bf16_inf = _mm256_set1_epi32(0x7f80);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(kSignBit));
  for (; i + 8 <= end; i += 8) {
    // join (join_master_reference lane by lane); every compare is on values < 2^31, so signed is exact
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(high + i)));
    const __m256i l = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(low + i)));
    const __m256i vb = _mm256_castps_si256(_mm256_loadu_ps(v + i));
    const __m256i v_abs = _mm256_and_si256(vb, abs_mask);
    const __m256i v_nan = _mm256_cmpgt_epi32(v_abs, inf);
    const __m256i tie = _mm256_andnot_si256(v_nan, _mm256_srai_epi32(vb, 31));
    const __m256i h_nan = _mm256_cmpgt_epi32(_mm256_and_si256(h, bf16_abs), bf16_inf);
    const __m256i borrow = _mm256_andnot_si256(
        h_nan, _mm256_or_si256(_mm256_cmpgt_epi32(l, half), _mm256_and_si256(_mm256_cmpeq_epi32(l, half), tie)));
    const __m256 p_old = _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(_mm256_add_epi32(h, borrow), 16), l));
    const __m256 v_old = _mm256_castsi256_ps(_mm256_blendv_epi8(v_abs, vb, v_nan));
    // the update: adamw_range's instructions
    __m256 mi = _mm256_loadu_ps(m + i), vi = v_old;
    const __m256 pi = k.update(p_old, _mm256_loadu_ps(g + i), mi, vi);
    // split: RNE high, the dropped low half, the tie bit where low is 0x8000 and the rounding went up
    const __m256i u = _mm256_castps_si256(pi);
    const __m128i h_new = bf16_round8(pi);
    const __m256i l_new = _mm256_and_si256(u, low_mask);
    const __m256i up = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_srli_epi32(u, 16), _mm256_cvtepu16_epi32(h_new)),
                                           _mm256_cmpeq_epi32(l_new, half));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(vi), _mm256_and_si256(up, sign))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(high + i), h_new);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(low + i), pack8_u16(l_new));
  }
#endif
  for (; i < end; ++i)  // the very update of a vector lane (adamw_one)
    update_halves(high[i], low[i], v[i], [&](float& p, float& plain) { adamw_one(p, g[i], m[i], plain, s); });
}

#if defined(MT_ADAMW_AVX2) && defined(__GNUC__)
#define MT_ADAMW_AVX512 1
// GCC 12 reports its own AVX-512 intrinsics' undefined pass-through operands as maybe-uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// adamw_halves_range in 16 lanes (AVX-512F/BW/VL, chosen at run time where the CPU has them): the same
// IEEE operations lane by lane (the update's multiplies, fmas, sqrt and divide are each correctly
// rounded, whatever the vector width), the join and split with mask registers instead of lane masks.
// Half the instructions of the AVX2 loop for the integer work around the update.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void adamw_halves_range_avx512(bf16_t* high, std::uint16_t* low,
                                                                                    const float* g, float* m, float* v,
                                                                                    std::size_t begin, std::size_t end,
                                                                                    const AdamWStep& s) {
  std::size_t i = begin;
  const __m512 b1 = _mm512_set1_ps(s.beta1), b2 = _mm512_set1_ps(s.beta2), c1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 c2 = _mm512_set1_ps(s.one_minus_beta2), eps = _mm512_set1_ps(s.eps);
  const __m512 decay = _mm512_set1_ps(s.decay_factor), neg_step = _mm512_set1_ps(-s.step_size);
  const __m512 isb2 = _mm512_set1_ps(s.inv_sqrt_bias2), scale = _mm512_set1_ps(s.grad_scale);
  const __m512i half = _mm512_set1_epi32(0x8000), low_mask = _mm512_set1_epi32(0xffff), one = _mm512_set1_epi32(1);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bf16_abs = _mm512_set1_epi32(0x7fff), bf16_inf = _mm512_set1_epi32(0x7f80);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(kSignBit)), zero = _mm512_setzero_si512();
  const __m512i round_bias = _mm512_set1_epi32(0x7fff), quiet_bit = _mm512_set1_epi32(0x40);
  for (; i + 16 <= end; i += 16) {
    // join (join_master_reference lane by lane)
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(high + i)));
    const __m512i l = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(low + i)));
    const __m512i vb = _mm512_castps_si512(_mm512_loadu_ps(v + i));
    const __m512i v_abs = _mm512_and_si512(vb, abs_mask);
    const __mmask16 v_nan = _mm512_cmpgt_epi32_mask(v_abs, inf);
    const __mmask16 tie = _mm512_kandn(v_nan, _mm512_cmplt_epi32_mask(vb, zero));
    const __mmask16 h_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(h, bf16_abs), bf16_inf);
    const __mmask16 borrow = _mm512_kandn(
        h_nan, _mm512_kor(_mm512_cmpgt_epi32_mask(l, half), _mm512_kand(_mm512_cmpeq_epi32_mask(l, half), tie)));
    const __m512i h_old = _mm512_mask_sub_epi32(h, borrow, h, one);  // rounded up: the top was high - 1
    const __m512 p_old = _mm512_castsi512_ps(_mm512_or_si512(_mm512_slli_epi32(h_old, 16), l));
    const __m512 v_old = _mm512_castsi512_ps(_mm512_mask_blend_epi32(v_nan, v_abs, vb));
    // the update: AdamW8::update's instructions in 16 lanes
    const __m512 grad = _mm512_mul_ps(_mm512_loadu_ps(g + i), scale);
    const __m512 mi = _mm512_fmadd_ps(c1, grad, _mm512_mul_ps(b1, _mm512_loadu_ps(m + i)));
    const __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(c2, grad), grad, _mm512_mul_ps(b2, v_old));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), isb2, eps);
    const __m512 pi = _mm512_fmadd_ps(neg_step, _mm512_div_ps(mi, denom), _mm512_mul_ps(p_old, decay));
    // split: RNE high (NaN quieted), the dropped low half, the tie bit where low is 0x8000 and it rounded up
    const __m512i u = _mm512_castps_si512(pi);
    const __m512i top = _mm512_srli_epi32(u, 16);
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_and_si512(top, one), round_bias)), 16);
    const __m512i h_new =
        _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(pi, pi, _CMP_UNORD_Q), rounded, _mm512_or_si512(top, quiet_bit));
    const __m512i l_new = _mm512_and_si512(u, low_mask);
    const __mmask16 up = _mm512_kandn(_mm512_cmpeq_epi32_mask(top, h_new), _mm512_cmpeq_epi32_mask(l_new, half));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_si512(v + i, _mm512_mask_or_epi32(_mm512_castps_si512(vi), up, _mm512_castps_si512(vi), sign));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(high + i), _mm512_cvtepi32_epi16(h_new));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(low + i), _mm512_cvtepi32_epi16(l_new));
  }
  if (i < end) adamw_halves_range(high, low, g, m, v, i, end, s);  // the AVX2 loop and the scalar tail
}

bool cpu_has_avx512_halves() {
  static const bool has = avx512_allowed() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
}
#pragma GCC diagnostic pop
#endif

}  // namespace

void adamw(float* p, const float* g, float* m, float* v, std::size_t n, const AdamWStep& s, int threads) {
  adamw_split<false>(p, g, m, v, nullptr, n, s, threads);
}

void adamw_bf16copy(float* p, const float* g, float* m, float* v, bf16_t* p_bf16, std::size_t n, const AdamWStep& s,
                    int threads) {
  adamw_split<true>(p, g, m, v, p_bf16, n, s, threads);
}

void adamw_bf16copy_reference(float* p, const float* g, float* m, float* v, bf16_t* p_bf16, std::size_t n,
                              const AdamWStep& s) {
  adamw_reference(p, g, m, v, n, s);
  for (std::size_t i = 0; i < n; ++i) p_bf16[i] = bf16_round_reference(p[i]);
}

void adamw_split_master(bf16_t* high, std::uint16_t* low, const float* g, float* m, float* v, std::size_t n,
                        const AdamWStep& s, int threads) {
#ifdef MT_ADAMW_AVX512
  if (cpu_has_avx512_halves()) {
    split_over_threads(n, threads, [&](std::size_t begin, std::size_t end) {
      adamw_halves_range_avx512(high, low, g, m, v, begin, end, s);
    });
    return;
  }
#endif
  split_over_threads(
      n, threads, [&](std::size_t begin, std::size_t end) { adamw_halves_range(high, low, g, m, v, begin, end, s); });
}

void adamw_split_master_reference(bf16_t* high, std::uint16_t* low, const float* g, float* m, float* v, std::size_t n,
                                  const AdamWStep& s) {
  for (std::size_t i = 0; i < n; ++i)
    update_halves(high[i], low[i], v[i],
                  [&](float& p, float& plain) { adamw_reference(&p, g + i, m + i, &plain, 1, s); });
}

}  // namespace mt::cpu
