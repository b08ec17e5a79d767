#include "storage/offload/moment_codec.hpp"

#include <zstd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
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

float block_scale(const float* x, std::size_t n) {
  float s = 0.0f;
  for (std::size_t i = 0; i < n; ++i) s = std::max(s, std::fabs(x[i]));
  return s;
}

template <bool Fast>
float quantize(const float* x, std::size_t n, bool is_signed, std::uint8_t* codes) {
  const CodeMap& map = is_signed ? signed_map() : unsigned_map();
  const float scale = block_scale(x, n);
  for (std::size_t i = 0; i < n; ++i) {
    const double a = scale > 0.0f ? std::fabs(static_cast<double>(x[i])) / scale : 0.0;
    std::size_t k = 0;
    if constexpr (Fast) {
      // Guess the code from the exponent and mantissa bits (log2(a) to within 0.09, so at most one
      // code off), then step to the exact count of thresholds <= a: the reference's answer.
      const std::size_t K = map.threshold.size();
      if (a > 0.0) {
        std::uint64_t bits;
        std::memcpy(&bits, &a, sizeof(bits));
        const double log2a = static_cast<double>(static_cast<std::int64_t>(bits >> 52) - 1023) +
                             static_cast<double>(bits & ((std::uint64_t{1} << 52) - 1)) / 4503599627370496.0;
        const double guess = static_cast<double>(map.levels) + kCodesPerOctave * log2a + 0.5;
        k = guess <= 0.0 ? 0 : std::min(K, static_cast<std::size_t>(guess));
      }
      while (k < K && map.threshold[k] <= a) ++k;
      while (k > 0 && map.threshold[k - 1] > a) --k;
    } else {
      while (k < map.threshold.size() && map.threshold[k] <= a) ++k;
    }
    codes[i] = static_cast<std::uint8_t>(k | (is_signed && x[i] < 0.0f && k > 0 ? 0x80u : 0u));
  }
  return scale;
}

}  // namespace

double int8_relative_error_bound() { return std::exp2(1.0 / (2 * kCodesPerOctave)) - 1.0; }

double int8_floor(bool is_signed) { return (is_signed ? signed_map() : unsigned_map()).level[1]; }

float quantize_block_reference(const float* x, std::size_t n, bool is_signed, std::uint8_t* codes) {
  return quantize<false>(x, n, is_signed, codes);
}

float quantize_block(const float* x, std::size_t n, bool is_signed, std::uint8_t* codes) {
  return quantize<true>(x, n, is_signed, codes);
}

void dequantize_block(const std::uint8_t* codes, std::size_t n, float scale, bool is_signed, float* x) {
  const CodeMap& map = is_signed ? signed_map() : unsigned_map();
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned k = is_signed ? (codes[i] & 0x7fu) : codes[i];
    const double mag = static_cast<double>(scale) * map.level[k];
    x[i] = static_cast<float>(is_signed && (codes[i] & 0x80u) ? -mag : mag);
  }
}

// ---------------------------------------------------------------------------------------------------
namespace {

std::size_t blocks_of(std::size_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }
std::size_t int8_array_bytes(std::size_t n) { return blocks_of(n) * sizeof(float) + n; }

// One array: [scales (fp32, one per block)][codes (one byte per value)].
void int8_encode_array(const float* x, std::size_t n, bool is_signed, std::byte* out) {
  auto* scales = reinterpret_cast<float*>(out);
  auto* codes = reinterpret_cast<std::uint8_t*>(out + blocks_of(n) * sizeof(float));
  const auto nb = static_cast<std::int64_t>(blocks_of(n));
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::size_t i0 = static_cast<std::size_t>(b) * kQuantBlock;
    scales[b] = quantize_block(x + i0, std::min(kQuantBlock, n - i0), is_signed, codes + i0);
  }
}

void int8_decode_array(const std::byte* in, std::size_t n, bool is_signed, float* x) {
  const auto* scales = reinterpret_cast<const float*>(in);
  const auto* codes = reinterpret_cast<const std::uint8_t*>(in + blocks_of(n) * sizeof(float));
  const auto nb = static_cast<std::int64_t>(blocks_of(n));
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::size_t i0 = static_cast<std::size_t>(b) * kQuantBlock;
    dequantize_block(codes + i0, std::min(kQuantBlock, n - i0), scales[b], is_signed, x + i0);
  }
}

// lossless: [u64 frame bytes x 8][8 zstd frames], the planes of m (byte 0..3) then of v.
constexpr int kPlanes = 8;
constexpr int kZstdLevel = 1;  // ~the ratio of level 3 on these planes, several times faster

std::vector<std::uint8_t>& plane_scratch(std::size_t bytes) {
  thread_local std::vector<std::uint8_t> scratch;
  if (scratch.size() < bytes) scratch.resize(bytes);
  return scratch;
}

std::size_t lossless_encode(const float* m, const float* v, std::size_t n, std::byte* out) {
  std::uint8_t* plane = plane_scratch(n).data();
  auto* sizes = reinterpret_cast<std::uint64_t*>(out);
  std::size_t used = kPlanes * sizeof(std::uint64_t);
  for (int p = 0; p < kPlanes; ++p) {
    const auto* src = reinterpret_cast<const std::uint8_t*>(p < 4 ? m : v);
    const int byte = p % 4;
    for (std::size_t i = 0; i < n; ++i) plane[i] = src[4 * i + static_cast<std::size_t>(byte)];
    const std::size_t z = ZSTD_compress(out + used, ZSTD_compressBound(n), plane, n, kZstdLevel);
    if (ZSTD_isError(z)) throw std::runtime_error(std::string("zstd compression failed: ") + ZSTD_getErrorName(z));
    sizes[p] = z;
    used += z;
  }
  return used;
}

void lossless_decode(const std::byte* in, std::size_t bytes, std::size_t n, float* m, float* v) {
  if (bytes < kPlanes * sizeof(std::uint64_t)) throw std::runtime_error("lossless moments: encoding too short");
  std::uint8_t* plane = plane_scratch(n).data();
  std::uint64_t sizes[kPlanes];
  std::memcpy(sizes, in, sizeof(sizes));
  std::size_t pos = sizeof(sizes);
  for (int p = 0; p < kPlanes; ++p) {
    if (sizes[p] > bytes - pos) throw std::runtime_error("lossless moments: plane sizes exceed the encoding");
    const std::size_t d = ZSTD_decompress(plane, n, in + pos, sizes[p]);
    if (ZSTD_isError(d) || d != n)
      throw std::runtime_error("lossless moments: plane " + std::to_string(p) + " does not decode to " +
                               std::to_string(n) + " bytes" +
                               (ZSTD_isError(d) ? std::string(": ") + ZSTD_getErrorName(d) : ""));
    auto* dst = reinterpret_cast<std::uint8_t*>(p < 4 ? m : v);
    const int byte = p % 4;
    for (std::size_t i = 0; i < n; ++i) dst[4 * i + static_cast<std::size_t>(byte)] = plane[i];
    pos += sizes[p];
  }
  if (pos != bytes) throw std::runtime_error("lossless moments: trailing bytes after the planes");
}

}  // namespace

std::size_t encoded_bound(MomentCodec c, std::size_t n) {
  switch (c) {
    case MomentCodec::none:
      return 2 * n * sizeof(float);
    case MomentCodec::lossless:
      return kPlanes * (sizeof(std::uint64_t) + ZSTD_compressBound(n));
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
