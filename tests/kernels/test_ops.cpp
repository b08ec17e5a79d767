// Every CPU kernel twice: its plain reference loop is checked against central differences in double,
// and the fast fp32 kernel is checked against the reference (and for thread-count independence).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <thread>

#include <omp.h>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/reference_ops.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/host_memory.hpp"
#include "kernels/step_math.hpp"
#include "kernels/tile.hpp"
#include "tests/kernels/kernel_test_util.hpp"

using namespace mt;
using mt::test::numeric_grad;
using mt::test::randn;
using mt::test::rel_err;
using std::vector;

namespace {

constexpr double kFdTol = 1e-6;    // fp64 central differences vs analytic
constexpr double kFastTol = 2e-6;  // fast fp32 kernel vs fp32 reference, norm-wise

// loss = sum(out * R): dloss/dout = R. Checks d loss / d input against the analytic gradient.
void fd_check(vector<double>& input, const vector<double>& analytic, const std::function<double()>& loss) {
  const auto numeric = numeric_grad(input, loss);
  CHECK(rel_err(analytic, numeric) < kFdTol);
}

}  // namespace

TEST_CASE("reference linear matches finite differences", "[ops][fd]") {
  const ref::i64 N = 3, in = 4, out = 5;
  auto x = mt::test::to_double(randn(N * in, 1)), W = mt::test::to_double(randn(out * in, 2)),
       b = mt::test::to_double(randn(out, 3)), R = mt::test::to_double(randn(N * out, 4));
  auto loss = [&] {
    vector<double> y(N * out);
    ref::linear(x.data(), W.data(), b.data(), y.data(), N, in, out);
    return mt::test::dot(y, R);
  };
  vector<double> dx(N * in), dW(out * in), db(out);
  ref::linear_backward(x.data(), W.data(), R.data(), dx.data(), dW.data(), db.data(), N, in, out);
  fd_check(x, dx, loss);
  fd_check(W, dW, loss);
  fd_check(b, db, loss);
}

TEST_CASE("reference norms match finite differences", "[ops][fd]") {
  const ref::i64 N = 3, D = 6;
  auto x = mt::test::to_double(randn(N * D, 5)), w = mt::test::to_double(randn(D, 6)),
       b = mt::test::to_double(randn(D, 7)), R = mt::test::to_double(randn(N * D, 8));
  SECTION("rmsnorm") {
    auto loss = [&] {
      vector<double> y(N * D);
      ref::rmsnorm(x.data(), w.data(), y.data(), N, D, 1e-5);
      return mt::test::dot(y, R);
    };
    vector<double> dx(N * D), dw(D);
    ref::rmsnorm_backward(x.data(), w.data(), R.data(), dx.data(), dw.data(), N, D, 1e-5);
    fd_check(x, dx, loss);
    fd_check(w, dw, loss);
  }
  SECTION("layernorm") {
    auto loss = [&] {
      vector<double> y(N * D);
      ref::layernorm(x.data(), w.data(), b.data(), y.data(), N, D, 1e-5);
      return mt::test::dot(y, R);
    };
    vector<double> dx(N * D), dw(D), db(D);
    ref::layernorm_backward(x.data(), w.data(), R.data(), dx.data(), dw.data(), db.data(), N, D, 1e-5);
    fd_check(x, dx, loss);
    fd_check(w, dw, loss);
    fd_check(b, db, loss);
  }
}

TEST_CASE("reference rope backward is its transpose", "[ops][fd]") {
  const ref::i64 B = 2, S = 3, H = 2, hd = 4;
  vector<float> cs(S * hd / 2), sn(S * hd / 2);
  cpu::rope_table(cpu::RopeParams{}, S, hd, cs.data(), sn.data());
  auto csd = mt::test::to_double(cs), snd = mt::test::to_double(sn);
  auto x = mt::test::to_double(randn(B * S * H * hd, 9)), R = mt::test::to_double(randn(B * S * H * hd, 10));
  auto loss = [&] {
    auto y = x;
    ref::rope(y.data(), B * S, S, H, hd, H * hd, csd.data(), snd.data(), false);
    return mt::test::dot(y, R);
  };
  auto dx = R;
  ref::rope(dx.data(), B * S, S, H, hd, H * hd, csd.data(), snd.data(), true);
  fd_check(x, dx, loss);
}

TEST_CASE("reference attention (GQA, odd length) matches finite differences", "[ops][fd]") {
  const ref::i64 B = 2, S = 5, Hq = 4, Hkv = 2, hd = 4, qs = Hq * hd, kvs = Hkv * hd;
  auto q = mt::test::to_double(randn(B * S * qs, 11)), k = mt::test::to_double(randn(B * S * kvs, 12)),
       v = mt::test::to_double(randn(B * S * kvs, 13)), R = mt::test::to_double(randn(B * S * qs, 14));
  auto loss = [&] {
    vector<double> o(B * S * qs);
    ref::attention(q.data(), k.data(), v.data(), o.data(), B, S, Hq, Hkv, hd, qs, kvs, qs);
    return mt::test::dot(o, R);
  };
  vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  ref::attention_backward(q.data(), k.data(), v.data(), R.data(), dq.data(), dk.data(), dv.data(), B, S, Hq, Hkv, hd,
                          qs, kvs, qs);
  fd_check(q, dq, loss);
  fd_check(k, dk, loss);
  fd_check(v, dv, loss);
}

