// bf16 pair products and packers (see bf16_pairs.hpp).
#include "kernels/cpu/bf16_pairs.hpp"

#include "kernels/cpu/row_fetch.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__)
#include <immintrin.h>
#define MT_PAIRS_X86 1
#endif

namespace mt::cpu {

namespace {

// What the transposes do with a tile's output rows: store them, add them to what is there (as floats), or
// stream them: stored past the caches where a row is a whole aligned line.
enum class TileOut { store, add, stream };

#ifdef MT_PAIRS_X86
// GCC 12 reports its own AVX-512 intrinsics' undefined pass-through operands as maybe-uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define MT_PAIRS_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// Rows of the register block and its columns (NV vectors of 16): 8 x 32 accumulators are 16 of the 32
// zmm registers, leaving room for the two B vectors and the broadcast A word.
constexpr int kRows = 8;
constexpr std::int64_t kCols = 32;
// Lines of a RowFetch a register block: fewer left most of the attention's next rows to be fetched at once
// at the next group's start; eight took the most time off a documents window's forward and backward.
constexpr std::int64_t kFetchLinesPerBlock = 8;
// A words are read as scalars: through an alias, so a caller may have written them as bf16 halves.
using pair_word = std::uint32_t __attribute__((may_alias));

// One register block: C[0..MR, 0..16 NV] over all K2 pairs; lanes outside `m0`/`m1` are neither read
// nor written.
template <int MR, int NV>
MT_PAIRS_TARGET void block(std::int64_t K2, const pair_t* A, std::int64_t lda, const pair_t* B, std::int64_t ldb,
                           bool accumulate, float* C, std::int64_t ldc, __mmask16 m0, __mmask16 m1) {
  // Two arrays of single vectors, every loop over them unrolled: GCC keeps them in registers (an array of
  // [MR][NV] was kept on the stack, a store per product).
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    c0[r] = accumulate ? _mm512_maskz_loadu_ps(m0, C + r * ldc) : _mm512_setzero_ps();
    c1[r] = NV == 2 && accumulate ? _mm512_maskz_loadu_ps(m1, C + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (std::int64_t p = 0; p < K2; ++p) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi32(m0, B + p * ldb));
    const __m512bh b1 = NV == 2 ? reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi32(m1, B + p * ldb + 16)) : b0;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const auto word = *reinterpret_cast<const pair_word*>(A + r * lda + p);
      const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(word)));
      c0[r] = _mm512_dpbf16_ps(c0[r], a, b0);
      if constexpr (NV == 2) c1[r] = _mm512_dpbf16_ps(c1[r], a, b1);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(C + r * ldc, m0, c0[r]);
    if constexpr (NV == 2) _mm512_mask_storeu_ps(C + r * ldc + 16, m1, c1[r]);
  }
}

template <int NV>
using BlockFn = void (*)(std::int64_t, const pair_t*, std::int64_t, const pair_t*, std::int64_t, bool, float*,
                         std::int64_t, __mmask16, __mmask16);

template <int NV>
constexpr BlockFn<NV> kBlocks[kRows + 1] = {nullptr,      block<1, NV>, block<2, NV>, block<3, NV>, block<4, NV>,
                                            block<5, NV>, block<6, NV>, block<7, NV>, block<8, NV>};

__mmask16 lanes(std::int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << std::max<std::int64_t>(n, 0)) - 1u);
}

// Column panels of 32 outer, row blocks of 8 inner: a panel of B (K2 x 32 words) stays in L1 while
// every row block of A passes over it.
void gemm_avx512(std::int64_t M, std::int64_t N, std::int64_t K2, const pair_t* A, std::int64_t lda, const pair_t* B,
                 std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc, RowFetch* fetch) {
  for (std::int64_t n0 = 0; n0 < N; n0 += kCols) {
    const std::int64_t nn = std::min(kCols, N - n0);
    const __mmask16 m0 = lanes(nn), m1 = lanes(nn - 16);
    for (std::int64_t i0 = 0; i0 < M; i0 += kRows) {
      const auto mr = static_cast<int>(std::min<std::int64_t>(kRows, M - i0));
      const pair_t* a = A + i0 * lda;
      float* c = C + i0 * ldc + n0;
      if (fetch) fetch->issue(kFetchLinesPerBlock);
      if (nn > 16)
        kBlocks<2>[mr](K2, a, lda, B + n0, ldb, accumulate, c, ldc, m0, m1);
      else
        kBlocks<1>[mr](K2, a, lda, B + n0, ldb, accumulate, c, ldc, m0, 0);
    }
  }
}
// 16 floats to bf16, rounded to nearest even (vcvtneps2bf16: denormals flush to zero, as vdpbf16ps reads
// them anyway), widened to the low halves of 16 words.
MT_PAIRS_TARGET inline __m512i bf16_words(const float* x, __mmask16 m) {
  return _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x))));
}

