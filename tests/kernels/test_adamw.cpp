#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/cpu/bf16.hpp"

namespace {

struct State {
  std::vector<float> p, g, m, v;
  explicit State(std::size_t n, unsigned seed) : p(n), g(n), m(n), v(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = normal(rng);
      g[i] = normal(rng) * 0.1f;
      m[i] = normal(rng) * 0.01f;
      v[i] = std::abs(normal(rng)) * 1e-4f;
    }
  }
};

// The update in double precision from PyTorch's formula, written independently of both kernels.
void adamw_fp64(std::vector<double>& p, const std::vector<float>& g, std::vector<double>& m, std::vector<double>& v,
                const mt::AdamWHyper& h, int step, double scale) {
  const double b1 = h.beta1, b2 = h.beta2;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double grad = g[i] * scale;
    p[i] *= 1.0 - static_cast<double>(h.lr) * h.weight_decay;
    m[i] = b1 * m[i] + (1 - b1) * grad;
    v[i] = b2 * v[i] + (1 - b2) * grad * grad;
    const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, step)) + h.eps;
    p[i] -= h.lr / (1 - std::pow(b1, step)) * m[i] / denom;
  }
}

double max_rel_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(1e-3, std::abs(b[i])));
  return worst;
}

}  // namespace

TEST_CASE("make_adamw_step derives PyTorch's bias-corrected constants", "[adamw]") {
  mt::AdamWHyper h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  const auto s = mt::make_adamw_step(h, 3, 0.5f);
  CHECK(s.step_size == Approx(0.01 / (1 - std::pow(double(h.beta1), 3))).epsilon(1e-6));
  CHECK(s.inv_sqrt_bias2 == Approx(1 / std::sqrt(1 - std::pow(double(h.beta2), 3))).epsilon(1e-6));
  CHECK(s.decay_factor == Approx(1 - 0.001).epsilon(1e-7));
  CHECK(s.grad_scale == 0.5f);
}

TEST_CASE("make_adamw_step rejects bad hyperparameters", "[adamw]") {
  mt::AdamWHyper h;
  CHECK_THROWS_WITH(mt::make_adamw_step(h, 0), Catch::Contains("step"));
  h.beta1 = 1.0f;
  CHECK_THROWS_WITH(mt::make_adamw_step(h, 1), Catch::Contains("beta1"));
  h = {};
  h.eps = 0.0f;
  CHECK_THROWS_WITH(mt::make_adamw_step(h, 1), Catch::Contains("eps"));
  h = {};
  h.lr = std::nanf("");
  CHECK_THROWS_WITH(mt::make_adamw_step(h, 1), Catch::Contains("learning rate"));
}

TEST_CASE("fast AdamW agrees with the reference loop and an fp64 oracle", "[adamw]") {
  // Odd sizes exercise the scalar tail and uneven thread splits.
  const std::size_t n = GENERATE(1, 7, 8, 63, 4097, 100003);
  const int threads = GENERATE(1, 2, 3);
  mt::AdamWHyper h;
  h.lr = 3e-3f;
  h.weight_decay = 0.1f;
  State fast(n, 42), ref(n, 42);
  std::vector<double> p64(fast.p.begin(), fast.p.end()), m64(fast.m.begin(), fast.m.end()),
      v64(fast.v.begin(), fast.v.end());
  for (int step = 1; step <= 5; ++step) {
    const auto s = mt::make_adamw_step(h, step, 0.75f);
    mt::cpu::adamw(fast.p.data(), fast.g.data(), fast.m.data(), fast.v.data(), n, s, threads);
    mt::cpu::adamw_reference(ref.p.data(), ref.g.data(), ref.m.data(), ref.v.data(), n, s);
    adamw_fp64(p64, fast.g, m64, v64, h, step, 0.75);
  }
  CHECK(max_rel_diff(fast.p, p64) < 1e-5);
  CHECK(max_rel_diff(ref.p, p64) < 1e-5);
  CHECK(max_rel_diff(fast.m, m64) < 1e-5);
  CHECK(max_rel_diff(fast.v, v64) < 1e-5);
}