TEST_CASE("reference attention with a sliding window and sinks matches finite differences", "[ops][fd]") {
  const ref::i64 B = 2, S = 6, Hq = 4, Hkv = 2, hd = 4, qs = Hq * hd, kvs = Hkv * hd, window = 3;
  auto q = mt::test::to_double(randn(B * S * qs, 11)), k = mt::test::to_double(randn(B * S * kvs, 12)),
       v = mt::test::to_double(randn(B * S * kvs, 13)), R = mt::test::to_double(randn(B * S * qs, 14)),
       sinks = mt::test::to_double(randn(Hq, 15));
  auto loss = [&] {
    vector<double> o(B * S * qs);
    ref::attention(q.data(), k.data(), v.data(), o.data(), B, S, Hq, Hkv, hd, qs, kvs, qs, 0, window, sinks.data());
    return mt::test::dot(o, R);
  };
  vector<double> dq(q.size()), dk(k.size()), dv(v.size()), ds(Hq);
  ref::attention_backward(q.data(), k.data(), v.data(), R.data(), dq.data(), dk.data(), dv.data(), B, S, Hq, Hkv, hd,
                          qs, kvs, qs, 0, window, sinks.data(), ds.data());
  fd_check(q, dq, loss);
  fd_check(k, dk, loss);
  fd_check(v, dv, loss);
  fd_check(sinks, ds, loss);
}

TEST_CASE("reference attention and rope with documents match finite differences", "[ops][fd][documents]") {
  // Documents (positions restarting at 0): row 0 holds 2 + 1 + 4 tokens, row 1 one document of 7; with a
  // window of 3 and sinks too. RoPE's backward with positions is its transpose.
  const ref::i64 B = 2, S = 7, Hq = 4, Hkv = 2, hd = 4, qs = Hq * hd, kvs = Hkv * hd;
  const std::vector<std::int32_t> pos = {0, 1, 0, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6};
  for (const ref::i64 window : {ref::i64{0}, ref::i64{3}}) {
    auto q = mt::test::to_double(randn(B * S * qs, 21)), k = mt::test::to_double(randn(B * S * kvs, 22)),
         v = mt::test::to_double(randn(B * S * kvs, 23)), R = mt::test::to_double(randn(B * S * qs, 24)),
         sinks = mt::test::to_double(randn(Hq, 25));
    const double* sk = window ? sinks.data() : nullptr;
    auto loss = [&] {
      vector<double> o(B * S * qs);
      ref::attention(q.data(), k.data(), v.data(), o.data(), B, S, Hq, Hkv, hd, qs, kvs, qs, 0, window, sk, pos.data());
      return mt::test::dot(o, R);
    };
    vector<double> dq(q.size()), dk(k.size()), dv(v.size()), ds(Hq);
    ref::attention_backward(q.data(), k.data(), v.data(), R.data(), dq.data(), dk.data(), dv.data(), B, S, Hq, Hkv, hd,
                            qs, kvs, qs, 0, window, sk, window ? ds.data() : nullptr, pos.data());
    fd_check(q, dq, loss);
    fd_check(k, dk, loss);
    fd_check(v, dv, loss);
    if (window) fd_check(sinks, ds, loss);
    // A key of another document gets no gradient: row 0's keys 0, 1 only from queries 0, 1.
    vector<double> o1(B * S * qs), o2(B * S * qs);
    ref::attention(q.data(), k.data(), v.data(), o1.data(), B, S, Hq, Hkv, hd, qs, kvs, qs, 0, window, sk, pos.data());
    for (ref::i64 i = 0; i < kvs; ++i) k[i] += 1.0;  // row 0, key 0
    ref::attention(q.data(), k.data(), v.data(), o2.data(), B, S, Hq, Hkv, hd, qs, kvs, qs, 0, window, sk, pos.data());
    for (ref::i64 i = 2 * qs; i < B * S * qs; ++i) REQUIRE(o1[i] == o2[i]);
  }
  vector<float> cs(S * hd / 2), sn(S * hd / 2);
  cpu::rope_table(cpu::RopeParams{}, S, hd, cs.data(), sn.data());
  auto csd = mt::test::to_double(cs), snd = mt::test::to_double(sn);
  auto x = mt::test::to_double(randn(B * S * Hq * hd, 26)), R = mt::test::to_double(randn(B * S * Hq * hd, 27));
  auto loss = [&] {
    auto y = x;
    ref::rope(y.data(), B * S, S, Hq, hd, Hq * hd, csd.data(), snd.data(), false, pos.data());
    return mt::test::dot(y, R);
  };
  auto dx = R;
  ref::rope(dx.data(), B * S, S, Hq, hd, Hq * hd, csd.data(), snd.data(), true, pos.data());
  fd_check(x, dx, loss);
}

TEST_CASE("reference load-balancing loss: its gradient matches finite differences, its value transformers'",
          "[ops][fd][moe]") {
  // Three layers' router outputs of 5 tokens over 6 experts, top-2: the gradient with the choices held
  // (transformers' one-hot has none) against central differences, which do not move a choice here.
  const ref::i64 N = 5, E = 6, k = 2, L = 3;
  std::vector<vector<double>> z;
  for (int l = 0; l < L; ++l) z.push_back(mt::test::to_double(randn(N * E, 70 + l, 1.5)));
  auto loss = [&] {
    std::vector<const double*> zp;
    for (const auto& v : z) zp.push_back(v.data());
    return ref::load_balancing_loss(zp, N, E, k);
  };
  vector<double> dz(L * N * E, 0.0);
  {
    std::vector<const double*> zp;
    for (const auto& v : z) zp.push_back(v.data());
    ref::load_balancing_loss(zp, N, E, k, dz.data());
  }
  for (int l = 0; l < L; ++l) {
    const vector<double> dl(dz.begin() + l * N * E, dz.begin() + (l + 1) * N * E);
    fd_check(z[static_cast<std::size_t>(l)], dl, loss);
  }
  // Balanced routing by construction (every expert chosen equally, uniform probabilities): aux = k
  // (E * sum_e (k / E) (1 / E)), the value transformers' docstring gives for a balanced router.
  const vector<double> flat(N * E, 0.0);
  std::vector<const double*> same(static_cast<std::size_t>(E), flat.data());
  CHECK(ref::load_balancing_loss(same, N, E, k) == Approx(static_cast<double>(k)));
}

