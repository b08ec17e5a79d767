// The attention's bf16 pair path (kernels/cpu/bf16_pairs.hpp, AttnProducts::bf16_pairs): the pair
// product against its plain reference, the packers against their definitions, and the whole attention
// against the fp64 reference run on the same bf16-rounded q, k, v. A CPU without AVX512-BF16 cannot run
// the path: those cases exit 77 (ctest's skipped).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <iostream>

#include "kernels/cpu/bf16_pairs.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/reference_ops.hpp"
#include "kernels/cpu/row_fetch.hpp"
#include "kernels/tile.hpp"
#include "tests/kernels/kernel_test_util.hpp"

using namespace mt;
using mt::test::randn;
using mt::test::rel_err;
using std::vector;

namespace {

void require_pairs() {
  if (cpu::bf16_pairs_available()) return;
  std::cout << "skipped: no AVX512-BF16 here (or MEGATRAIN_MAX_CPU_ISA holds our kernels below it), so the bf16 "
               "pair path cannot run\n";
  std::exit(77);  // ctest's SKIP_RETURN_CODE: reported as skipped, never as passed
}

vector<float> rounded(const vector<float>& x) {
  vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = cpu::bf16_to_float(cpu::bf16_round_reference(x[i]));
  return y;
}

vector<cpu::pair_t> words(std::size_t n, std::uint32_t seed) {
  const auto v = randn(2 * n, seed);
  vector<cpu::pair_t> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = cpu::make_pair_word(v[2 * i], v[2 * i + 1]);
  return w;
}

}  // namespace

TEST_CASE("bf16 pair products match their plain reference", "[ops][bf16][pairs]") {
  require_pairs();
  // Row tails of the 8-row register block, column tails of its 16 and 32 lanes, ld larger than the extent.
  for (const std::int64_t M : {1, 7, 8, 13, 64})
    for (const std::int64_t N : {1, 16, 17, 32, 45, 128})
      for (const std::int64_t K2 : {1, 5, 32})
        for (const bool acc : {false, true}) {
          INFO("M " << M << " N " << N << " K2 " << K2 << (acc ? " +=" : " ="));
          const std::int64_t lda = K2 + 3, ldb = N + 5, ldc = N + 2;
          const auto A = words(static_cast<std::size_t>(M * lda), 1), B = words(static_cast<std::size_t>(K2 * ldb), 2);
          auto C = randn(M * ldc, 3);
          auto R = C;
          cpu::bf16_pair_gemm(M, N, K2, A.data(), lda, B.data(), ldb, acc, C.data(), ldc);
          cpu::bf16_pair_gemm_reference(M, N, K2, A.data(), lda, B.data(), ldb, acc, R.data(), ldc);
          CHECK(rel_err(C, R) < 1e-6);
          const auto untouched = randn(M * ldc, 3);  // the columns past N keep their values
          for (std::int64_t m = 0; m < M; ++m)
            for (std::int64_t n = N; n < ldc; ++n) CHECK(C[m * ldc + n] == untouched[m * ldc + n]);
        }
}

TEST_CASE("a row fetch issues each queued line once, as many as asked", "[ops][pairs]") {
  vector<float> x(400), y(100);
  cpu::RowFetch fetch;
  fetch.add(x.data(), 100, 3, 64);  // 3 rows of 4 lines
  fetch.add(y.data(), 40, 2, 20);   // 2 rows of 2 lines (a line and a part)
  fetch.add(y.data(), 40, 0, 20);   // nothing
  CHECK(fetch.queued() == 16);
  fetch.issue(5);
  CHECK(fetch.queued() == 11);
  fetch.issue(100);
  CHECK(fetch.queued() == 0);
  fetch.issue(1);
  CHECK(fetch.queued() == 0);
  fetch.add(x.data(), 100, 1, 16);
  CHECK(fetch.queued() == 1);
  fetch.restart();  // what was still queued goes out, and the queue starts empty
  CHECK(fetch.queued() == 0);
  fetch.add(x.data(), 100, 2, 64);
  fetch.issue(3);
  fetch.clear();  // dropped, not issued
  CHECK(fetch.queued() == 0);
}