TEST_CASE("fast AdamW gives the same bits for any thread count", "[adamw]") {
  const std::size_t n = 1 << 16 | 13;
  mt::AdamWHyper h;
  h.weight_decay = 0.01f;
  State one(n, 7), many(n, 7);
  for (int step = 1; step <= 3; ++step) {
    const auto s = mt::make_adamw_step(h, step);
    mt::cpu::adamw(one.p.data(), one.g.data(), one.m.data(), one.v.data(), n, s, 1);
    mt::cpu::adamw(many.p.data(), many.g.data(), many.m.data(), many.v.data(), n, s, 4);
  }
  CHECK(one.p == many.p);
  CHECK(one.m == many.m);
  CHECK(one.v == many.v);
}

TEST_CASE("AdamW with a zero gradient only decays the weights", "[adamw]") {
  mt::AdamWHyper h;
  h.lr = 0.1f;
  h.weight_decay = 0.5f;
  std::vector<float> p(100, 2.0f), g(100, 0.0f), m(100, 0.0f), v(100, 0.0f);
  mt::cpu::adamw(p.data(), g.data(), m.data(), v.data(), p.size(), mt::make_adamw_step(h, 1), 2);
  for (float x : p) CHECK(x == Approx(2.0 * (1 - 0.05)));
}

TEST_CASE("adamw_bf16copy: p, m, v bit-identical to adamw and the copy is RNE(p)", "[adamw][bf16]") {
  mt::AdamWHyper h;
  h.lr = 0.01f;
  h.weight_decay = 0.1f;
  const auto s = mt::make_adamw_step(h, 4, 0.7f);
  for (std::size_t n : {std::size_t{13}, std::size_t{4099}, std::size_t{100003}}) {
    for (int threads : {1, 2, 3}) {
      INFO("n=" << n << " threads=" << threads);
      State a(n, 11), b(n, 11);
      if (n > 100) {  // plant values whose update lands on denormals, ties, inf and NaN
        a.p[0] = b.p[0] = 1e-39f;
        a.g[0] = b.g[0] = 0.0f;
        a.m[0] = b.m[0] = 0.0f;
        a.p[1] = b.p[1] = std::numeric_limits<float>::quiet_NaN();
        a.p[2] = b.p[2] = std::numeric_limits<float>::infinity();
        a.g[3] = b.g[3] = std::numeric_limits<float>::quiet_NaN();
      }
      std::vector<mt::bf16_t> copy(n, 0x1234), copy_ref(n, 0x4321);
      mt::cpu::adamw(a.p.data(), a.g.data(), a.m.data(), a.v.data(), n, s, threads);
      State r = b;
      mt::cpu::adamw_bf16copy(b.p.data(), b.g.data(), b.m.data(), b.v.data(), copy.data(), n, s, threads);
      CHECK(std::memcmp(a.p.data(), b.p.data(), n * 4) == 0);
      CHECK(std::memcmp(a.m.data(), b.m.data(), n * 4) == 0);
      CHECK(std::memcmp(a.v.data(), b.v.data(), n * 4) == 0);
      bool all = true;
      for (std::size_t i = 0; i < n; ++i) all = all && copy[i] == mt::cpu::bf16_round_reference(b.p[i]);
      CHECK(all);
      // the reference: same p within AdamW's fp32 rounding, copy its own RNE
      mt::cpu::adamw_bf16copy_reference(r.p.data(), r.g.data(), r.m.data(), r.v.data(), copy_ref.data(), n, s);
      bool ref_ok = true;
      for (std::size_t i = 0; i < n; ++i) ref_ok = ref_ok && copy_ref[i] == mt::cpu::bf16_round_reference(r.p[i]);
      CHECK(ref_ok);
    }
  }
}