TEST_CASE("reference activations and cross-entropy match finite differences", "[ops][fd]") {
  const ref::i64 n = 20;
  auto g = mt::test::to_double(randn(n, 15, 2.0)), u = mt::test::to_double(randn(n, 16)),
       R = mt::test::to_double(randn(n, 17));
  SECTION("swiglu") {
    auto loss = [&] {
      vector<double> h(n);
      ref::swiglu(g.data(), u.data(), h.data(), n);
      return mt::test::dot(h, R);
    };
    vector<double> dg(n), du(n);
    ref::swiglu_backward(g.data(), u.data(), R.data(), dg.data(), du.data(), n);
    fd_check(g, dg, loss);
    fd_check(u, du, loss);
  }
  SECTION("clamped swiglu (gpt-oss)") {  // limit 1: some of g and u clamped on either side
    auto loss = [&] {
      vector<double> h(n);
      ref::clamped_swiglu(g.data(), u.data(), h.data(), n, 1.702, 1.0);
      return mt::test::dot(h, R);
    };
    vector<double> dg(n), du(n);
    ref::clamped_swiglu_backward(g.data(), u.data(), R.data(), dg.data(), du.data(), n, 1.702, 1.0);
    fd_check(g, dg, loss);
    fd_check(u, du, loss);
    CHECK(std::count(dg.begin(), dg.end(), 0.0) > 0);  // clamped: no gradient
    CHECK(std::count(du.begin(), du.end(), 0.0) > 0);
  }
  SECTION("gelu") {
    auto loss = [&] {
      double s = 0;
      for (ref::i64 i = 0; i < n; ++i) s += ref::gelu(g[i]) * R[i];
      return s;
    };
    vector<double> dg(n);
    ref::gelu_backward(g.data(), R.data(), dg.data(), n);
    fd_check(g, dg, loss);
  }
  SECTION("cross-entropy with ignored targets") {
    const ref::i64 N = 4, V = 7;
    auto logits = mt::test::to_double(randn(N * V, 18, 3.0));
    const std::int32_t targets[N] = {3, -100, 0, 6};
    auto loss = [&] { return ref::cross_entropy(logits.data(), targets, static_cast<double*>(nullptr), N, V); };
    vector<double> d(N * V);
    ref::cross_entropy(logits.data(), targets, d.data(), N, V);
    fd_check(logits, d, loss);
  }
}

TEST_CASE("fast linear kernels match the reference", "[ops][fast]") {
  const std::int64_t N = 37, in = 29, out = 45;
  auto x = randn(N * in, 20), W = randn(out * in, 21), b = randn(out, 22), dy = randn(N * out, 23);
  vector<float> y(N * out), yr(N * out);
  cpu::linear_forward(x.data(), W.data(), b.data(), y.data(), N, in, out, 2);
  ref::linear(x.data(), W.data(), b.data(), yr.data(), N, in, out);
  CHECK(rel_err(y, yr) < kFastTol);
  vector<float> dx(N * in), dW(out * in, 0.5f), db(out, 0.25f), dxr(N * in), dWr(out * in, 0.5f), dbr(out, 0.25f);
  cpu::linear_backward_input(dy.data(), W.data(), dx.data(), N, in, out, false, 2);
  cpu::linear_backward_weight(dy.data(), x.data(), dW.data(), db.data(), N, in, out, 2);
  ref::linear_backward(x.data(), W.data(), dy.data(), dxr.data(), dWr.data(), dbr.data(), N, in, out);
  CHECK(rel_err(dx, dxr) < kFastTol);
  CHECK(rel_err(dW, dWr) < kFastTol);
  CHECK(rel_err(db, dbr) < kFastTol);
}

TEST_CASE("fast norms match the reference and ignore the thread count", "[ops][fast]") {
  const std::int64_t N = 300, D = 77;  // enough rows to go parallel, a ragged width
  auto x = randn(N * D, 30, 2.0), w = randn(D, 31), b = randn(D, 32), dy = randn(N * D, 33);
  const float eps = 1e-5f;
  SECTION("rmsnorm") {
    vector<float> y(N * D), rstd(N), yr(N * D), y1(N * D);
    cpu::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), N, D, eps, 2);
    ref::rmsnorm(x.data(), w.data(), yr.data(), N, D, eps);
    CHECK(rel_err(y, yr) < kFastTol);
    cpu::rmsnorm_forward(x.data(), w.data(), y1.data(), rstd.data(), N, D, eps, 1);
    CHECK(std::memcmp(y.data(), y1.data(), y.size() * 4) == 0);
    vector<float> dx(N * D), dw(D), dxr(N * D), dwr(D), dx1(N * D), dw1(D);
    cpu::rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), N, D, false, 2);
    cpu::rmsnorm_backward(x.data(), w.data(), rstd.data(), dy.data(), dx1.data(), dw1.data(), N, D, false, 1);
    ref::rmsnorm_backward(x.data(), w.data(), dy.data(), dxr.data(), dwr.data(), N, D, eps);
    CHECK(rel_err(dx, dxr) < kFastTol);
    CHECK(rel_err(dw, dwr) < kFastTol);
    CHECK(std::memcmp(dx.data(), dx1.data(), dx.size() * 4) == 0);
    CHECK(std::memcmp(dw.data(), dw1.data(), dw.size() * 4) == 0);
  }
  SECTION("layernorm") {
    vector<float> y(N * D), mean(N), rstd(N), yr(N * D);
    cpu::layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), N, D, eps, 2);
    ref::layernorm(x.data(), w.data(), b.data(), yr.data(), N, D, eps);
    CHECK(rel_err(y, yr) < kFastTol);
    vector<float> dx(N * D), dw(D), db(D), dxr(N * D), dwr(D), dbr(D), dx1(N * D), dw1(D), db1(D);
    cpu::layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(), dx.data(), dw.data(), db.data(), N,
                            D, false, 2);
    cpu::layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(), dx1.data(), dw1.data(), db1.data(),
                            N, D, false, 1);
    ref::layernorm_backward(x.data(), w.data(), dy.data(), dxr.data(), dwr.data(), dbr.data(), N, D, eps);
    CHECK(rel_err(dx, dxr) < kFastTol);
    CHECK(rel_err(dw, dwr) < kFastTol);
    CHECK(rel_err(db, dbr) < kFastTol);
    CHECK(std::memcmp(dx.data(), dx1.data(), dx.size() * 4) == 0);
    CHECK(std::memcmp(dw.data(), dw1.data(), dw.size() * 4) == 0);
  }
}