TEST_CASE("a pair product with a row fetch gives the same bits and issues its lines a register block",
          "[ops][bf16][pairs]") {
  require_pairs();
  vector<float> rows(64 * 100);
  for (const std::int64_t M : {1, 8, 13, 64})
    for (const std::int64_t N : {16, 45, 128}) {
      INFO("M " << M << " N " << N);
      const std::int64_t K2 = 32;
      const auto A = words(static_cast<std::size_t>(M * K2), 1), B = words(static_cast<std::size_t>(K2 * N), 2);
      vector<float> plain(static_cast<std::size_t>(M * N)), fetched(plain.size());
      cpu::RowFetch fetch;
      fetch.add(rows.data(), 100, 64, 64);  // 256 lines
      cpu::bf16_pair_gemm(M, N, K2, A.data(), K2, B.data(), N, false, plain.data(), N);
      cpu::bf16_pair_gemm(M, N, K2, A.data(), K2, B.data(), N, false, fetched.data(), N, &fetch);
      CHECK(std::memcmp(plain.data(), fetched.data(), plain.size() * sizeof(float)) == 0);
      const std::int64_t blocks = (M + 7) / 8 * ((N + 31) / 32);
      CHECK(fetch.queued() == std::max<std::int64_t>(0, 256 - 8 * blocks));
    }
}

TEST_CASE("bf16 pair packers hold the pairs their definitions name, zero past the edge", "[ops][bf16][pairs]") {
  const std::int64_t rows = 5, cols = 7, ldx = 9;  // odd both ways: the last pair of each packing is padded
  const auto x = randn(rows * ldx, 4);
  auto at = [&](std::int64_t r, std::int64_t c) { return r < rows && c < cols ? x[r * ldx + c] : 0.0f; };
  const std::int64_t rp = (rows + 1) / 2, cp = (cols + 1) / 2;
  vector<cpu::pair_t> a(rows * cp), b(rp * cols), c(cp * rows), d(cols * rp);
  cpu::pack_row_pairs(x.data(), ldx, rows, cols, a.data(), cp);
  cpu::pack_column_pairs(x.data(), ldx, rows, cols, b.data(), cols);
  cpu::pack_row_pairs_transposed(x.data(), ldx, rows, cols, c.data(), rows);
  cpu::pack_column_pairs_transposed(x.data(), ldx, rows, cols, d.data(), rp);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t p = 0; p < cp; ++p) {
      CHECK(a[r * cp + p] == cpu::make_pair_word(at(r, 2 * p), at(r, 2 * p + 1)));
      CHECK(c[p * rows + r] == a[r * cp + p]);
    }
  for (std::int64_t p = 0; p < rp; ++p)
    for (std::int64_t col = 0; col < cols; ++col) {
      CHECK(b[p * cols + col] == cpu::make_pair_word(at(2 * p, col), at(2 * p + 1, col)));
      CHECK(d[col * rp + p] == b[p * cols + col]);
    }
  // The word's halves: the even element low, rounded to nearest even.
  const cpu::pair_t w = cpu::make_pair_word(1.0f + 1.0f / 256.0f, -2.0f);  // 1 + 2^-8 ties to even: 1.0
  CHECK((w & 0xffffu) == 0x3f80u);
  CHECK((w >> 16) == 0xc000u);
}

