// bf16 compute: conversions (every path against the scalar reference), the bf16 linear products against
// an fp64 reference on the same bf16 inputs, and thread-count independence.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/ops_bf16.hpp"
#include "tests/kernels/kernel_test_util.hpp"

using namespace mt;
using std::vector;

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

vector<bf16_t> rounded(const vector<float>& x) {
  vector<bf16_t> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = cpu::bf16_round_reference(x[i]);
  return y;
}

}  // namespace

TEST_CASE("bf16 rounding: ties, denormals, inf, NaN", "[bf16][convert]") {
  using cpu::bf16_round_reference;
  CHECK(bf16_round_reference(1.0f) == 0x3f80);
  CHECK(bf16_round_reference(from_bits(0x3f808000)) == 0x3f80);  // tie, even below: stays
  CHECK(bf16_round_reference(from_bits(0x3f818000)) == 0x3f82);  // tie, odd below: rounds up to even
  CHECK(bf16_round_reference(from_bits(0x3f808001)) == 0x3f81);  // above the tie
  CHECK(bf16_round_reference(from_bits(0x3f807fff)) == 0x3f80);  // below the tie
  CHECK(bf16_round_reference(from_bits(0xbf818000)) == 0xbf82);  // negative tie
  CHECK(bf16_round_reference(from_bits(0x00018000)) == 0x0002);  // denormal tie to even, not flushed
  CHECK(bf16_round_reference(from_bits(0x00008000)) == 0x0000);  // smallest tie rounds to (even) zero
  CHECK(bf16_round_reference(from_bits(0x007fffff)) == 0x0080);  // largest denormal rounds to the smallest normal
  CHECK(bf16_round_reference(from_bits(0x7f7fffff)) == 0x7f80);  // max float rounds to inf
  CHECK(bf16_round_reference(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bf16_round_reference(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(bf16_round_reference(from_bits(0x7f800001)) == 0x7fc0);  // signalling NaN: quieted, not inf
  CHECK(bf16_round_reference(from_bits(0xffc12345)) == 0xffc1);  // sign and upper payload kept
  CHECK(bf16_round_reference(-0.0f) == 0x8000);
  CHECK(std::isnan(cpu::bf16_to_float(bf16_round_reference(std::nanf("")))));
  for (std::uint32_t h : {0x0000u, 0x0001u, 0x3f80u, 0x7f7fu, 0x7f80u, 0xff80u, 0x8001u})
    CHECK(bf16_round_reference(cpu::bf16_to_float(static_cast<bf16_t>(h))) == h);  // widening is exact
}

TEST_CASE("bf16 conversion: every path and thread count gives the reference bits", "[bf16][convert]") {
  // Random bit patterns (all classes: denormals, NaNs, infs, ties) plus planted edge values, long enough
  // to take the threaded split.
  const std::size_t n = 100003;
  vector<float> x(n);
  std::mt19937 rng(7);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u = rng();
    switch (i % 7) {
      case 0:
        u &= 0x807fffffu;
        break;  // denormal or zero
      case 1:
        u = (u & 0xffff0000u) | 0x8000u;
        break;  // exact tie
      case 2:
        u |= 0x7f800000u;
        break;  // inf or NaN
      default:
        break;
    }
    x[i] = from_bits(u);
  }
  const vector<bf16_t> ref = rounded(x);
  INFO("avx512bf16 available: " << cpu::cpu_has_avx512_bf16());
  for (auto path : {cpu::Bf16Path::automatic, cpu::Bf16Path::portable, cpu::Bf16Path::avx512bf16})
    for (int threads : {1, 2, 3}) {
      INFO("path " << static_cast<int>(path) << " threads " << threads);
      for (std::size_t off : {std::size_t{0}, std::size_t{5}}) {  // unaligned starts and tails
        vector<bf16_t> y(n - off, 0x1234);
        cpu::to_bf16(x.data() + off, y.data(), n - off, threads, path);
        CHECK(std::memcmp(y.data(), ref.data() + off, y.size() * 2) == 0);
      }
    }
  vector<float> back(n);
  cpu::from_bf16(ref.data(), back.data(), n, 2);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, &back[i], 4);
    REQUIRE(u == static_cast<std::uint32_t>(ref[i]) << 16);
  }
}

