// The split master (kernels/master_halves.hpp): the codec is exact on every high half with the low
// halves that matter, and the fused AdamW over the halves gives the very bits of the fp32-master kernel
// (adamw_bf16copy) step after step, ties, -0, subnormals, infinities and NaNs included.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/master_halves.hpp"

namespace {

using mt::bits_float;
using mt::float_bits;

// What splitting then joining must give back: the value itself, a signalling NaN in its quiet form.
std::uint32_t expected_round_trip(std::uint32_t u) { return mt::is_nan_bits(u) ? (u | 0x00400000u) : u; }

}  // namespace

TEST_CASE("split master codec: exact for every high half with the boundary low halves", "[master_halves]") {
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::uint32_t> any16(0, 0xffff);
  std::size_t checked = 0, ties_up = 0, ties_down = 0, mismatched = 0;
  for (std::uint32_t hi = 0; hi <= 0xffff; ++hi) {
    for (std::uint32_t lo : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0xfffeu, 0xffffu, any16(rng), any16(rng)}) {
      const std::uint32_t u = (hi << 16) | lo;
      const float p = bits_float(u);
      const mt::MasterHalves h = mt::split_master_reference(p);
      const float back = mt::join_master_reference(h.high, h.low, h.rounded_up);
      if (h.high != mt::cpu::bf16_round_reference(p) || float_bits(back) != expected_round_trip(u)) ++mismatched;
      if (lo == 0x8000u && !mt::is_nan_bits(u)) (h.rounded_up ? ties_up : ties_down)++;
      ++checked;
    }
  }
  INFO(checked << " patterns");
  CHECK(mismatched == 0);
  // both kinds of tie occur (odd truncations round up, even ones down), so the tie bit is exercised
  CHECK(ties_up > 30000);
  CHECK(ties_down > 30000);
}

TEST_CASE("split master codec: the tie bit is the only extra bit and v's sign holds it", "[master_halves]") {
  // 0x3f81'8000 is a tie rounding up to 0x3f82; 0x3f82'8000 a tie rounding down to 0x3f82: same halves.
  const float up = bits_float(0x3f818000u), down = bits_float(0x3f828000u);
  const mt::MasterHalves a = mt::split_master_reference(up), b = mt::split_master_reference(down);
  CHECK(a.high == b.high);
  CHECK(a.low == b.low);
  CHECK(a.rounded_up != b.rounded_up);
  const float v = 3.5e-7f;
  const float v_up = mt::v_with_tie_bit(v, true);
  CHECK(mt::tie_bit_of(v_up));
  CHECK(float_bits(mt::plain_v(v_up)) == float_bits(v));
  CHECK(float_bits(mt::join_master_reference(a.high, a.low, mt::tie_bit_of(v_up))) == 0x3f818000u);
  // a NaN v keeps its sign and never reads as a tie
  const float neg_nan = bits_float(0xffc00001u);
  CHECK_FALSE(mt::tie_bit_of(neg_nan));
  CHECK(float_bits(mt::plain_v(neg_nan)) == 0xffc00001u);
}

TEST_CASE("split_masters / join_masters over arrays, and bad v refused before anything is written", "[master_halves]") {
  const std::size_t n = 70001;
  std::mt19937 rng(9);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::vector<float> p(n), v(n, 0.0f), back(n), plain(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = bits_float(bits(rng));
  for (std::size_t i = 0; i < 64; ++i) p[i] = bits_float(0x40000000u + (static_cast<std::uint32_t>(i) << 16) + 0x8000u);
  for (int threads : {1, 2}) {
    std::vector<mt::bf16_t> high(n);
    std::vector<std::uint16_t> low(n);
    std::vector<float> vt(v);
    mt::cpu::split_masters(p.data(), high.data(), low.data(), vt.data(), n, threads);
    mt::cpu::join_masters(high.data(), low.data(), vt.data(), back.data(), n, threads);
    mt::cpu::plain_vs(vt.data(), plain.data(), n, threads);
    std::size_t wrong = 0, tie_bits = 0;
    for (std::size_t i = 0; i < n; ++i) {
      wrong += float_bits(back[i]) != expected_round_trip(float_bits(p[i])) ||
               high[i] != mt::cpu::bf16_round_reference(p[i]) || float_bits(plain[i]) != 0u;
      tie_bits += mt::tie_bit_of(vt[i]);
    }
    CHECK(wrong == 0);
    CHECK(tie_bits == 32);  // the odd truncations among the 64 planted ties
  }
  std::vector<mt::bf16_t> high(n, 7);
  std::vector<std::uint16_t> low(n, 7);
  std::vector<float> bad(n, 1.0f);
  bad[4242] = -0.0f;
  REQUIRE_THROWS_WITH(mt::cpu::split_masters(p.data(), high.data(), low.data(), bad.data(), n, 2),
                      Catch::Contains("element 4242") && Catch::Contains("negative"));
  CHECK(high[0] == 7);  // nothing written
  CHECK(float_bits(bad[0]) == float_bits(1.0f));
}

namespace {

// A state whose updates cross every special case: random values, planted ties of both parities that a
// zero gradient keeps as ties (no decay on them), -0, subnormals, infinities, a value that rounds to
// inf, NaN gradients and masters.
struct Planted {
  std::vector<float> p, g, m, v;
  explicit Planted(std::size_t n) : p(n), g(n), m(n), v(n, 0.0f) {
    std::mt19937 rng(17);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = normal(rng) * 0.05f;
      g[i] = normal(rng) * 0.1f;
      m[i] = 0.0f;
    }
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const float specials[] = {
        -0.0f, 0.0f, 1e-40f, -3e-42f, inf, -inf, bits_float(0x7f7fffffu), nan, bits_float(0xffc01234u)};
    std::size_t k = 0;
    for (float x : specials) p[k++] = x;
    g[k++] = nan;                                  // NaN gradient: m, v and p turn NaN
    g[k++] = inf;                                  // v = inf, p NaN
    for (std::uint32_t i = 0; i < 40; ++i, ++k) {  // ties, kept by a zero gradient
      p[k] = bits_float(0x3c000000u + (i << 16) + 0x8000u);
      g[k] = 0.0f;
    }
    for (std::uint32_t i = 0; i < 8; ++i, ++k) p[k] = bits_float(0x00008000u + (i << 16));  // subnormal ties
  }
};

}  // namespace

