// Moment codecs: none and lossless give back the same bits; int8's reference and fast quantisers agree
// code for code, every decoded value is within the stated bound, and an independent numpy quantiser
// (log-domain rounding instead of thresholds) gives the same codes (ties aside) and scales.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>

#include "storage/offload/moment_codec.hpp"
#include "tests/storage/offload/offload_test_util.hpp"

using namespace mt;
using namespace mt::offload;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("none and lossless moment codecs round-trip bit for bit and lossless is smaller") {
  // 100,016 floats (not a multiple of a block), and 2,100,003 (lossless: three chunks, the last short).
  for (const std::size_t n : {std::size_t{100'016}, std::size_t{2'100'003}}) {
    INFO(n << " floats");
    std::vector<float> m(n), v(n), m2(n), v2(n);
    test::fake_moments(n, 1, m.data(), v.data());
    m[3] = -0.0f;
    m[5] = std::nanf("");
    for (MomentCodec c : {MomentCodec::none, MomentCodec::lossless}) {
      std::vector<std::byte> enc(encoded_bound(c, n));
      const std::size_t bytes = encode_moments(c, m.data(), v.data(), n, enc.data());
      std::fill(m2.begin(), m2.end(), 7.0f);  // nothing left from the previous codec's decode
      std::fill(v2.begin(), v2.end(), 7.0f);
      decode_moments(c, enc.data(), bytes, n, m2.data(), v2.data());
      CHECK(same_bits(m, m2));
      CHECK(same_bits(v, v2));
      if (c == MomentCodec::lossless) CHECK(bytes < 2 * n * sizeof(float));
      if (c == MomentCodec::lossless) {
        enc[bytes / 2] ^= std::byte{0x40};  // damage inside a zstd frame: an error, never silent garbage
        bool threw = false;
        try {
          decode_moments(c, enc.data(), bytes, n, m2.data(), v2.data());
        } catch (const std::runtime_error&) {
          threw = true;
        }
        if (!threw) CHECK_FALSE(same_bits(m, m2));  // zstd frames have no checksum here: the file's blocks do
      }
    }
  }
}

TEST_CASE("int8 quantiser: reference and fast agree and decoded values are within the bound") {
  const std::size_t n = 5 * kQuantBlock + 77;
  std::vector<float> m(n), v(n), m2(n), v2(n);
  test::fake_moments(n, 2, m.data(), v.data());
  for (std::size_t i = 256; i < 512; ++i) m[i] = 0.0f;  // an all-zero block
  v[600] = 1e-30f;                                      // far below the floor: never decodes to 0
  std::vector<std::uint8_t> ca(kQuantBlock), cb(kQuantBlock);
  for (const bool sgn : {true, false}) {
    const std::vector<float>& x = sgn ? m : v;
    for (std::size_t i0 = 0; i0 < n; i0 += kQuantBlock) {
      const std::size_t k = std::min(kQuantBlock, n - i0);
      const float sa = quantize_block_reference(x.data() + i0, k, sgn, ca.data());
      const float sb = quantize_block(x.data() + i0, k, sgn, cb.data());
      REQUIRE(sa == sb);
      REQUIRE(std::memcmp(ca.data(), cb.data(), k) == 0);
    }
  }
  std::vector<std::byte> enc(encoded_bound(MomentCodec::int8, n));
  const std::size_t bytes = encode_moments(MomentCodec::int8, m.data(), v.data(), n, enc.data());
  CHECK(static_cast<double>(bytes) / static_cast<double>(n) < 2.05);  // ~2 bytes per parameter for m and v
  decode_moments(MomentCodec::int8, enc.data(), bytes, n, m2.data(), v2.data());
  const double rel = int8_relative_error_bound();
  for (std::size_t i0 = 0; i0 < n; i0 += kQuantBlock) {
    const std::size_t k = std::min(kQuantBlock, n - i0);
    for (const bool sgn : {true, false}) {
      const std::vector<float>& x = sgn ? m : v;
      const std::vector<float>& y = sgn ? m2 : v2;
      double scale = 0;
      for (std::size_t i = i0; i < i0 + k; ++i) scale = std::max(scale, std::fabs(static_cast<double>(x[i])));
      for (std::size_t i = i0; i < i0 + k; ++i) {
        const double err = std::fabs(static_cast<double>(x[i]) - y[i]);
        const double bound = std::max(rel * std::fabs(static_cast<double>(x[i])), int8_floor(sgn) * scale) * 1.0001;
        INFO("i=" << i << " signed=" << sgn << " x=" << x[i] << " decoded=" << y[i]);
        REQUIRE(err <= bound);
        if (!sgn && x[i] > 0) REQUIRE(y[i] > 0);  // v never decodes to 0
        if (sgn && x[i] != 0 && y[i] != 0) REQUIRE(std::signbit(x[i]) == std::signbit(y[i]));
      }
    }
  }
  CHECK(m2[300] == 0.0f);  // the zero block stays zero
}

TEST_CASE("int8 quantiser: the fast path equals the reference over 40 octaves of magnitudes") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> octave(-40.0, 0.0);
  std::vector<float> x(kQuantBlock);
  std::vector<std::uint8_t> ca(kQuantBlock), cb(kQuantBlock);
  for (int b = 0; b < 2000; ++b) {
    for (auto& e : x) e = static_cast<float>(std::exp2(octave(rng)) * (rng() % 2 ? 1 : -1));
    for (const bool sgn : {true, false}) {
      REQUIRE(quantize_block_reference(x.data(), kQuantBlock, sgn, ca.data()) ==
              quantize_block(x.data(), kQuantBlock, sgn, cb.data()));
      REQUIRE(std::memcmp(ca.data(), cb.data(), kQuantBlock) == 0);
    }
  }
}

TEST_CASE("int8 quantiser: the fast path equals the reference at the thresholds, zeros, NaN and short blocks") {
  // For every threshold of both maps, a block whose largest magnitude is 1 (scale 1, so |x| meets the
  // thresholds as it is): 1, the nearest floats below, at and above the threshold, a NaN, 0, -0, and
  // the one below again; 8 values (two vector steps), then 5..7 (a step and a scalar tail).
  std::vector<std::uint8_t> ca(8), cb(8);
  int straddled = 0;
  for (const bool sgn : {true, false}) {
    const int levels = sgn ? kSignedLevels : kUnsignedLevels;
    for (int k = 0; k < levels; ++k) {
      // Threshold 0: half the lowest level (m), the smallest positive value (v); then geometric midpoints.
      const double threshold = k > 0 ? std::exp2(-(levels - k - 0.5) / kCodesPerOctave)
                               : sgn ? int8_floor(true) / 2
                                     : std::numeric_limits<float>::denorm_min();
      const float f = static_cast<float>(threshold), below = std::nextafter(f, 0.0f), above = std::nextafter(f, 2.0f);
      const float s = k % 2 ? -1.0f : 1.0f;  // m's signs both ways
      const float x[8] = {1.0f, s * below, s * f,    s * above, std::numeric_limits<float>::quiet_NaN(),
                          0.0f, -0.0f,     s * below};
      for (const std::size_t len : {std::size_t{8}, std::size_t{7}, std::size_t{6}, std::size_t{5}}) {
        INFO((sgn ? "m" : "v") << " threshold " << k << ", " << len << " values");
        REQUIRE(quantize_block_reference(x, len, sgn, ca.data()) == quantize_block(x, len, sgn, cb.data()));
        REQUIRE(std::memcmp(ca.data(), cb.data(), len) == 0);
      }
      straddled += (ca[1] & 0x7f) != (ca[3] & 0x7f);
      CHECK(ca[4] == 0);  // the NaN
    }
  }
  // The blocks really straddle thresholds (the neighbours below and above get different codes), so
  // the comparison tests the boundaries, not only the middles.
  CHECK(straddled == kSignedLevels + kUnsignedLevels);
  // All zeros: scale 0, every code 0; a NaN codes as 0 (skipped by the scale).
  std::vector<float> zeros(kQuantBlock, 0.0f);
  zeros[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::uint8_t> cz(kQuantBlock);
  for (const bool sgn : {true, false}) {
    CHECK(quantize_block(zeros.data(), kQuantBlock, sgn, cz.data()) == 0.0f);
    CHECK(std::all_of(cz.begin(), cz.end(), [](std::uint8_t c) { return c == 0; }));
  }
}

TEST_CASE("int8 dequantiser: the fast path gives the reference's bits for every code") {
  std::vector<std::uint8_t> codes(256 + 3);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i * 37 + 11);  // every byte
  std::vector<float> a(codes.size()), b(codes.size());
  for (const float scale : {0.0f, 1.0f, 3.7e-5f, 1e30f, std::numeric_limits<float>::denorm_min()})
    for (const bool sgn : {true, false})
      for (const std::size_t n : {codes.size(), std::size_t{5}}) {  // 5: a tail after one vector
        INFO("scale " << scale << (sgn ? " signed" : " unsigned") << ", " << n << " values");
        dequantize_block_reference(codes.data(), n, scale, sgn, a.data());
        dequantize_block(codes.data(), n, scale, sgn, b.data());
        REQUIRE(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
      }
}

TEST_CASE("int8 quantiser matches an independent numpy quantiser") {
  test::OffloadTempDir tmp;
  const std::size_t n = 40 * kQuantBlock + 13;
  std::vector<float> x(n), unused(n);
  test::fake_moments(n, 3, x.data(), unused.data());
  const std::string in = tmp.path() + "/x.f32", out = tmp.path() + "/codes.bin";
  std::ofstream(in, std::ios::binary)
      .write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(n * 4));
  const std::string cmd = std::string(MEGATRAIN_PYTHON) +
                          " " MEGATRAIN_SOURCE_DIR "/tests/storage/offload/int8_oracle.py " + in + " " + out;
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream f(out, std::ios::binary);
  const std::size_t nb = (n + kQuantBlock - 1) / kQuantBlock;
  std::vector<std::uint8_t> cm(n), cv(n);
  std::vector<float> sm(nb), sv(nb);
  f.read(reinterpret_cast<char*>(cm.data()), static_cast<std::streamsize>(n));
  f.read(reinterpret_cast<char*>(cv.data()), static_cast<std::streamsize>(n));
  f.read(reinterpret_cast<char*>(sm.data()), static_cast<std::streamsize>(nb * 4));
  f.read(reinterpret_cast<char*>(sv.data()), static_cast<std::streamsize>(nb * 4));
  REQUIRE(f.good());
  std::vector<float> ax(n);
  for (std::size_t i = 0; i < n; ++i) ax[i] = std::fabs(x[i]);
  std::size_t differ = 0;
  std::vector<std::uint8_t> codes(kQuantBlock);
  for (const bool sgn : {true, false}) {
    const std::vector<float>& src = sgn ? x : ax;
    for (std::size_t b = 0; b < nb; ++b) {
      const std::size_t i0 = b * kQuantBlock, k = std::min(kQuantBlock, n - i0);
      const float scale = quantize_block(src.data() + i0, k, sgn, codes.data());
      REQUIRE(scale == (sgn ? sm : sv)[b]);
      for (std::size_t i = 0; i < k; ++i) {
        const int ours = codes[i], theirs = (sgn ? cm : cv)[i0 + i];
        if (ours != theirs) {
          ++differ;
          REQUIRE(std::abs((ours & 0x7f) - (theirs & 0x7f)) <= 1);  // a tie rounded the other way
        }
      }
    }
  }
  CHECK(differ <= n / 10000 + 1);
}