// pack_row_pairs: 32 floats of a row make 16 words; odd tails take a zero.
MT_PAIRS_TARGET void row_pairs_avx512(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols,
                                      pair_t* out, std::int64_t ldo) {
  const __m512i idx_even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i idx_odd = _mm512_add_epi32(idx_even, _mm512_set1_epi32(1));
  const std::int64_t words = (cols + 1) / 2;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    for (std::int64_t w0 = 0; w0 < words; w0 += 16) {
      const std::int64_t c0 = 2 * w0, n = std::min<std::int64_t>(32, cols - c0);
      const __m512 lo = _mm512_maskz_loadu_ps(lanes(n), xr + c0),
                   hi = _mm512_maskz_loadu_ps(lanes(n - 16), xr + c0 + 16);
      const __m512 even = _mm512_permutex2var_ps(lo, idx_even, hi), odd = _mm512_permutex2var_ps(lo, idx_odd, hi);
      const __m512i e = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(even)));
      const __m512i o = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(odd)));
      _mm512_mask_storeu_epi32(out + r * ldo + w0, lanes(words - w0), _mm512_or_si512(e, _mm512_slli_epi32(o, 16)));
    }
  }
}

// pack_column_pairs: 16 columns of two rows make 16 words; an odd last row pairs with zero.
MT_PAIRS_TARGET void column_pairs_avx512(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols,
                                         pair_t* out, std::int64_t ldo) {
  for (std::int64_t p = 0; 2 * p < rows; ++p) {
    const float* even = x + 2 * p * ldx;
    const bool has_odd = 2 * p + 1 < rows;
    for (std::int64_t c0 = 0; c0 < cols; c0 += 16) {
      const __mmask16 m = lanes(cols - c0);
      const __m512i e = bf16_words(even + c0, m);
      const __m512i o = has_odd ? bf16_words(even + ldx + c0, m) : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(out + p * ldo + c0, m, _mm512_or_si512(e, _mm512_slli_epi32(o, 16)));
    }
  }
}
// A 16 x 16 tile of 32-bit elements transposed in registers: rows in, columns out. Three rounds of
// interleaving (32-bit, 64-bit, then 128-bit lanes twice) take row r's element c to vector c's lane r.
MT_PAIRS_TARGET inline void transpose16(__m512i v[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  // u[4 g + k]: rows 4g..4g+3 of columns k, k + 4, k + 8, k + 12 (one 128-bit lane each)
  for (int g = 0; g < 4; ++g) {
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i lo_a = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88), hi_a = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xdd);
    const __m512i lo_b = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88),
                  hi_b = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xdd);
    v[k] = _mm512_shuffle_i32x4(lo_a, lo_b, 0x88);
    v[k + 8] = _mm512_shuffle_i32x4(lo_a, lo_b, 0xdd);
    v[k + 4] = _mm512_shuffle_i32x4(hi_a, hi_b, 0x88);
    v[k + 12] = _mm512_shuffle_i32x4(hi_a, hi_b, 0xdd);
  }
}

// The tiles: rows past `rows` read as zero, columns past `cols` are neither read nor written.
template <TileOut kOut>
MT_PAIRS_TARGET void transpose_avx512(const std::uint32_t* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols,
                                      std::uint32_t* out, std::int64_t ldo) {
  __m512i v[16];
  for (std::int64_t r0 = 0; r0 < rows; r0 += 16) {
    const std::int64_t rn = std::min<std::int64_t>(16, rows - r0);
    const __mmask16 out_lanes = lanes(rn);
    for (std::int64_t c0 = 0; c0 < cols; c0 += 16) {
      const std::int64_t cn = std::min<std::int64_t>(16, cols - c0);
      const __mmask16 in_lanes = lanes(cn);
      for (int r = 0; r < 16; ++r)
        v[r] = r < rn ? _mm512_maskz_loadu_epi32(in_lanes, x + (r0 + r) * ldx + c0) : _mm512_setzero_si512();
      transpose16(v);
      for (int c = 0; c < cn; ++c) {
        std::uint32_t* o = out + (c0 + c) * ldo + r0;
        if constexpr (kOut == TileOut::add) {
          const __m512 sum = _mm512_add_ps(_mm512_maskz_loadu_ps(out_lanes, o), _mm512_castsi512_ps(v[c]));
          _mm512_mask_storeu_ps(o, out_lanes, sum);
        } else if (kOut == TileOut::stream && rn == 16 && reinterpret_cast<std::uintptr_t>(o) % 64 == 0) {
          _mm512_stream_si512(reinterpret_cast<__m512i*>(o), v[c]);
        } else {
          _mm512_mask_storeu_epi32(o, out_lanes, v[c]);
        }
      }
    }
  }
  if constexpr (kOut == TileOut::stream) _mm_sfence();  // the streamed lines are visible before the caller goes on
}
#pragma GCC diagnostic pop
#endif