TEST_CASE("fast rope matches the reference, the inverse undoes it", "[ops][fast]") {
  const std::int64_t B = 3, S = 11, H = 3, hd = 8, stride = 40;  // stride > H*hd: strided rows
  cpu::RopeParams p;
  p.theta = 500000.0f;
  p.kind = cpu::RopeKind::llama3;
  p.factor = 8.0;
  p.original_max_position = 8;  // small, so all three Llama-3 regimes occur at head_dim 8
  vector<float> cs(S * hd / 2), sn(S * hd / 2);
  cpu::rope_table(p, S, hd, cs.data(), sn.data());
  auto x = randn(B * S * stride, 40);
  auto y = x, yr = x;
  cpu::rope_apply(y.data(), B * S, S, H, hd, stride, cs.data(), sn.data(), false, 2);
  ref::rope(yr.data(), B * S, S, H, hd, stride, cs.data(), sn.data(), false);
  CHECK(rel_err(y, yr) < kFastTol);
  cpu::rope_apply(y.data(), B * S, S, H, hd, stride, cs.data(), sn.data(), true, 2);
  CHECK(rel_err(y, x) < 1e-6);
}

TEST_CASE("fast attention (tiled, online softmax) matches the reference", "[ops][fast]") {
  // 150 tokens: several key tiles, a ragged last one; GQA 6 query heads on 2 kv heads; strided layouts.
  // Plain causal, then gpt-oss's forms: sliding windows (one inside a key tile, one across tiles) and
  // sinks, alone and together.
  const std::int64_t B = 2, S = 150, Hq = 6, Hkv = 2, hd = 16, qs = Hq * hd + 8, kvs = Hkv * hd + 4, os = Hq * hd;
  auto q = randn(B * S * qs, 50), k = randn(B * S * kvs, 51), v = randn(B * S * kvs, 52), dout = randn(B * S * os, 53);
  const auto sink_logits = randn(Hq, 54, 2.0);
  struct Form {
    std::int64_t window;
    bool sinks;
  };
  for (const Form f : {Form{0, false}, Form{37, false}, Form{0, true}, Form{70, true}, Form{1, true}}) {
    INFO("window " << f.window << (f.sinks ? ", sinks" : ""));
    cpu::AttnShape a{B, S, Hq, Hkv, hd, qs, kvs, os};
    a.window = f.window;
    const float* sinks = f.sinks ? sink_logits.data() : nullptr;
    vector<float> o(B * S * os), lse(B * Hq * S), orf(B * S * os);
    cpu::attention_forward(q.data(), k.data(), v.data(), sinks, false, o.data(), lse.data(), a, 2);
    ref::attention(q.data(), k.data(), v.data(), orf.data(), B, S, Hq, Hkv, hd, qs, kvs, os, 0, f.window, sinks);
    CHECK(rel_err(o, orf) < kFastTol);
    vector<float> dq(q.size()), dk(k.size()), dv(v.size()), dqr(q.size()), dkr(k.size()), dvr(v.size());
    vector<float> ds(Hq, 0.5f), dsr(Hq, 0.5f);  // both add into 0.5
    cpu::attention_backward(q.data(), k.data(), v.data(), sinks, false, o.data(), lse.data(), dout.data(), dq.data(),
                            dk.data(), dv.data(), f.sinks ? ds.data() : nullptr, a, 2);
    ref::attention_backward(q.data(), k.data(), v.data(), dout.data(), dqr.data(), dkr.data(), dvr.data(), B, S, Hq,
                            Hkv, hd, qs, kvs, os, 0, f.window, sinks, f.sinks ? dsr.data() : nullptr);
    auto strided_err = [&](const vector<float>& x, const vector<float>& y, std::int64_t stride, std::int64_t width) {
      vector<float> a1, b1;
      for (std::int64_t r = 0; r < B * S; ++r)
        for (std::int64_t i = 0; i < width; ++i) a1.push_back(x[r * stride + i]), b1.push_back(y[r * stride + i]);
      return rel_err(a1, b1);
    };
    CHECK(strided_err(dq, dqr, qs, Hq * hd) < 1e-5);
    CHECK(strided_err(dk, dkr, kvs, Hkv * hd) < 1e-5);
    CHECK(strided_err(dv, dvr, kvs, Hkv * hd) < 1e-5);
    CHECK(rel_err(ds, dsr) < 1e-5);
    if (f.sinks) CHECK(ds != vector<float>(Hq, 0.5f));
    vector<float> dq1(q.size()), dk1(k.size()), dv1(v.size()), ds1(Hq, 0.5f);
    cpu::attention_backward(q.data(), k.data(), v.data(), sinks, false, o.data(), lse.data(), dout.data(), dq1.data(),
                            dk1.data(), dv1.data(), f.sinks ? ds1.data() : nullptr, a, 1);
    CHECK(std::memcmp(dk.data(), dk1.data(), dk.size() * 4) == 0);
    CHECK(std::memcmp(dq.data(), dq1.data(), dq.size() * 4) == 0);
    CHECK(std::memcmp(ds.data(), ds1.data(), ds.size() * 4) == 0);
  }
}