TEST_CASE("bf16 linear products match an fp64 reference on the same bf16 inputs", "[bf16][matmul]") {
  // The inputs are exactly representable, so the only difference from the fp64 reference is fp32
  // accumulation: about sqrt(K) * 2^-24 relative per element for random signs; we allow 1e-5 norm-wise
  // (K <= 700 here: sqrt(700) * 6e-8 = 1.6e-6, with room for oneDNN's blocked partial sums).
  struct Shape {
    std::int64_t N, in, out;
  };
  for (const Shape& s : {Shape{7, 5, 3}, Shape{64, 48, 80}, Shape{333, 257, 129}, Shape{40, 700, 1100},
                         Shape{1, 64, 64}, Shape{520, 96, 24}}) {
    INFO("N=" << s.N << " in=" << s.in << " out=" << s.out);
    const auto x = rounded(mt::test::randn(s.N * s.in, 1)), W = rounded(mt::test::randn(s.out * s.in, 2, 0.1));
    const auto bias = rounded(mt::test::randn(s.out, 3)), dy = rounded(mt::test::randn(s.N * s.out, 4));
    const auto acc0 = mt::test::randn(s.out * s.in, 5), dx0 = mt::test::randn(s.N * s.in, 6);
    vector<double> y_ref(s.N * s.out), dx_ref(dx0.begin(), dx0.end()), dW_ref(acc0.begin(), acc0.end());
    cpu::linear_forward_bf16_reference(x.data(), W.data(), bias.data(), y_ref.data(), s.N, s.in, s.out);
    cpu::linear_backward_input_bf16_reference(dy.data(), W.data(), dx_ref.data(), s.N, s.in, s.out, true);
    cpu::linear_backward_weight_bf16_reference(dy.data(), x.data(), dW_ref.data(), s.N, s.in, s.out);
    vector<float> y1, dx1, dW1, y_nb_ref_check;
    for (int threads : {1, 2, 3}) {
      INFO("threads " << threads);
      vector<float> y(s.N * s.out), dx = dx0, dW = acc0, dx_set(s.N * s.in, 7.0f);
      cpu::linear_forward_bf16(x.data(), W.data(), bias.data(), y.data(), s.N, s.in, s.out, threads);
      cpu::linear_backward_input_bf16(dy.data(), W.data(), dx.data(), s.N, s.in, s.out, true, threads);
      cpu::linear_backward_input_bf16(dy.data(), W.data(), dx_set.data(), s.N, s.in, s.out, false, threads);
      cpu::linear_backward_weight_bf16(dy.data(), x.data(), dW.data(), s.N, s.in, s.out, threads);
      CHECK(mt::test::rel_err(y, y_ref) < 1e-5);
      CHECK(mt::test::rel_err(dx, dx_ref) < 1e-5);
      CHECK(mt::test::rel_err(dW, dW_ref) < 1e-5);
      vector<double> dx_set_ref(s.N * s.in, 0.0);
      cpu::linear_backward_input_bf16_reference(dy.data(), W.data(), dx_set_ref.data(), s.N, s.in, s.out, false);
      CHECK(mt::test::rel_err(dx_set, dx_set_ref) < 1e-5);
      // no bias
      vector<float> y_nb(s.N * s.out);
      vector<double> y_nb_ref(s.N * s.out);
      cpu::linear_forward_bf16(x.data(), W.data(), nullptr, y_nb.data(), s.N, s.in, s.out, threads);
      cpu::linear_forward_bf16_reference(x.data(), W.data(), nullptr, y_nb_ref.data(), s.N, s.in, s.out);
      CHECK(mt::test::rel_err(y_nb, y_nb_ref) < 1e-5);
      if (threads == 1) {
        y1 = y, dx1 = dx, dW1 = dW;
      } else {  // bit for bit whatever the thread count
        CHECK(std::memcmp(y.data(), y1.data(), y.size() * 4) == 0);
        CHECK(std::memcmp(dx.data(), dx1.data(), dx.size() * 4) == 0);
        CHECK(std::memcmp(dW.data(), dW1.data(), dW.size() * 4) == 0);
      }
    }
  }
  INFO("oneDNN implementation for 333x257x129: " << cpu::linear_bf16_impl_name(333, 257, 129));
  CHECK(std::string(cpu::linear_bf16_impl_name(333, 257, 129)).size() > 0);
}