TEST_CASE("transposes move every element to its place and nothing else, in whole and cut tiles", "[ops][bf16][pairs]") {
  // 16 x 16 tiles and their edges: whole tiles, a row edge, a column edge, and one of each. Where ldo is a
  // multiple of 16 words, a whole tile's output rows are aligned lines: stream_transposed streams those.
  for (const auto& [rows, cols, ldo] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{32, 48, 37},
                                        {37, 16, 42},
                                        {16, 21, 21},
                                        {5, 3, 10},
                                        {32, 19, 48},
                                        {48, 33, 64}}) {
    const std::int64_t ldx = cols + 3;
    const auto x = randn(rows * ldx, 5);
    vector<cpu::pair_t> words(static_cast<std::size_t>(rows * ldx));
    for (std::size_t i = 0; i < words.size(); ++i) words[i] = 0x9e3779b9u * static_cast<std::uint32_t>(i + 1);
    const cpu::pair_t kUntouched = 0xdeadbeefu;
    vector<cpu::pair_t> out(static_cast<std::size_t>(cols * ldo), kUntouched);
    cpu::transpose_words(words.data(), ldx, rows, cols, out.data(), ldo);
    const auto base = randn(cols * ldo, 6);
    auto sums = base;
    cpu::add_transposed(x.data(), ldx, rows, cols, sums.data(), ldo);
    const AlignedFloats streamed = make_aligned_floats(static_cast<std::size_t>(cols * ldo));
    std::copy(base.begin(), base.end(), streamed.get());
    cpu::stream_transposed(x.data(), ldx, rows, cols, streamed.get(), ldo);
    for (std::int64_t c = 0; c < cols; ++c)
      for (std::int64_t r = 0; r < ldo; ++r) {
        const std::int64_t o = c * ldo + r;
        if (r < rows) {
          CHECK(out[o] == words[r * ldx + c]);
          CHECK(sums[o] == base[o] + x[r * ldx + c]);  // one add: the exact fp32 sum of the two
          CHECK(std::memcmp(&streamed[o], &x[r * ldx + c], sizeof(float)) == 0);
        } else {  // past the rows: the gap between output rows stays as it was
          CHECK(out[o] == kUntouched);
          CHECK(sums[o] == base[o]);
          CHECK(streamed[o] == base[o]);
        }
      }
  }
}