TEST_CASE("fast attention: a row's output, log-sum-exp and dq do not depend on how the query rows are tiled",
          "[ops][fast]") {
  // Sequence tiles (q_start) whose length is a multiple of the 64-row query block (as device.seq_tile=auto
  // picks them: powers of two from 128) give the whole sequence's bits for out, lse and dq: a row meets its
  // keys in the same 128-wide key blocks, aligned to position 0, and its query block ends where the whole
  // sequence's does. Other lengths end query blocks elsewhere (a row's last key block is cut at its query
  // block's end), and the block products may round apart: within 1e-6 there. dk, dv and the sinks'
  // gradient are sums over every query row, added tile by tile (add_kv_grads): within 1e-6 always.
  // 300 tokens: two full key blocks and a ragged third; plain causal, then a window across a block's
  // edge with sinks.
  const std::int64_t S = 300, Hq = 4, Hkv = 2, hd = 16, qs = Hq * hd, kvs = Hkv * hd, os = Hq * hd;
  auto q = randn(S * qs, 60), k = randn(S * kvs, 61), v = randn(S * kvs, 62), dout = randn(S * os, 63);
  const auto sink_logits = randn(Hq, 64, 2.0);
  for (const std::int64_t window : {std::int64_t{0}, std::int64_t{150}}) {
    const float* sinks = window > 0 ? sink_logits.data() : nullptr;
    cpu::AttnShape whole{1, S, Hq, Hkv, hd, qs, kvs, os};
    whole.window = window;
    vector<float> o(S * os), lse(Hq * S), dq(S * qs), dk(S * kvs), dv(S * kvs), ds(Hq, 0.0f);
    cpu::attention_forward(q.data(), k.data(), v.data(), sinks, false, o.data(), lse.data(), whole, 2);
    cpu::attention_backward(q.data(), k.data(), v.data(), sinks, false, o.data(), lse.data(), dout.data(), dq.data(),
                            dk.data(), dv.data(), sinks ? ds.data() : nullptr, whole, 2);
    for (const std::int64_t tile : {64, 128, 192, 37, 100}) {
      INFO("window " << window << ", tiles of " << tile);
      std::int64_t differing = 0;
      vector<float> o_t, lse_t, lse_w, dq_t, dk_t(S * kvs, 0.0f), dv_t(S * kvs, 0.0f), ds_t(Hq, 0.0f);
      for (std::int64_t t0 = 0; t0 < S; t0 += tile) {
        const std::int64_t n = std::min(tile, S - t0);
        cpu::AttnShape a = whole;
        a.seq = t0 + n;  // the tile's queries against the keys up to its end
        a.q_start = t0;
        a.add_kv_grads = t0 > 0;
        vector<float> ot(n * os), lt(Hq * n), dqt(n * qs);
        cpu::attention_forward(q.data() + t0 * qs, k.data(), v.data(), sinks, false, ot.data(), lt.data(), a, 2);
        cpu::attention_backward(q.data() + t0 * qs, k.data(), v.data(), sinks, false, ot.data(), lt.data(),
                                dout.data() + t0 * os, dqt.data(), dk_t.data(), dv_t.data(),
                                sinks ? ds_t.data() : nullptr, a, 2);
        differing += std::memcmp(ot.data(), o.data() + t0 * os, ot.size() * 4) != 0;
        differing += std::memcmp(dqt.data(), dq.data() + t0 * qs, dqt.size() * 4) != 0;
        for (std::int64_t h = 0; h < Hq; ++h)
          differing += std::memcmp(lt.data() + h * n, lse.data() + h * S + t0, static_cast<std::size_t>(n) * 4) != 0;
        o_t.insert(o_t.end(), ot.begin(), ot.end());
        dq_t.insert(dq_t.end(), dqt.begin(), dqt.end());
        for (std::int64_t h = 0; h < Hq; ++h) {
          lse_t.insert(lse_t.end(), lt.begin() + h * n, lt.begin() + (h + 1) * n);
          lse_w.insert(lse_w.end(), lse.begin() + h * S + t0, lse.begin() + h * S + t0 + n);
        }
      }
      if (tile % 64 == 0) {
        CHECK(differing == 0);
      } else {
        CHECK(rel_err(o_t, o) < 1e-6);
        CHECK(rel_err(lse_t, lse_w) < 1e-6);
        CHECK(rel_err(dq_t, dq) < 1e-6);
      }
      CHECK(rel_err(dk_t, dk) < 1e-6);
      CHECK(rel_err(dv_t, dv) < 1e-6);
      if (sinks) CHECK(rel_err(ds_t, ds) < 1e-6);
    }
  }
}

TEST_CASE("attention sinks and windows: the reference against its definitions", "[ops][reference]") {
  // One query row by hand: a sink takes softmax mass without a value, and a window of 1 sees only itself.
  const std::int64_t S = 3, hd = 2;
  const vector<double> q = {0, 0, 0, 0, 0, 0}, k = {1, 0, 0, 1, 1, 1}, v = {1, 2, 3, 4, 5, 6}, sink = {std::log(2.0)};
  vector<double> out(S * hd);
  ref::attention(q.data(), k.data(), v.data(), out.data(), 1, S, 1, 1, hd, hd, hd, hd, 0, 0, sink.data());
  // row 2: scores all 0 -> weights 1/5 each of three keys (the sink has exp(log 2) = 2 of the 5)
  CHECK(out[2 * hd] == Approx((1 + 3 + 5) / 5.0));
  ref::attention(q.data(), k.data(), v.data(), out.data(), 1, S, 1, 1, hd, hd, hd, hd, 0, 1,
                 static_cast<const double*>(nullptr));
  CHECK(out[2 * hd + 1] == Approx(6.0));
  CHECK(out[1 * hd] == Approx(3.0));
}

