#include "storage/offload/moment_codec.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MT_CODEC_AVX2 1  // the vector loops below; without them (-DMEGATRAIN_ARCH=x86-64) the scalar ones
#endif
#include <zstd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

namespace mt::offload {

const char* moment_codec_name(MomentCodec c) {
  switch (c) {
    case MomentCodec::none:
      return "none";
    case MomentCodec::lossless:
      return "lossless";
    case MomentCodec::int8:
      return "int8";
  }
  return "?";
}

MomentCodec parse_moment_codec(const std::string& name) {
  for (MomentCodec c : {MomentCodec::none, MomentCodec::lossless, MomentCodec::int8})
    if (name == moment_codec_name(c)) return c;
  throw std::invalid_argument("unknown moment compression '" + name + "' (choices: none, lossless, int8)");
}

// ---------------------------------------------------------------------------------------------------
// int8: logarithmic code map. Level k (1..levels) decodes to scale * 2^-((levels - k) / 8); a value
// takes the level nearest in the log domain (thresholds at geometric midpoints), below the first level
// the nearer of 0 and level 1 (signed) or level 1 whenever it is not zero (unsigned).
namespace {

struct CodeMap {
  std::vector<double> level;      // [0] = 0, [k] = 2^-((levels - k) / 8)
  std::vector<double> threshold;  // ascending: a code is the number of thresholds <= |x| / scale
  std::vector<double> padded;     // -inf, the thresholds, NaN: padded[k + 1] = threshold[k], branch-free
  int levels = 0;
};

CodeMap make_map(int levels, bool is_signed) {
  CodeMap c;
  c.levels = levels;
  c.level.assign(static_cast<std::size_t>(levels) + 1, 0.0);
  for (int k = 1; k <= levels; ++k)
    c.level[static_cast<std::size_t>(k)] = std::exp2(-static_cast<double>(levels - k) / kCodesPerOctave);
  // Below level 1: signed rounds to the nearer of 0 and level 1; unsigned never to 0 (threshold at
  // the smallest positive double, so every non-zero value reaches level 1).
  c.threshold.push_back(is_signed ? c.level[1] / 2 : std::numeric_limits<double>::denorm_min());
  for (int k = 1; k < levels; ++k)
    c.threshold.push_back(std::exp2(-(static_cast<double>(levels - k) - 0.5) / kCodesPerOctave));
  c.padded.push_back(-std::numeric_limits<double>::infinity());
  c.padded.insert(c.padded.end(), c.threshold.begin(), c.threshold.end());
  c.padded.push_back(std::numeric_limits<double>::quiet_NaN());  // never <= a: no step past the last code
  return c;
}

const CodeMap& signed_map() {
  static const CodeMap m = make_map(kSignedLevels, true);
  return m;
}
const CodeMap& unsigned_map() {
  static const CodeMap m = make_map(kUnsignedLevels, false);
  return m;
}

// The largest magnitude (NaNs skipped, as std::max(s, NaN) keeps s). Eight partial maxima so the
// compiler can use vector max instructions; max is exact, so the lanes give the same result.
float block_scale(const float* x, std::size_t n) {
  float lane[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t j = 0; j < 8; ++j) lane[j] = std::max(lane[j], std::fabs(x[i + j]));
  float s = 0.0f;
  for (; i < n; ++i) s = std::max(s, std::fabs(x[i]));
  for (const float l : lane) s = std::max(s, l);
  return s;
}

// The code of a = |x| / scale: the number of thresholds <= a (a NaN: 0). Plain reference.
std::uint32_t code_reference(const CodeMap& map, double a) {
  std::uint32_t k = 0;
  while (k < map.threshold.size() && map.threshold[k] <= a) ++k;
  return k;
}

// The same count without a search. The guess reads log2(a) from the bits with the mantissa taken as
// linear (at most 0.09 below log2(a), so at most one code below the count), then steps to the exact
// count branch-free on the padded table (threshold k is padded[k + 1]); a second step up and one down
// keep it exact even a further code off. a = 0 guesses 0; a NaN guesses 0 and no comparison holds.
// The AVX2 loop below does the same per lane.
std::uint32_t code_fast(const CodeMap& map, double a) {
  std::uint64_t bits;
  std::memcpy(&bits, &a, sizeof(bits));
  const double log2a = static_cast<double>(static_cast<std::int64_t>(bits >> 52) - 1023) +
                       static_cast<double>(bits & ((std::uint64_t{1} << 52) - 1)) / 4503599627370496.0;
  const double guess = static_cast<double>(map.levels) + kCodesPerOctave * log2a + 0.5;
  const auto K = static_cast<double>(map.threshold.size());
  auto g = static_cast<std::int64_t>(a == a && guess > 0.0 ? std::min(guess, K) : 0.0);
  const double* t = map.padded.data();
  g += static_cast<std::int64_t>(t[g + 1] <= a);
  g += static_cast<std::int64_t>(t[g + 1] <= a);
  g -= static_cast<std::int64_t>(t[g] > a);
  return static_cast<std::uint32_t>(g);
}

std::uint8_t with_sign(std::uint32_t k, bool is_signed, float x) {
  return static_cast<std::uint8_t>(k | (is_signed && x < 0.0f && k > 0 ? 0x80u : 0u));
}

float quantize_reference(const float* x, std::size_t n, bool is_signed, std::uint8_t* codes) {
  const CodeMap& map = is_signed ? signed_map() : unsigned_map();
  const float scale = block_scale(x, n);
  for (std::size_t i = 0; i < n; ++i) {
    const double a = scale > 0.0f ? std::fabs(static_cast<double>(x[i])) / scale : 0.0;
    codes[i] = with_sign(code_reference(map, a), is_signed, x[i]);
  }
  return scale;
}

// Four lanes at a time (AVX2, the project's baseline ISA): the same division, guess and steps as
// code_fast, the table steps as gathers.
float quantize_fast(const float* x, std::size_t n, bool is_signed, std::uint8_t* codes) {
  const CodeMap& map = is_signed ? signed_map() : unsigned_map();
  const float scale = block_scale(x, n);
  std::size_t i = 0;
#if MT_CODEC_AVX2
  if (scale > 0.0f) {
    const __m256d vscale = _mm256_set1_pd(static_cast<double>(scale));
    const __m256d level_half = _mm256_set1_pd(static_cast<double>(map.levels) + 0.5);
    const __m256d per_octave = _mm256_set1_pd(kCodesPerOctave);
    const __m256d K = _mm256_set1_pd(static_cast<double>(map.threshold.size()));
    const __m256d mantissa_unit = _mm256_set1_pd(1.0 / 1048576.0);  // the top 20 mantissa bits
    const __m256d zero = _mm256_setzero_pd();
    const __m256d all = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));  // gather every lane (the masked form:
                                                                      // GCC 12 warns on the plain one)
    const __m256i high_words = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    const __m256i low_words = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    const __m128i sign_code = _mm_set1_epi32(is_signed ? 0x80 : 0);
    const double* t = map.padded.data();
    auto lanes32 = [](__m256d v, __m256i words) {  // one 32-bit word of each 64-bit lane
      return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(v), words));
    };
    for (; i + 4 <= n; i += 4) {
      const __m128 xf = _mm_loadu_ps(x + i);
      const __m256d a = _mm256_div_pd(_mm256_cvtps_pd(_mm_and_ps(xf, abs_mask)), vscale);
      const __m128i hi = lanes32(a, high_words);  // sign 0, 11 exponent bits, 20 mantissa bits
      const __m256d exponent = _mm256_cvtepi32_pd(_mm_sub_epi32(_mm_srli_epi32(hi, 20), _mm_set1_epi32(1023)));
      const __m256d mantissa = _mm256_cvtepi32_pd(_mm_and_si128(hi, _mm_set1_epi32(0xfffff)));
      __m256d guess = _mm256_fmadd_pd(per_octave, _mm256_fmadd_pd(mantissa, mantissa_unit, exponent), level_half);
      guess = _mm256_and_pd(guess, _mm256_cmp_pd(a, a, _CMP_ORD_Q));  // NaN: 0
      guess = _mm256_min_pd(_mm256_max_pd(guess, zero), K);
      __m128i g = _mm256_cvttpd_epi32(guess);
      for (int up = 0; up < 2; ++up) {
        const __m256d next = _mm256_mask_i32gather_pd(zero, t + 1, g, all, 8);
        g = _mm_sub_epi32(g, lanes32(_mm256_cmp_pd(next, a, _CMP_LE_OQ), low_words));
      }
      const __m256d prev = _mm256_mask_i32gather_pd(zero, t, g, all, 8);
      g = _mm_add_epi32(g, lanes32(_mm256_cmp_pd(prev, a, _CMP_GT_OQ), low_words));
      const __m128i negative = _mm_castps_si128(_mm_cmplt_ps(xf, _mm_setzero_ps()));
      const __m128i nonzero = _mm_cmpgt_epi32(g, _mm_setzero_si128());
      g = _mm_or_si128(g, _mm_and_si128(sign_code, _mm_and_si128(negative, nonzero)));
      const __m128i bytes = _mm_packus_epi16(_mm_packus_epi32(g, g), _mm_setzero_si128());
      const int four = _mm_cvtsi128_si32(bytes);
      std::memcpy(codes + i, &four, 4);
    }
  }