TEST_CASE("attention on bf16 pairs matches the fp64 reference on the same bf16 operands", "[ops][bf16][pairs]") {
  require_pairs();
  // As the fp32 kernel's test: 150 tokens (a ragged last key block, odd pairs nowhere but the tails), GQA,
  // strided layouts, windows and sinks. The reference runs in double on q, k, v rounded to bf16, so what
  // remains is the path's own rounding of the probabilities and dS to bf16 (2^-9 relative each).
  const std::int64_t B = 2, S = 150, Hq = 6, Hkv = 2, hd = 16, qs = Hq * hd + 8, kvs = Hkv * hd + 4, os = Hq * hd;
  const auto q = randn(B * S * qs, 50), k = randn(B * S * kvs, 51), v = randn(B * S * kvs, 52),
             dout = randn(B * S * os, 53);
  const auto sink_logits = randn(Hq, 54, 2.0);
  const auto qd = mt::test::to_double(rounded(q)), kd = mt::test::to_double(rounded(k)),
             vd = mt::test::to_double(rounded(v)), dod = mt::test::to_double(dout);
  const auto sinks_d = mt::test::to_double(sink_logits);
  struct Form {
    std::int64_t window;
    bool sinks;
  };
  for (const Form f : {Form{0, false}, Form{37, false}, Form{70, true}}) {
    INFO("window " << f.window << (f.sinks ? ", sinks" : ""));
    cpu::AttnShape a{B, S, Hq, Hkv, hd, qs, kvs, os};
    a.window = f.window;
    const float* sinks = f.sinks ? sink_logits.data() : nullptr;
    constexpr auto pairs = cpu::AttnProducts::bf16_pairs;
    vector<float> o(B * S * os), lse(B * Hq * S);
    cpu::attention_forward(q.data(), k.data(), v.data(), sinks, false, o.data(), lse.data(), a, 2, pairs);
    vector<double> orf(o.size());
    ref::attention(qd.data(), kd.data(), vd.data(), orf.data(), B, S, Hq, Hkv, hd, qs, kvs, os, 0, f.window,
                   f.sinks ? sinks_d.data() : nullptr);
    const double out_err = rel_err(o, orf);
    CHECK(out_err < 3e-3);  // measured: 1.1e-3
    vector<float> dq(q.size()), dk(k.size()), dv(v.size()), ds(Hq, 0.5f);
    cpu::attention_backward(q.data(), k.data(), v.data(), sinks, false, o.data(), lse.data(), dout.data(), dq.data(),
                            dk.data(), dv.data(), f.sinks ? ds.data() : nullptr, a, 2, pairs);
    vector<double> dqr(q.size()), dkr(k.size()), dvr(v.size()), dsr(Hq, 0.5);
    ref::attention_backward(qd.data(), kd.data(), vd.data(), dod.data(), dqr.data(), dkr.data(), dvr.data(), B, S, Hq,
                            Hkv, hd, qs, kvs, os, 0, f.window, f.sinks ? sinks_d.data() : nullptr,
                            f.sinks ? dsr.data() : nullptr);
    auto strided_err = [&](const vector<float>& x, const vector<double>& y, std::int64_t stride, std::int64_t width) {
      vector<double> a1, b1;
      for (std::int64_t r = 0; r < B * S; ++r)
        for (std::int64_t i = 0; i < width; ++i) a1.push_back(x[r * stride + i]), b1.push_back(y[r * stride + i]);
      return rel_err(a1, b1);
    };
    const double dq_err = strided_err(dq, dqr, qs, Hq * hd), dk_err = strided_err(dk, dkr, kvs, Hkv * hd),
                 dv_err = strided_err(dv, dvr, kvs, Hkv * hd);
    INFO("relative errors: out " << out_err << ", dq " << dq_err << ", dk " << dk_err << ", dv " << dv_err);
    CHECK(dq_err < 8e-3);  // measured: 2.9e-3, 2.9e-3 and 2.3e-3
    CHECK(dk_err < 8e-3);
    CHECK(dv_err < 6e-3);
    if (f.sinks) CHECK(rel_err(ds, dsr) < 1e-2);
    // The path is the pairs' own: the fp32 kernel on the same inputs gives other bits.
    vector<float> o32(o.size()), lse32(lse.size());
    cpu::attention_forward(q.data(), k.data(), v.data(), sinks, false, o32.data(), lse32.data(), a, 2);
    CHECK(std::memcmp(o.data(), o32.data(), o.size() * 4) != 0);
    // One thread gives the same bits as two.
    vector<float> o1(o.size()), lse1(lse.size()), dq1(q.size()), dk1(k.size()), dv1(v.size()), ds1(Hq, 0.5f);
    cpu::attention_forward(q.data(), k.data(), v.data(), sinks, false, o1.data(), lse1.data(), a, 1, pairs);
    cpu::attention_backward(q.data(), k.data(), v.data(), sinks, false, o.data(), lse.data(), dout.data(), dq1.data(),
                            dk1.data(), dv1.data(), f.sinks ? ds1.data() : nullptr, a, 1, pairs);
    CHECK(std::memcmp(o.data(), o1.data(), o.size() * 4) == 0);
    CHECK(std::memcmp(lse.data(), lse1.data(), lse.size() * 4) == 0);
    CHECK(std::memcmp(dq.data(), dq1.data(), dq.size() * 4) == 0);
    CHECK(std::memcmp(dk.data(), dk1.data(), dk.size() * 4) == 0);
    CHECK(std::memcmp(dv.data(), dv1.data(), dv.size() * 4) == 0);
    CHECK(std::memcmp(ds.data(), ds1.data(), ds.size() * 4) == 0);
  }
}

