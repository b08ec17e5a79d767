#include "storage/hf/dtype.hpp"

#include <cstring>
#include <map>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace mt::hf {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
  }
  return "?";
}

std::optional<DType> parse_dtype(const std::string& name) {
  if (name == "F32") return DType::f32;
  if (name == "BF16") return DType::bf16;
  if (name == "F16") return DType::f16;
  return std::nullopt;
}

std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

std::size_t safetensors_dtype_size(const std::string& name) {
  static const std::map<std::string, std::size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(name);
  return it == sizes.end() ? 0 : it->second;
}

namespace {

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);  // inf / nan
  if (abs >= 0x477ff000u) return sign | 0x7c00u;                                      // overflow -> inf
  if (abs < 0x38800000u) {                                                            // subnormal or zero
    if (abs < 0x33000000u) return sign;
    const std::uint32_t e = abs >> 23, m = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // into the 10-bit subnormal mantissa
    const std::uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    std::uint32_t r = m >> shift;
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<std::uint16_t>(r);
  }
  std::uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  const std::uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return sign | static_cast<std::uint16_t>(r);
}

}  // namespace

void to_f32(DType src_type, const void* src, float* dst, std::size_t n) {
  switch (src_type) {
    case DType::f32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::bf16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t bits = static_cast<std::uint32_t>(s[i]) << 16;
        std::memcpy(dst + i, &bits, 4);
      }
      return;
    }
    case DType::f16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      std::size_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
      for (; i < n; ++i) dst[i] = half_to_float(s[i]);
      return;
    }
  }
}

void from_f32(DType dst_type, const float* src, void* dst, std::size_t n) {
  switch (dst_type) {
    case DType::f32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::bf16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t x;
        std::memcpy(&x, src + i, 4);
        if ((x & 0x7fffffffu) > 0x7f800000u) {
          d[i] = static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet nan
        } else {
          x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
          d[i] = static_cast<std::uint16_t>(x >> 16);
        }
      }
      return;
    }
    case DType::f16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (std::size_t i = 0; i < n; ++i) d[i] = float_to_half(src[i]);
      return;
    }
  }
}

}  // namespace mt::hf