#endif
  for (; i < n; ++i) {
    const double a = scale > 0.0f ? std::fabs(static_cast<double>(x[i])) / scale : 0.0;
    codes[i] = with_sign(code_fast(map, a), is_signed, x[i]);
  }
  return scale;
}

}  // namespace

double int8_relative_error_bound() { return std::exp2(1.0 / (2 * kCodesPerOctave)) - 1.0; }

double int8_floor(bool is_signed) { return (is_signed ? signed_map() : unsigned_map()).level[1]; }

float quantize_block_reference(const float* x, std::size_t n, bool is_signed, std::uint8_t* codes) {
  return quantize_reference(x, n, is_signed, codes);
}

float quantize_block(const float* x, std::size_t n, bool is_signed, std::uint8_t* codes) {
  return quantize_fast(x, n, is_signed, codes);
}

namespace {
float dequantize_one(const CodeMap& map, std::uint8_t code, double scale, bool is_signed) {
  const unsigned k = is_signed ? (code & 0x7fu) : code;
  const double mag = scale * map.level[k];
  return static_cast<float>(is_signed && (code & 0x80u) ? -mag : mag);
}
}  // namespace

void dequantize_block_reference(const std::uint8_t* codes, std::size_t n, float scale, bool is_signed, float* x) {
  const CodeMap& map = is_signed ? signed_map() : unsigned_map();
  for (std::size_t i = 0; i < n; ++i) x[i] = dequantize_one(map, codes[i], static_cast<double>(scale), is_signed);
}