TEST_CASE("attention on bf16 pairs at odd edges: odd head_dim, odd rows, a tile past a window", "[ops][bf16][pairs]") {
  require_pairs();
  // head_dim 15 pads every row's last pair; queries from position 201 (odd) end query and key blocks on
  // odd counts; a window of 50 starts the keys at block 128, not 0; two sequences.
  const std::int64_t B = 2, S = 300, q0 = 201, Q = S - q0, Hq = 4, Hkv = 2, hd = 15, qs = Hq * hd, kvs = Hkv * hd,
                     os = Hq * hd;
  const auto q = randn(B * Q * qs, 70), k = randn(B * S * kvs, 71), v = randn(B * S * kvs, 72),
             dout = randn(B * Q * os, 73);
  const auto qd = mt::test::to_double(rounded(q)), kd = mt::test::to_double(rounded(k)),
             vd = mt::test::to_double(rounded(v)), dod = mt::test::to_double(dout);
  for (const std::int64_t window : {std::int64_t{0}, std::int64_t{50}}) {
    INFO("window " << window);
    cpu::AttnShape a{B, S, Hq, Hkv, hd, qs, kvs, os};
    a.q_start = q0;
    a.window = window;
    vector<float> o(B * Q * os), lse(B * Hq * Q), dq(q.size()), dk(k.size()), dv(v.size());
    cpu::attention_forward(q.data(), k.data(), v.data(), nullptr, false, o.data(), lse.data(), a, 2,
                           cpu::AttnProducts::bf16_pairs);
    cpu::attention_backward(q.data(), k.data(), v.data(), nullptr, false, o.data(), lse.data(), dout.data(), dq.data(),
                            dk.data(), dv.data(), nullptr, a, 2, cpu::AttnProducts::bf16_pairs);
    vector<double> orf(o.size()), dqr(q.size()), dkr(k.size()), dvr(v.size());
    ref::attention(qd.data(), kd.data(), vd.data(), orf.data(), B, S, Hq, Hkv, hd, qs, kvs, os, q0, window);
    ref::attention_backward(qd.data(), kd.data(), vd.data(), dod.data(), dqr.data(), dkr.data(), dvr.data(), B, S, Hq,
                            Hkv, hd, qs, kvs, os, q0, window);
    CHECK(rel_err(o, orf) < 3e-3);
    CHECK(rel_err(dq, dqr) < 8e-3);
    CHECK(rel_err(dk, dkr) < 8e-3);
    CHECK(rel_err(dv, dvr) < 6e-3);
    if (window > 0) {  // keys before every query's window get no gradient
      bool untouched = true;
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < q0 - window + 1; ++t)
          for (std::int64_t c = 0; c < Hkv * hd; ++c)
            untouched = untouched && dk[(b * S + t) * kvs + c] == 0.0f && dv[(b * S + t) * kvs + c] == 0.0f;
      CHECK(untouched);
    }
  }
}