// out[c * ldo + r] (+)= x[r * ldx + c]: the AVX-512 tiles where the CPU has them, a plain loop elsewhere.
template <TileOut kOut>
void transpose_as(const std::uint32_t* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, std::uint32_t* out,
                  std::int64_t ldo) {
#ifdef MT_PAIRS_X86
  if (bf16_pairs_available()) return transpose_avx512<kOut>(x, ldx, rows, cols, out, ldo);
#endif
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      std::uint32_t& o = out[c * ldo + r];
      if constexpr (kOut == TileOut::add) {
        float sum, add;
        std::memcpy(&sum, &o, sizeof sum);
        std::memcpy(&add, &x[r * ldx + c], sizeof add);
        sum += add;
        std::memcpy(&o, &sum, sizeof sum);
      } else {
        o = x[r * ldx + c];
      }
    }
}

float lo(pair_t w) { return bf16_to_float(static_cast<bf16_t>(w & 0xffffu)); }
float hi(pair_t w) { return bf16_to_float(static_cast<bf16_t>(w >> 16)); }

}  // namespace

bool bf16_pairs_available() {
#ifdef MT_PAIRS_X86
  return cpu_has_avx512_bf16();
#else
  return false;
#endif
}

void bf16_pair_gemm(std::int64_t M, std::int64_t N, std::int64_t K2, const pair_t* A, std::int64_t lda, const pair_t* B,
                    std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc, RowFetch* fetch) {
  if (M <= 0 || N <= 0) return;
#ifdef MT_PAIRS_X86
  if (bf16_pairs_available()) {
    gemm_avx512(M, N, K2, A, lda, B, ldb, accumulate, C, ldc, fetch);
    return;
  }
#endif
  throw std::logic_error("bf16_pair_gemm: this CPU has no AVX512-BF16 (check bf16_pairs_available() first)");
}

void bf16_pair_gemm_reference(std::int64_t M, std::int64_t N, std::int64_t K2, const pair_t* A, std::int64_t lda,
                              const pair_t* B, std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc) {
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double acc = accumulate ? static_cast<double>(C[m * ldc + n]) : 0.0;
      for (std::int64_t p = 0; p < K2; ++p) {
        const pair_t a = A[m * lda + p], b = B[p * ldb + n];
        acc += static_cast<double>(lo(a)) * lo(b) + static_cast<double>(hi(a)) * hi(b);
      }
      C[m * ldc + n] = static_cast<float>(acc);
    }
}

void pack_row_pairs(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, pair_t* out,
                    std::int64_t ldo) {
#ifdef MT_PAIRS_X86
  if (bf16_pairs_available()) return row_pairs_avx512(x, ldx, rows, cols, out, ldo);
#endif
  const std::int64_t full = cols / 2;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    pair_t* o = out + r * ldo;
    for (std::int64_t p = 0; p < full; ++p) o[p] = make_pair_word(xr[2 * p], xr[2 * p + 1]);
    if (cols % 2) o[full] = make_pair_word(xr[cols - 1], 0.0f);
  }
}

void pack_column_pairs(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, pair_t* out,
                       std::int64_t ldo) {
#ifdef MT_PAIRS_X86
  if (bf16_pairs_available()) return column_pairs_avx512(x, ldx, rows, cols, out, ldo);
#endif
  for (std::int64_t p = 0; 2 * p < rows; ++p) {
    const float* even = x + 2 * p * ldx;
    const float* odd = 2 * p + 1 < rows ? even + ldx : nullptr;
    pair_t* o = out + p * ldo;
    if (odd)
      for (std::int64_t c = 0; c < cols; ++c) o[c] = make_pair_word(even[c], odd[c]);
    else
      for (std::int64_t c = 0; c < cols; ++c) o[c] = make_pair_word(even[c], 0.0f);
  }
}

void transpose_words(const pair_t* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, pair_t* out,
                     std::int64_t ldo) {
  transpose_as<TileOut::store>(x, ldx, rows, cols, out, ldo);
}

void stream_transposed(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, float* out,
                       std::int64_t ldo) {
  transpose_as<TileOut::stream>(reinterpret_cast<const std::uint32_t*>(x), ldx, rows, cols,
                                reinterpret_cast<std::uint32_t*>(out), ldo);
}

void add_transposed(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, float* out,
                    std::int64_t ldo) {
  transpose_as<TileOut::add>(reinterpret_cast<const std::uint32_t*>(x), ldx, rows, cols,
                             reinterpret_cast<std::uint32_t*>(out), ldo);
}

void pack_row_pairs_transposed(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, pair_t* out,
                               std::int64_t ldo) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    for (std::int64_t p = 0; 2 * p < cols; ++p)
      out[p * ldo + r] = make_pair_word(xr[2 * p], 2 * p + 1 < cols ? xr[2 * p + 1] : 0.0f);
  }
}

void pack_column_pairs_transposed(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, pair_t* out,
                                  std::int64_t ldo) {
  for (std::int64_t p = 0; 2 * p < rows; ++p) {
    const float* even = x + 2 * p * ldx;
    const float* odd = 2 * p + 1 < rows ? even + ldx : nullptr;
    for (std::int64_t c = 0; c < cols; ++c) out[c * ldo + p] = make_pair_word(even[c], odd ? odd[c] : 0.0f);
  }
}

}  // namespace mt::cpu