TEST_CASE("fast activations match the reference and ignore the thread count", "[ops][fast]") {
  const std::size_t n = 20011;  // a ragged tail, several chunks
  auto g = randn(n, 60, 3.0), u = randn(n, 61), dh = randn(n, 62);
  vector<float> h(n), hr(n), dg(n), du(n), dgr(n), dur(n), h1(n);
  cpu::swiglu_forward(g.data(), u.data(), h.data(), n, 2);
  cpu::swiglu_forward(g.data(), u.data(), h1.data(), n, 1);
  ref::swiglu(g.data(), u.data(), hr.data(), static_cast<ref::i64>(n));
  CHECK(rel_err(h, hr) < kFastTol);
  // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison): bitwise identity across thread counts is the claim
  CHECK(std::memcmp(h.data(), h1.data(), n * 4) == 0);
  cpu::swiglu_backward(g.data(), u.data(), dh.data(), dg.data(), du.data(), n, 2);
  ref::swiglu_backward(g.data(), u.data(), dh.data(), dgr.data(), dur.data(), static_cast<ref::i64>(n));
  CHECK(rel_err(dg, dgr) < kFastTol);
  CHECK(rel_err(du, dur) < kFastTol);
  {  // gpt-oss's clamped form, limit 1.5: both sides of both clamps
    vector<float> hc(n), hc1(n), hcr(n), dgc(n), duc(n), dgcr(n), ducr(n);
    cpu::clamped_swiglu_forward(g.data(), u.data(), hc.data(), n, 1.702f, 1.5f, 2);
    cpu::clamped_swiglu_forward(g.data(), u.data(), hc1.data(), n, 1.702f, 1.5f, 1);
    ref::clamped_swiglu(g.data(), u.data(), hcr.data(), static_cast<ref::i64>(n), 1.702f, 1.5f);
    CHECK(rel_err(hc, hcr) < kFastTol);
    CHECK(std::memcmp(hc.data(), hc1.data(), n * 4) == 0);
    cpu::clamped_swiglu_backward(g.data(), u.data(), dh.data(), dgc.data(), duc.data(), n, 1.702f, 1.5f, 2);
    ref::clamped_swiglu_backward(g.data(), u.data(), dh.data(), dgcr.data(), ducr.data(), static_cast<ref::i64>(n),
                                 1.702f, 1.5f);
    CHECK(rel_err(dgc, dgcr) < kFastTol);
    CHECK(rel_err(duc, ducr) < kFastTol);
    for (std::size_t i = 0; i < n; ++i) {  // no gradient through a clamped value, exactly
      if (g[i] > 1.5f) CHECK(dgc[i] == 0.0f);
      if (std::abs(u[i]) > 1.5f) CHECK(duc[i] == 0.0f);
    }
  }
  vector<float> y(n), yr(n), dx(n), dxr(n);
  cpu::gelu_forward(g.data(), y.data(), n, 2);
  for (std::size_t i = 0; i < n; ++i) yr[i] = ref::gelu(g[i]);
  CHECK(rel_err(y, yr) < kFastTol);
  cpu::gelu_backward(g.data(), dh.data(), dx.data(), n, 2);
  ref::gelu_backward(g.data(), dh.data(), dxr.data(), static_cast<ref::i64>(n));
  CHECK(rel_err(dx, dxr) < kFastTol);
}

TEST_CASE("fast cross-entropy matches the reference", "[ops][fast]") {
  const std::int64_t N = 9, V = 1031;
  auto logits = randn(N * V, 70, 4.0);
  const std::int32_t targets[N] = {5, 1030, -100, 0, 17, 17, -100, 999, 3};
  vector<float> d = logits, loss(N), dr(N * V);
  cpu::cross_entropy_rows(d.data(), targets, loss.data(), N, V, true, 2);
  const double lr =
      ref::cross_entropy(mt::test::to_double(logits).data(), targets, static_cast<double*>(nullptr), N, V);
  double l = 0;
  for (float x : loss) l += x;
  CHECK(std::abs(l - lr) / lr < 1e-6);
  ref::cross_entropy(logits.data(), targets, dr.data(), N, V);
  CHECK(rel_err(d, dr) < kFastTol);
  for (std::int64_t j = 0; j < V; ++j) CHECK(d[2 * V + j] == 0.0f);
}

TEST_CASE("accumulate and sum_squares do not depend on the thread count", "[ops][step]") {
  const std::size_t n = (1u << 21) + 13;
  auto a = randn(n, 80), s = randn(n, 81);
  auto a1 = a, a2 = a;
  cpu::accumulate(a1.data(), s.data(), n, 1);
  cpu::accumulate(a2.data(), s.data(), n, 2);
  // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison): bitwise identity across thread counts is the claim
  CHECK(std::memcmp(a1.data(), a2.data(), n * 4) == 0);
  CHECK(a1[n - 1] == a[n - 1] + s[n - 1]);
  const double s1 = cpu::sum_squares(a.data(), n, 1), s2 = cpu::sum_squares(a.data(), n, 2);
  CHECK(s1 == s2);
  double exact = 0;
  for (float x : a) exact += static_cast<double>(x) * x;
  CHECK(std::abs(s1 - exact) / exact < 1e-12);
}