// Rounding to nearest is symmetric, so negating the float equals rounding the negated double.
void dequantize_block(const std::uint8_t* codes, std::size_t n, float scale, bool is_signed, float* x) {
  const CodeMap& map = is_signed ? signed_map() : unsigned_map();
  std::size_t i = 0;
#if MT_CODEC_AVX2
  const __m256d vscale = _mm256_set1_pd(static_cast<double>(scale));
  const __m128i level_bits = _mm_set1_epi32(is_signed ? 0x7f : 0xff);
  const __m128i sign_bit = _mm_set1_epi32(is_signed ? 0x80 : 0);
  const __m256d zero = _mm256_setzero_pd();
  const __m256d all = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
  for (; i + 4 <= n; i += 4) {
    int four;
    std::memcpy(&four, codes + i, 4);
    const __m128i c = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(four));
    const __m256d level = _mm256_mask_i32gather_pd(zero, map.level.data(), _mm_and_si128(c, level_bits), all, 8);
    const __m128 mag = _mm256_cvtpd_ps(_mm256_mul_pd(vscale, level));
    const __m128i negative = _mm_slli_epi32(_mm_and_si128(c, sign_bit), 24);  // bit 7 -> the float's sign bit
    _mm_storeu_ps(x + i, _mm_xor_ps(mag, _mm_castsi128_ps(negative)));
  }
#endif
  for (; i < n; ++i) x[i] = dequantize_one(map, codes[i], static_cast<double>(scale), is_signed);
}