TEST_CASE("adamw_split_master: the bits of adamw_bf16copy, step after step", "[master_halves][adamw]") {
  mt::AdamWHyper h;
  h.lr = 0.01f;
  h.weight_decay = 0.0f;  // the planted ties stay ties under a zero gradient
  for (std::size_t n : {std::size_t{77}, std::size_t{4099}, std::size_t{100003}}) {
    for (int threads : {1, 2, 3}) {
      INFO("n=" << n << " threads=" << threads);
      Planted fp32(n);
      std::vector<mt::bf16_t> copy(n), high(n);
      std::vector<std::uint16_t> low(n);
      std::vector<float> m(fp32.m), v(fp32.v), joined(n), plain(n);
      mt::cpu::split_masters(fp32.p.data(), high.data(), low.data(), v.data(), n, threads);
      // the planted signalling-free NaNs are quiet already, so the split starts from fp32.p exactly
      std::size_t tie_bits_seen = 0, differing = 0;
      for (int step = 1; step <= 12; ++step) {
        const auto s = mt::make_adamw_step(h, step, step % 3 == 0 ? 0.5f : 1.0f);
        mt::cpu::adamw_bf16copy(fp32.p.data(), fp32.g.data(), fp32.m.data(), fp32.v.data(), copy.data(), n, s, threads);
        mt::cpu::adamw_split_master(high.data(), low.data(), fp32.g.data(), m.data(), v.data(), n, s, threads);
        mt::cpu::join_masters(high.data(), low.data(), v.data(), joined.data(), n, threads);
        mt::cpu::plain_vs(v.data(), plain.data(), n, threads);
        for (std::size_t i = 0; i < n; ++i) {
          differing += float_bits(joined[i]) != float_bits(fp32.p[i]) || float_bits(m[i]) != float_bits(fp32.m[i]) ||
                       float_bits(plain[i]) != float_bits(fp32.v[i]) || high[i] != copy[i];
          tie_bits_seen += mt::tie_bit_of(v[i]);
        }
      }
      CHECK(differing == 0);
      CHECK(tie_bits_seen >= 12 * 20);  // the planted odd ties carry the bit through every step
      CHECK(std::isnan(joined[9]));     // the NaN gradient reached the master, as in the fp32 path
    }
  }
}

TEST_CASE("adamw_split_master_reference agrees with the fast kernel within AdamW's rounding",
          "[master_halves][adamw]") {
  mt::AdamWHyper h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  const std::size_t n = 4099;
  Planted a(n);
  std::vector<mt::bf16_t> high(n);
  std::vector<std::uint16_t> low(n);
  std::vector<float> v(n, 0.0f);
  mt::cpu::split_masters(a.p.data(), high.data(), low.data(), v.data(), n, 1);
  std::vector<mt::bf16_t> high_ref(high);
  std::vector<std::uint16_t> low_ref(low);
  std::vector<float> m(a.m), m_ref(a.m), v_ref(v);
  const auto s = mt::make_adamw_step(h, 3, 1.0f);
  mt::cpu::adamw_split_master(high.data(), low.data(), a.g.data(), m.data(), v.data(), n, s, 2);
  mt::cpu::adamw_split_master_reference(high_ref.data(), low_ref.data(), a.g.data(), m_ref.data(), v_ref.data(), n, s);
  std::vector<float> p(n), p_ref(n);
  mt::cpu::join_masters(high.data(), low.data(), v.data(), p.data(), n, 1);
  mt::cpu::join_masters(high_ref.data(), low_ref.data(), v_ref.data(), p_ref.data(), n, 1);
  std::size_t off = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(p[i]) || std::isnan(p_ref[i])) {
      off += std::isnan(p[i]) != std::isnan(p_ref[i]);
      continue;
    }
    if (std::isinf(p[i]) || std::isinf(p_ref[i])) {
      off += p[i] != p_ref[i];
      continue;
    }
    off += std::abs(p[i] - p_ref[i]) > 1e-6f * std::max(1.0f, std::abs(p_ref[i]));
    off += high_ref[i] != mt::cpu::bf16_round_reference(p_ref[i]);
  }
  CHECK(off == 0);
}