TEST_CASE("attention on bf16 pairs: sequence tiles of whole query blocks give the whole sequence's bits",
          "[ops][bf16][pairs]") {
  require_pairs();
  // As for the fp32 kernel: key blocks stay aligned to position 0, so a tiled row meets the same operand
  // words in the same products. dk and dv are sums over the tiles (add_kv_grads): within 1e-6.
  const std::int64_t S = 300, Hq = 4, Hkv = 2, hd = 16, qs = Hq * hd, kvs = Hkv * hd, os = Hq * hd;
  const auto q = randn(S * qs, 60), k = randn(S * kvs, 61), v = randn(S * kvs, 62), dout = randn(S * os, 63);
  constexpr auto pairs = cpu::AttnProducts::bf16_pairs;
  const cpu::AttnShape whole{1, S, Hq, Hkv, hd, qs, kvs, os};
  vector<float> o(S * os), lse(Hq * S), dq(S * qs), dk(S * kvs), dv(S * kvs);
  cpu::attention_forward(q.data(), k.data(), v.data(), nullptr, false, o.data(), lse.data(), whole, 2, pairs);
  cpu::attention_backward(q.data(), k.data(), v.data(), nullptr, false, o.data(), lse.data(), dout.data(), dq.data(),
                          dk.data(), dv.data(), nullptr, whole, 2, pairs);
  for (const std::int64_t tile : {64, 128}) {
    INFO("tiles of " << tile);
    vector<float> dk_t(S * kvs, 0.0f), dv_t(S * kvs, 0.0f);
    std::int64_t differing = 0;
    for (std::int64_t t0 = 0; t0 < S; t0 += tile) {
      const std::int64_t n = std::min(tile, S - t0);
      cpu::AttnShape a = whole;
      a.seq = t0 + n;
      a.q_start = t0;
      a.add_kv_grads = t0 > 0;
      vector<float> ot(n * os), lt(Hq * n), dqt(n * qs);
      cpu::attention_forward(q.data() + t0 * qs, k.data(), v.data(), nullptr, false, ot.data(), lt.data(), a, 2, pairs);
      cpu::attention_backward(q.data() + t0 * qs, k.data(), v.data(), nullptr, false, ot.data(), lt.data(),
                              dout.data() + t0 * os, dqt.data(), dk_t.data(), dv_t.data(), nullptr, a, 2, pairs);
      differing += std::memcmp(ot.data(), o.data() + t0 * os, ot.size() * 4) != 0;
      differing += std::memcmp(dqt.data(), dq.data() + t0 * qs, dqt.size() * 4) != 0;
    }
    CHECK(differing == 0);
    CHECK(rel_err(dk_t, dk) < 1e-6);
    CHECK(rel_err(dv_t, dv) < 1e-6);
  }
}