TEST_CASE("split sgemm gives the same bits at 1 and 2 threads", "[ops][fast]") {
  const std::int64_t N = 200, in = 96, out = 130;  // both split directions, ragged blocks
  auto x = randn(N * in, 90), W = randn(out * in, 91), b = randn(out, 92), dy = randn(N * out, 93);
  vector<float> y1(N * out), y2(N * out), dx1(N * in), dx2(N * in), dW1(out * in, 0.0f), dW2(out * in, 0.0f);
  cpu::linear_forward(x.data(), W.data(), b.data(), y1.data(), N, in, out, 1);
  cpu::linear_forward(x.data(), W.data(), b.data(), y2.data(), N, in, out, 2);
  cpu::linear_backward_input(dy.data(), W.data(), dx1.data(), N, in, out, false, 1);
  cpu::linear_backward_input(dy.data(), W.data(), dx2.data(), N, in, out, false, 2);
  cpu::linear_backward_weight(dy.data(), x.data(), dW1.data(), nullptr, N, in, out, 1);
  cpu::linear_backward_weight(dy.data(), x.data(), dW2.data(), nullptr, N, in, out, 2);
  CHECK(std::memcmp(y1.data(), y2.data(), y1.size() * 4) == 0);
  CHECK(std::memcmp(dx1.data(), dx2.data(), dx1.size() * 4) == 0);
  CHECK(std::memcmp(dW1.data(), dW2.data(), dW1.size() * 4) == 0);
}

TEST_CASE("grouped expert products give the bits of one product per expert, at 1 to 3 threads", "[ops][fast]") {
  // Ragged experts, one without rows, one large enough to be split into several tiles.
  const std::vector<std::int64_t> offsets = {0, 37, 37, 200, 233, 530};
  const std::int64_t E = 5, rows = offsets.back(), in = 96, out = 160;
  auto x = randn(rows * in, 97), W = randn(E * out * in, 98, 0.1), b = randn(E * out, 99), dy = randn(rows * out, 100);
  vector<float> y(rows * out), dx(rows * in, 0.5f), dW(E * out * in, 0.25f), db(E * out, 0.125f);
  for (std::int64_t e = 0; e < E; ++e) {  // one linear product per expert, as Ops' default runs them
    const std::int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
    if (n == 0) continue;
    cpu::linear_forward(x.data() + r0 * in, W.data() + e * out * in, b.data() + e * out, y.data() + r0 * out, n, in,
                        out, 2);
    cpu::linear_backward_input(dy.data() + r0 * out, W.data() + e * out * in, dx.data() + r0 * in, n, in, out, true, 2);
    cpu::linear_backward_weight(dy.data() + r0 * out, x.data() + r0 * in, dW.data() + e * out * in, db.data() + e * out,
                                n, in, out, 2);
  }
  for (int t = 1; t <= 3; ++t) {
    CAPTURE(t);
    vector<float> yg(rows * out), dxg(rows * in, 0.5f), dWg(E * out * in, 0.25f), dbg(E * out, 0.125f);
    cpu::grouped_linear_forward(x.data(), W.data(), out * in, b.data(), out, yg.data(), offsets.data(), E, in, out, t);
    cpu::grouped_linear_backward(dy.data(), x.data(), W.data(), out * in, dxg.data(), true, dWg.data(), dbg.data(), out,
                                 offsets.data(), E, in, out, t);
    CHECK(std::memcmp(y.data(), yg.data(), y.size() * 4) == 0);
    CHECK(std::memcmp(dx.data(), dxg.data(), dx.size() * 4) == 0);
    CHECK(std::memcmp(dW.data(), dWg.data(), dW.size() * 4) == 0);
    CHECK(std::memcmp(db.data(), dbg.data(), db.size() * 4) == 0);
    // Without dx: the weight gradients alone, the same.
    vector<float> dWn(E * out * in, 0.25f);
    cpu::grouped_linear_backward(dy.data(), x.data(), W.data(), out * in, nullptr, false, dWn.data(), nullptr, 0,
                                 offsets.data(), E, in, out, t);
    CHECK(std::memcmp(dW.data(), dWn.data(), dW.size() * 4) == 0);
  }
}

TEST_CASE("split GEMMs give the same bits at 1 to 4 threads on transformer shapes", "[ops][fast]") {
  // The library may pick kernels and K blocking by the block's shape (oneDNN does by CPU and size), so
  // the invariant is checked on shapes like the model's: long K, blocks of 16-aligned and ragged widths.
  struct Shape {
    std::int64_t N, in, out;
  };
  for (const Shape s : {Shape{256, 768, 1000}, Shape{200, 3072, 768}, Shape{1030, 96, 330}}) {
    CAPTURE(s.N, s.in, s.out);
    auto x = randn(s.N * s.in, 94), W = randn(s.out * s.in, 95), dy = randn(s.N * s.out, 96);
    vector<float> y[4], dx[4], dW[4];
    for (int t = 1; t <= 4; ++t) {
      y[t - 1].assign(s.N * s.out, 0.0f);
      dx[t - 1].assign(s.N * s.in, 0.0f);
      dW[t - 1].assign(s.out * s.in, 0.125f);
      cpu::linear_forward(x.data(), W.data(), nullptr, y[t - 1].data(), s.N, s.in, s.out, t);
      cpu::linear_backward_input(dy.data(), W.data(), dx[t - 1].data(), s.N, s.in, s.out, true, t);
      cpu::linear_backward_weight(dy.data(), x.data(), dW[t - 1].data(), nullptr, s.N, s.in, s.out, t);
    }
    for (int t = 2; t <= 4; ++t) {
      CAPTURE(t);
      CHECK(std::memcmp(y[0].data(), y[t - 1].data(), y[0].size() * 4) == 0);
      CHECK(std::memcmp(dx[0].data(), dx[t - 1].data(), dx[0].size() * 4) == 0);
      CHECK(std::memcmp(dW[0].data(), dW[t - 1].data(), dW[0].size() * 4) == 0);
    }
    vector<float> yr(s.N * s.out);
    ref::linear(x.data(), W.data(), static_cast<const float*>(nullptr), yr.data(), s.N, s.in, s.out);
    CHECK(rel_err(y[0], yr) < kFastTol);
  }
}