// ---------------------------------------------------------------------------------------------------
namespace {

std::size_t blocks_of(std::size_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }
std::size_t int8_array_bytes(std::size_t n) { return blocks_of(n) * sizeof(float) + n; }

// One array: [scales (fp32, one per block)][codes (one byte per value)]. v's array follows m's, so
// its scales are not 4-byte aligned when n is not a multiple of 4: copied, never dereferenced.
void int8_encode_array(const float* x, std::size_t n, bool is_signed, std::byte* out) {
  std::byte* scales = out;
  auto* codes = reinterpret_cast<std::uint8_t*>(out + blocks_of(n) * sizeof(float));
  const auto nb = static_cast<std::int64_t>(blocks_of(n));
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::size_t i0 = static_cast<std::size_t>(b) * kQuantBlock;
    const float scale = quantize_block(x + i0, std::min(kQuantBlock, n - i0), is_signed, codes + i0);
    std::memcpy(scales + b * static_cast<std::int64_t>(sizeof(float)), &scale, sizeof(float));
  }
}

void int8_decode_array(const std::byte* in, std::size_t n, bool is_signed, float* x) {
  const std::byte* scales = in;
  const auto* codes = reinterpret_cast<const std::uint8_t*>(in + blocks_of(n) * sizeof(float));
  const auto nb = static_cast<std::int64_t>(blocks_of(n));
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::size_t i0 = static_cast<std::size_t>(b) * kQuantBlock;
    float scale;
    std::memcpy(&scale, scales + b * static_cast<std::int64_t>(sizeof(float)), sizeof(float));
    dequantize_block(codes + i0, std::min(kQuantBlock, n - i0), scale, is_signed, x + i0);
  }
}

// lossless: [u64 frame bytes, one per frame][the zstd frames]. m then v, each in chunks of
// kPlaneChunk floats, each chunk as its 4 byte planes (byte 0..3 of every float), a frame each. The
// chunks bound the scratch a thread needs (4 x kPlaneChunk bytes, whatever the stage's size) and
// cost nothing in ratio: zstd level 1 looks back 512 KiB at most.
constexpr std::size_t kPlaneChunk = std::size_t{1} << 20;
constexpr int kZstdLevel = 1;  // ~the ratio of level 3 on these planes, several times faster

std::size_t chunks_of(std::size_t n) { return (n + kPlaneChunk - 1) / kPlaneChunk; }
std::size_t lossless_frames(std::size_t n) { return 2 * 4 * chunks_of(n); }
std::size_t lossless_bound(std::size_t n) {
  std::size_t total = lossless_frames(n) * sizeof(std::uint64_t);
  for (std::size_t c = 0; c < chunks_of(n); ++c)
    total += 2 * 4 * ZSTD_compressBound(std::min(kPlaneChunk, n - c * kPlaneChunk));
  return total;
}

std::vector<std::uint8_t>& plane_scratch(std::size_t bytes) {
  thread_local std::vector<std::uint8_t> scratch;
  if (scratch.size() < bytes) scratch.resize(bytes);
  return scratch;
}

// The 4 byte planes of n floats in one pass (byte k of float i to planes[k * n + i]), and back: one
// read and one write of the array each way (a pass per plane read or wrote every cache line 4 times).
void split_planes(const float* x, std::size_t n, std::uint8_t* planes) {
  const auto* b = reinterpret_cast<const std::uint8_t*>(x);
  std::uint8_t *p0 = planes, *p1 = planes + n, *p2 = planes + 2 * n, *p3 = planes + 3 * n;
  for (std::size_t i = 0; i < n; ++i) {
    p0[i] = b[4 * i];
    p1[i] = b[4 * i + 1];
    p2[i] = b[4 * i + 2];
    p3[i] = b[4 * i + 3];
  }
}

void join_planes(const std::uint8_t* planes, std::size_t n, float* x) {
  auto* b = reinterpret_cast<std::uint8_t*>(x);
  const std::uint8_t *p0 = planes, *p1 = planes + n, *p2 = planes + 2 * n, *p3 = planes + 3 * n;
  for (std::size_t i = 0; i < n; ++i) {
    b[4 * i] = p0[i];
    b[4 * i + 1] = p1[i];
    b[4 * i + 2] = p2[i];
    b[4 * i + 3] = p3[i];
  }
}