TEST_CASE("attention with documents gives the same bits on any thread count, on either block product",
          "[ops][pairs][documents]") {
  // The backward's tasks walk their groups outer and their query heads inner with documents (TaskSteps):
  // one fixed order a task, whichever thread runs it. Documents of 40/1/150/109 and 128/1/71/100 tokens.
  const std::int64_t B = 2, S = 300, Hq = 6, Hkv = 2, hd = 16, qs = Hq * hd, kvs = Hkv * hd, os = Hq * hd;
  vector<std::int32_t> pos;
  for (const auto& lengths : {vector<int>{40, 1, 150, 109}, vector<int>{128, 1, 71, 100}})
    for (const int n : lengths)
      for (int i = 0; i < n; ++i) pos.push_back(i);
  const auto q = randn(B * S * qs, 81), k = randn(B * S * kvs, 82), v = randn(B * S * kvs, 83),
             dout = randn(B * S * os, 84);
  cpu::AttnShape a{B, S, Hq, Hkv, hd, qs, kvs, os};
  a.positions = pos.data();
  for (const auto products : {cpu::AttnProducts::fp32, cpu::AttnProducts::bf16_pairs}) {
    if (products == cpu::AttnProducts::bf16_pairs && !cpu::bf16_pairs_available()) continue;
    INFO(cpu::attn_products_name(products));
    vector<vector<float>> first;
    for (const int threads : {1, 2, 3}) {
      INFO(threads << " threads");
      vector<float> o(B * S * os), lse(B * Hq * S), dq(q.size()), dk(k.size()), dv(v.size());
      cpu::attention_forward(q.data(), k.data(), v.data(), nullptr, false, o.data(), lse.data(), a, threads, products);
      cpu::attention_backward(q.data(), k.data(), v.data(), nullptr, false, o.data(), lse.data(), dout.data(),
                              dq.data(), dk.data(), dv.data(), nullptr, a, threads, products);
      const vector<vector<float>> got = {o, lse, dq, dk, dv};
      if (first.empty()) first = got;
      for (std::size_t i = 0; i < got.size(); ++i)
        CHECK(std::memcmp(got[i].data(), first[i].data(), got[i].size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("attention on bf16 pairs with documents matches the fp64 reference, and no key outside a document moves",
          "[ops][bf16][pairs][documents]") {
  require_pairs();
  // Documents (AttnShape::positions): row 0 40/1/150/109 tokens, row 1 128/1/71/100 (a boundary on a key
  // block); whole and from query 201 (a tile inside a document), with a window of 45 and sinks.
  const std::int64_t B = 2, S = 300, Hq = 4, Hkv = 2, hd = 16, qs = Hq * hd, kvs = Hkv * hd, os = Hq * hd;
  vector<std::int32_t> pos;
  for (const auto& lengths : {vector<int>{40, 1, 150, 109}, vector<int>{128, 1, 71, 100}})
    for (const int n : lengths)
      for (int i = 0; i < n; ++i) pos.push_back(i);
  const auto sink_logits = randn(Hq, 74, 2.0);
  const auto sinks_d = mt::test::to_double(sink_logits);
  for (const std::int64_t q0 : {std::int64_t{0}, std::int64_t{201}})
    for (const bool windowed : {false, true}) {
      INFO("queries from " << q0 << (windowed ? ", window 45 and sinks" : ""));
      const std::int64_t Q = S - q0, window = windowed ? 45 : 0;
      const auto q = randn(B * Q * qs, 75), k = randn(B * S * kvs, 76), v = randn(B * S * kvs, 77),
                 dout = randn(B * Q * os, 78);
      const auto qd = mt::test::to_double(rounded(q)), kd = mt::test::to_double(rounded(k)),
                 vd = mt::test::to_double(rounded(v)), dod = mt::test::to_double(dout);
      cpu::AttnShape a{B, S, Hq, Hkv, hd, qs, kvs, os};
      a.q_start = q0, a.window = window, a.positions = pos.data();
      const float* sinks = windowed ? sink_logits.data() : nullptr;
      constexpr auto pairs = cpu::AttnProducts::bf16_pairs;
      vector<float> o(B * Q * os), lse(B * Hq * Q), dq(q.size()), dk(k.size()), dv(v.size()), ds(Hq, 0.0f);
      cpu::attention_forward(q.data(), k.data(), v.data(), sinks, false, o.data(), lse.data(), a, 2, pairs);
      cpu::attention_backward(q.data(), k.data(), v.data(), sinks, false, o.data(), lse.data(), dout.data(), dq.data(),
                              dk.data(), dv.data(), windowed ? ds.data() : nullptr, a, 2, pairs);
      vector<double> orf(o.size()), dqr(q.size()), dkr(k.size()), dvr(v.size()), dsr(Hq, 0.0);
      const double* sr = windowed ? sinks_d.data() : nullptr;
      ref::attention(qd.data(), kd.data(), vd.data(), orf.data(), B, S, Hq, Hkv, hd, qs, kvs, os, q0, window, sr,
                     pos.data());
      ref::attention_backward(qd.data(), kd.data(), vd.data(), dod.data(), dqr.data(), dkr.data(), dvr.data(), B, S, Hq,
                              Hkv, hd, qs, kvs, os, q0, window, sr, windowed ? dsr.data() : nullptr, pos.data());
      CHECK(rel_err(o, orf) < 3e-3);
      CHECK(rel_err(dq, dqr) < 8e-3);
      CHECK(rel_err(dk, dkr) < 8e-3);
      CHECK(rel_err(dv, dvr) < 6e-3);
      if (windowed) CHECK(rel_err(ds, dsr) < 1e-2);
      if (q0 > 0) {  // row 0's queries are all in its last document (from 191): earlier keys get nothing
        bool untouched = true;
        for (std::int64_t t = 0; t < 191; ++t)
          for (std::int64_t c = 0; c < Hkv * hd; ++c)
            untouched = untouched && dk[t * kvs + c] == 0.0f && dv[t * kvs + c] == 0.0f;
        CHECK(untouched);
      }
    }
}