TEST_CASE("the GEMM backend names itself", "[ops]") {
  const std::string name = cpu::gemm_backend_name();
  CHECK((name.rfind("oneDNN ", 0) == 0 || name.rfind("OpenBLAS ", 0) == 0));
}

namespace {

int thread_count() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory() ? 1 : 0;
  return n;
}

// This process's thread count once it equals `want` (an exiting thread takes a moment), or after a second.
int thread_count_reaching(int want) {
  int n = thread_count();
  for (int i = 0; i < 100 && n != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = thread_count();
  }
  return n;
}

// This process's thread count once it has held for 50 ms: a thread joined by an earlier test case can
// stay listed in /proc for a moment after the join (seen in CI, under load).
int settled_thread_count() {
  int n = thread_count(), same = 0;
  for (int i = 0; i < 200 && same < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int now = thread_count();
    same = now == n ? same + 1 : 0;
    n = now;
  }
  return n;
}

}  // namespace

TEST_CASE("release_thread_pool ends this thread's OpenMP workers and parallel work resumes", "[ops][threads]") {
  const std::int64_t N = 256, in = 128, out = 256;  // 16.8 MFLOP: split over the 2 threads
  auto x = randn(N * in, 94), W = randn(out * in, 95);
  vector<float> before(N * out), after(N * out);
  cpu::linear_forward(x.data(), W.data(), nullptr, before.data(), N, in, out, 2);  // this thread's pool: 1 worker
  const int with_pool = settled_thread_count();
  cpu::release_thread_pool();
  CHECK(thread_count_reaching(with_pool - 1) == with_pool - 1);                   // the worker has exited
  cpu::linear_forward(x.data(), W.data(), nullptr, after.data(), N, in, out, 2);  // a new pool
  CHECK(thread_count() == with_pool);
  CHECK(std::memcmp(before.data(), after.data(), before.size() * 4) == 0);
  int inside = 0;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    {
      cpu::release_thread_pool();  // refused inside a region: the team finishes as it started
      inside = omp_get_num_threads();
    }
  }
  CHECK(inside == 2);
  cpu::release_thread_pool();
}

TEST_CASE("host allocations: a huge page's alignment from one huge page up, a cache line below, zeroed", "[ops]") {
  CHECK(host_alignment(64) == kCacheLineBytes);
  CHECK(host_alignment(kHugePageBytes - 1) == kCacheLineBytes);
  CHECK(host_alignment(kHugePageBytes) == kHugePageBytes);
  CHECK(host_alignment(100, 4096) == 4096);
  for (const std::size_t floats : {std::size_t{1}, std::size_t{1000}, kHugePageBytes / 4, 3 * kHugePageBytes / 4 + 5}) {
    INFO(floats << " floats");
    const AlignedFloats a = make_aligned_floats(floats);
    const std::size_t want = floats * 4 >= kHugePageBytes ? kHugePageBytes : kCacheLineBytes;
    CHECK(reinterpret_cast<std::uintptr_t>(a.get()) % want == 0);
    CHECK(std::all_of(a.get(), a.get() + floats, [](float x) { return x == 0.0f; }));
  }
}

TEST_CASE("a store past the caches writes a times x, bit for bit, and nothing past n", "[ops]") {
  // Aligned whole lines take the streamed path, the rest the plain loop: both give the same words.
  const AlignedFloats buf = make_aligned_floats(256);
  auto x = randn(80, 31);
  x[0] = -0.0f, x[1] = 1e-40f, x[2] = -1e-40f;  // a negative zero and subnormals keep their bits when copied
  constexpr float kGuard = 12345.0f;
  for (const float a : {1.0f, -0.375f})
    for (const std::int64_t offset : {0, 1, 16})  // 64-byte aligned, not aligned, aligned again
      for (const std::int64_t n : {64, 48, 13, 0}) {
        INFO("a " << a << " offset " << offset << " n " << n);
        float* y = buf.get() + offset;
        std::fill(buf.get(), buf.get() + 256, kGuard);
        cpu::simd::scale_past_caches(x.data(), a, y, n);
        cpu::simd::fence_streams();
        for (std::int64_t i = 0; i < n; ++i) {
          const float xi = x[static_cast<std::size_t>(i)], want = a == 1.0f ? xi : xi * a;  // a = 1: x itself
          CHECK(std::memcmp(&y[i], &want, sizeof(float)) == 0);
        }
        CHECK(y[n] == kGuard);
      }
}

#ifdef MT_AVX2
TEST_CASE("a vector tail loads its first m floats and zeros, and stores only its first m", "[ops]") {
  const vector<float> src = {1, 2, 3, 4, 5, 6, 7, 8};
  for (std::size_t m = 0; m < 8; ++m) {
    INFO("m " << m);
    alignas(32) float loaded[8];
    _mm256_store_ps(loaded, cpu::simd::load_tail(src.data(), m));
    for (std::size_t i = 0; i < 8; ++i) CHECK(loaded[i] == (i < m ? src[i] : 0.0f));
    vector<float> out(8, -1.0f);
    cpu::simd::store_tail(out.data(), _mm256_loadu_ps(src.data()), m);
    for (std::size_t i = 0; i < 8; ++i) CHECK(out[i] == (i < m ? src[i] : -1.0f));
  }
}
#endif