std::size_t lossless_encode(const float* m, const float* v, std::size_t n, std::byte* out) {
  std::uint8_t* planes = plane_scratch(4 * std::min(n, kPlaneChunk)).data();
  auto* sizes = reinterpret_cast<std::uint64_t*>(out);
  std::size_t used = lossless_frames(n) * sizeof(std::uint64_t), frame = 0;
  for (const float* x : {m, v})
    for (std::size_t i0 = 0; i0 < n; i0 += kPlaneChunk) {
      const std::size_t len = std::min(kPlaneChunk, n - i0);
      split_planes(x + i0, len, planes);
      for (std::size_t p = 0; p < 4; ++p) {
        const std::size_t z = ZSTD_compress(out + used, ZSTD_compressBound(len), planes + p * len, len, kZstdLevel);
        if (ZSTD_isError(z)) throw std::runtime_error(std::string("zstd compression failed: ") + ZSTD_getErrorName(z));
        const std::uint64_t z64 = z;
        std::memcpy(sizes + frame++, &z64, sizeof(z64));
        used += z;
      }
    }
  return used;
}

void lossless_decode(const std::byte* in, std::size_t bytes, std::size_t n, float* m, float* v) {
  const std::size_t frames = lossless_frames(n);
  if (bytes < frames * sizeof(std::uint64_t)) throw std::runtime_error("lossless moments: encoding too short");
  std::uint8_t* planes = plane_scratch(4 * std::min(n, kPlaneChunk)).data();
  std::size_t pos = frames * sizeof(std::uint64_t), frame = 0;
  for (float* x : {m, v})
    for (std::size_t i0 = 0; i0 < n; i0 += kPlaneChunk) {
      const std::size_t len = std::min(kPlaneChunk, n - i0);
      for (std::size_t p = 0; p < 4; ++p, ++frame) {
        std::uint64_t size;
        std::memcpy(&size, in + frame * sizeof(std::uint64_t), sizeof(size));
        if (size > bytes - pos) throw std::runtime_error("lossless moments: frame sizes exceed the encoding");
        const std::size_t d = ZSTD_decompress(planes + p * len, len, in + pos, size);
        if (ZSTD_isError(d) || d != len)
          throw std::runtime_error("lossless moments: frame " + std::to_string(frame) + " does not decode to " +
                                   std::to_string(len) + " bytes" +
                                   (ZSTD_isError(d) ? std::string(": ") + ZSTD_getErrorName(d) : ""));
        pos += size;
      }
      join_planes(planes, len, x + i0);
    }
  if (pos != bytes) throw std::runtime_error("lossless moments: trailing bytes after the frames");
}

}  // namespace

std::size_t encoded_bound(MomentCodec c, std::size_t n) {
  switch (c) {
    case MomentCodec::none:
      return 2 * n * sizeof(float);
    case MomentCodec::lossless:
      return lossless_bound(n);
    case MomentCodec::int8:
      return 2 * int8_array_bytes(n);
  }
  return 0;
}

std::size_t encode_moments(MomentCodec c, const float* m, const float* v, std::size_t n, std::byte* out) {
  switch (c) {
    case MomentCodec::none:
      std::memcpy(out, m, n * sizeof(float));
      std::memcpy(out + n * sizeof(float), v, n * sizeof(float));
      return 2 * n * sizeof(float);
    case MomentCodec::lossless:
      return lossless_encode(m, v, n, out);
    case MomentCodec::int8:
      int8_encode_array(m, n, true, out);
      int8_encode_array(v, n, false, out + int8_array_bytes(n));
      return 2 * int8_array_bytes(n);
  }
  return 0;
}

void decode_moments(MomentCodec c, const std::byte* in, std::size_t bytes, std::size_t n, float* m, float* v) {
  switch (c) {
    case MomentCodec::none:
      if (bytes != 2 * n * sizeof(float)) throw std::runtime_error("fp32 moments: wrong size");
      std::memcpy(m, in, n * sizeof(float));
      std::memcpy(v, in + n * sizeof(float), n * sizeof(float));
      return;
    case MomentCodec::lossless:
      lossless_decode(in, bytes, n, m, v);
      return;
    case MomentCodec::int8:
      if (bytes != 2 * int8_array_bytes(n)) throw std::runtime_error("int8 moments: wrong size");
      int8_decode_array(in, n, true, m);
      int8_decode_array(in + int8_array_bytes(n), n, false, v);
      return;
  }
}

}  // namespace mt::offload
