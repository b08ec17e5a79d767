// The layer templates and the head: the fp64 references against central differences, the fast fp32
// stages against the references, keep mode against recompute mode, and bad input. (The layers in
// sequence tiles: test_seq_tiles.cpp; the head in tiles is checked here, beside its whole-sequence case.)
#include <catch2/catch.hpp>

#include <cstring>
#include <string>

#include "kernels/reference_layers.hpp"
#include "kernels/stage_api.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/kernels/model_configs.hpp"

using namespace mt;
using mt::test::all_configs;
using mt::test::Named;
using mt::test::rel_err;
using std::vector;

namespace {

template <class T>
vector<T> ref_layer_forward(const ModelConfig& c, const vector<T>& p, const vector<T>& x, std::int64_t B,
                            std::int64_t S) {
  return c.is_gpt2() ? ref::gpt2_forward(c, p.data(), x.data(), B, S).y
                     : ref::llama_forward(c, p.data(), x.data(), B, S).y;
}
template <class T>
void ref_layer_backward(const ModelConfig& c, const vector<T>& p, const vector<T>& x, const vector<T>& dy,
                        vector<T>& dx, vector<T>& g, std::int64_t B, std::int64_t S) {
  if (c.is_gpt2())
    ref::gpt2_backward(c, p.data(), x.data(), dy.data(), dx.data(), g.data(), B, S);
  else
    ref::llama_backward(c, p.data(), x.data(), dy.data(), dx.data(), g.data(), B, S);
}

}  // namespace

TEST_CASE("reference layers match finite differences in fp64", "[layers][fd]") {
  for (const Named& named : all_configs()) {
    // Not a structured binding: the loss lambda below captures c, which C++17 allows only for variables.
    const char* name = named.name;
    const ModelConfig& c = named.cfg;
    INFO(name);
    const std::int64_t B = 2, S = 3, N = B * S, d = c.hidden_size;
    const ParamLayout l = layer_layout(c, 0);
    auto p = mt::test::random_stage_params(l, 1);
    auto x = mt::test::randn<double>(N * d, 2);
    const auto R = mt::test::randn<double>(N * d, 3);
    auto loss = [&] { return mt::test::dot(ref_layer_forward(c, p, x, B, S), R); };
    vector<double> dx(N * d, 0.0), g(l.total_floats, 0.0);
    ref_layer_backward(c, p, x, R, dx, g, B, S);
    CHECK(rel_err(dx, mt::test::numeric_grad(x, loss)) < 1e-6);
    const auto num = mt::test::numeric_grad(p, loss);
    for (const auto& t : l.tensors) {
      INFO(t.name);
      CHECK(rel_err(g.data() + t.offset, num.data() + t.offset, t.numel) < 1e-6);
    }
  }
}

TEST_CASE("fast layers match the fp64 reference in both activation modes", "[layers][fast]") {
  for (const auto& [name, c] : all_configs()) {
    INFO(name);
    const std::int64_t B = 2, S = 7, N = B * S, d = c.hidden_size;  // odd sequence length
    const ParamLayout l = layer_layout(c, 0);
    const auto pd = mt::test::random_stage_params(l, 4);
    const auto xd = mt::test::randn<double>(N * d, 5), dyd = mt::test::randn<double>(N * d, 6);
    vector<double> dxr(N * d, 0.0), gr(l.total_floats, 0.0);
    const auto yr = ref_layer_forward(c, pd, xd, B, S);
    ref_layer_backward(c, pd, xd, dyd, dxr, gr, B, S);

    const vector<float> p(pd.begin(), pd.end()), x(xd.begin(), xd.end()), dy(dyd.begin(), dyd.end());
    const ComputeCtx ctx{2};
    vector<float> y_keep(N * d), dx_keep(N * d), g_keep(l.total_floats, 0.0f);
    vector<float> saved(layer_saved_floats(c, B, S));
    vector<float> ws_keep(layer_workspace_floats(c, B, S, ActivationMode::keep));
    LayerBuffers keep;
    keep.x_in = x.data();
    keep.x_out = y_keep.data();
    keep.dy = dy.data();
    keep.dx = dx_keep.data();
    keep.grads = g_keep.data();
    keep.saved = saved.data();
    keep.workspace = ws_keep.data();
    layer_forward(c, p.data(), {B, S}, keep, ctx);
    const vector<float> saved_after_forward = saved;
    layer_backward(c, p.data(), {B, S}, keep, ctx);
    // The backward makes what the forward did not keep in its own scratch: the kept buffer is read only.
    CHECK(std::memcmp(saved.data(), saved_after_forward.data(), saved.size() * 4) == 0);
    CHECK(rel_err(y_keep, yr) < 1e-5);
    CHECK(rel_err(dx_keep, dxr) < 1e-5);
    for (const auto& t : l.tensors) {
      INFO(t.name);
      CHECK(rel_err(g_keep.data() + t.offset, gr.data() + t.offset, t.numel) < 1e-5);
    }
    // Recompute mode: the same bits (the backward reruns the very same forward code).
    vector<float> y_re(N * d), dx_re(N * d), g_re(l.total_floats, 0.0f);
    vector<float> ws_re(layer_workspace_floats(c, B, S, ActivationMode::recompute));
    LayerBuffers re;
    re.x_in = x.data();
    re.x_out = y_re.data();
    re.dy = dy.data();
    re.dx = dx_re.data();
    re.grads = g_re.data();
    re.workspace = ws_re.data();
    layer_forward(c, p.data(), {B, S}, re, ctx);
    layer_backward(c, p.data(), {B, S}, re, ctx);
    CHECK(std::memcmp(y_re.data(), y_keep.data(), y_re.size() * 4) == 0);
    CHECK(std::memcmp(dx_re.data(), dx_keep.data(), dx_re.size() * 4) == 0);
    CHECK(std::memcmp(g_re.data(), g_keep.data(), g_re.size() * 4) == 0);
    // Gradients add into the caller's buffer: a second backward doubles them.
    layer_backward(c, p.data(), {B, S}, re, ctx);
    vector<float> twice(g_keep.size());
    for (std::size_t i = 0; i < g_keep.size(); ++i) twice[i] = 2.0f * g_keep[i];
    CHECK(rel_err(g_re, twice) < 1e-6);
  }
}

TEST_CASE("documents: fast layers match the fp64 reference given the same positions, which match FD",
          "[layers][documents]") {
  // Row 0: documents of 3, 1 and 5 tokens; row 1: a document of 9. Every family (windows, sinks, q/k norms,
  // experts, GPT-2's learned positions through the attention only: the layer has no position table).
  const std::vector<std::int32_t> pos = {0, 1, 2, 0, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8};
  for (const auto& [name, c] : all_configs()) {
    INFO(name);
    const std::int64_t B = 2, S = 9, N = B * S, d = c.hidden_size;
    const ParamLayout l = layer_layout(c, 0);
    const auto pd = mt::test::random_stage_params(l, 4);
    const auto xd = mt::test::randn<double>(N * d, 5), dyd = mt::test::randn<double>(N * d, 6);
    auto fwd = [&](const vector<double>& x) {
      return c.is_gpt2() ? ref::gpt2_forward(c, pd.data(), x.data(), B, S, pos.data()).y
                         : ref::llama_forward(c, pd.data(), x.data(), B, S, pos.data()).y;
    };
    vector<double> dxr(N * d, 0.0), gr(l.total_floats, 0.0);
    const auto yr = fwd(xd);
    if (c.is_gpt2())
      ref::gpt2_backward(c, pd.data(), xd.data(), dyd.data(), dxr.data(), gr.data(), B, S, pos.data());
    else
      ref::llama_backward(c, pd.data(), xd.data(), dyd.data(), dxr.data(), gr.data(), B, S, pos.data());
    auto xv = xd;  // the reference's dx against finite differences of its own forward
    CHECK(rel_err(dxr, mt::test::numeric_grad(xv, [&] { return mt::test::dot(fwd(xv), dyd); })) < 1e-6);
    CHECK(rel_err(yr, ref_layer_forward(c, pd, xd, B, S)) > 1e-3);  // the documents change the layer

    const vector<float> p(pd.begin(), pd.end()), x(xd.begin(), xd.end()), dy(dyd.begin(), dyd.end());
    const ComputeCtx ctx{2};
    const BatchRows rows{B, S, pos.data()};
    vector<float> y(N * d), dx(N * d), g(l.total_floats, 0.0f);
    vector<float> ws(layer_workspace_floats(c, B, S, ActivationMode::recompute));
    LayerBuffers bufs;
    bufs.x_in = x.data();
    bufs.x_out = y.data();
    bufs.dy = dy.data();
    bufs.dx = dx.data();
    bufs.grads = g.data();
    bufs.workspace = ws.data();
    layer_forward(c, p.data(), rows, bufs, ctx);
    layer_backward(c, p.data(), rows, bufs, ctx);
    CHECK(rel_err(y, yr) < 1e-5);
    CHECK(rel_err(dx, dxr) < 1e-5);
    for (const auto& t : l.tensors) {
      INFO(t.name);
      CHECK(rel_err(g.data() + t.offset, gr.data() + t.offset, t.numel) < 1e-5);
    }
  }
}

TEST_CASE("a kept layer keeps no copy of its input, its norms' outputs or its MLP activation", "[layers][keep]") {
  {  // GPT-2: mean and rstd of both norms, c_attn's output, attention out, lse, x1, c_fc's output.
    const ModelConfig c = mt::test::tiny_gpt2();
    const std::int64_t B = 2, S = 8, N = B * S, d = 16, ff = 64;
    CHECK(layer_saved_floats(c, B, S) == static_cast<std::size_t>(4 * N + 3 * N * d + N * d + N * 4 + N * d + N * ff));
  }
  // The demo model's shape: what the budget's kept layers cost (llama_layer.cpp, ffn_block.cpp).
  ModelConfig c = mt::test::tiny_llama();
  c.hidden_size = 384;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 1024;
  c.max_position_embeddings = 256;
  const std::int64_t B = 4, S = 128, N = B * S, d = 384, qd = 384, kd = 128, ff = 1024;
  // rstd1, q, k, v, attention out, lse, x1, rstd2, gate, up.
  const std::size_t want = static_cast<std::size_t>(N + N * qd + 2 * N * kd + N * qd + N * 6 + N * d + N + 2 * N * ff);
  CHECK(layer_saved_floats(c, B, S) == want);
  // Its backward needs the layer input again, then (refused before any compute).
  vector<float> dy(N * d, 0.25f), dx(N * d);
  vector<float> p(layer_layout(c, 0).total_floats, 0.01f), g(p.size()), saved(want);
  vector<float> ws(layer_workspace_floats(c, B, S, ActivationMode::keep));
  const ComputeCtx ctx{1};
  LayerBuffers bufs;  // no x_in
  bufs.dy = dy.data();
  bufs.dx = dx.data();
  bufs.grads = g.data();
  bufs.saved = saved.data();
  bufs.workspace = ws.data();
  CHECK_THROWS_WITH(layer_backward(c, p.data(), {B, S}, bufs, ctx), Catch::Contains("x_in"));
}

TEST_CASE("head: chunked fused loss and gradients match the fp64 reference", "[layers][head]") {
  for (const auto& [name, c0] : all_configs()) {
    for (bool tied : {false, true}) {
      ModelConfig c = c0;
      if (!c.is_gpt2()) c.tie_word_embeddings = tied;
      INFO(name << (c.tie_word_embeddings ? " tied" : " untied"));
      const std::int64_t B = 3, S = 5, N = B * S, d = c.hidden_size, V = c.vocab_size;
      const ParamLayout hl = head_layout(c), el = embedding_layout(c);
      const auto hp = mt::test::random_stage_params(hl, 7), ep = mt::test::random_stage_params(el, 8),
                 xd = mt::test::randn<double>(N * d, 9);
      vector<std::int32_t> targets(N);
      for (std::int64_t i = 0; i < N; ++i)
        targets[i] = (i % 4 == 1) ? kIgnoreIndex : static_cast<std::int32_t>((i * 7) % V);
      const bool is_tied = c.is_gpt2() || c.tie_word_embeddings;
      const std::size_t W_off = is_tied ? el.tensors[0].offset : hl.at("lm_head.weight").offset;
      const double* Wd = (is_tied ? ep.data() : hp.data()) + W_off;
      vector<double> dxr(N * d, 0.0), dhr(hl.total_floats, 0.0), dWr(V * d, 0.0);
      const double lr =
          ref::head_loss(c, hp.data(), Wd, xd.data(), targets.data(), N, dxr.data(), dhr.data(), dWr.data());

      // fp64 finite differences of the reference loss w.r.t. the input, once per family
      if (!tied) {
        auto xm = xd;
        auto loss = [&] {
          return ref::head_loss(c, hp.data(), Wd, xm.data(), targets.data(), N, static_cast<double*>(nullptr),
                                static_cast<double*>(nullptr), static_cast<double*>(nullptr));
        };
        CHECK(rel_err(dxr, mt::test::numeric_grad(xm, loss)) < 1e-6);
      }

      const vector<float> h(hp.begin(), hp.end()), e(ep.begin(), ep.end()), x(xd.begin(), xd.end());
      vector<float> dx(N * d), dh(hl.total_floats, 0.0f), de(el.total_floats, 0.0f);
      ComputeCtx ctx{2};
      ctx.head_chunk = 4;  // 15 tokens: chunks of 4, 4, 4, 3
      vector<float> ws(head_workspace_floats(c, B, S, ctx.head_chunk));
      HeadBuffers hb;
      hb.x_in = x.data();
      hb.targets = targets.data();
      hb.dx = dx.data();
      hb.head_grads = dh.data();
      hb.embed_grads = de.data();
      hb.workspace = ws.data();
      const LossSum ls = head_forward_backward(c, h.data(), e.data(), {B, S}, hb, ctx);
      CHECK(ls.counted == N - 4);
      CHECK(std::abs(ls.loss_sum - lr) / lr < 1e-6);
      CHECK(rel_err(dx, dxr) < 1e-5);
      const float* dW = (is_tied ? de.data() : dh.data()) + W_off;
      CHECK(rel_err(dW, dWr.data(), static_cast<std::size_t>(V * d)) < 1e-5);
      for (const auto& t : hl.tensors) {
        if (t.name == "lm_head.weight") continue;
        INFO(t.name);
        CHECK(rel_err(dh.data() + t.offset, dhr.data() + t.offset, t.numel) < 1e-5);
      }
      // Sequence tiles (long context): the norm, logits, loss and backward per chunk of at most seq_tile
      // rows (chunks cross sequence ends), against the same reference; a smaller workspace.
      for (std::int64_t tile : {1, 2, 4}) {
        INFO("seq_tile " << tile);
        ComputeCtx tiled{2};
        tiled.seq_tile = tile;
        vector<float> wst(head_workspace_floats(c, B, S, 0, Precision::fp32, tile));
        CHECK(wst.size() < head_workspace_floats(c, B, S));
        vector<float> dxt(N * d), dht(hl.total_floats, 0.0f), det(el.total_floats, 0.0f);
        HeadBuffers hbt = hb;
        hbt.dx = dxt.data();
        hbt.head_grads = dht.data();
        hbt.embed_grads = det.data();
        hbt.workspace = wst.data();
        const LossSum lt = head_forward_backward(c, h.data(), e.data(), {B, S}, hbt, tiled);
        CHECK(lt.counted == N - 4);
        CHECK(std::abs(lt.loss_sum - lr) / lr < 1e-6);
        CHECK(rel_err(dxt, dxr) < 1e-5);
        CHECK(rel_err((is_tied ? det.data() : dht.data()) + W_off, dWr.data(), static_cast<std::size_t>(V * d)) < 1e-5);
        for (const auto& t : hl.tensors) {
          if (t.name == "lm_head.weight") continue;
          INFO(t.name);
          CHECK(rel_err(dht.data() + t.offset, dhr.data() + t.offset, t.numel) < 1e-5);
        }
        HeadBuffers loss_only;
        loss_only.x_in = x.data();
        loss_only.targets = targets.data();
        loss_only.workspace = wst.data();
        const LossSum lo = head_forward_backward(c, h.data(), e.data(), {B, S}, loss_only, tiled);
        CHECK(std::abs(lo.loss_sum - lr) / lr < 1e-6);
      }
      // Loss only: same loss, no gradient written.
      ComputeCtx one{1};
      vector<float> ws1(head_workspace_floats(c, B, S));
      HeadBuffers loss_only;
      loss_only.x_in = x.data();
      loss_only.targets = targets.data();
      loss_only.workspace = ws1.data();
      const LossSum lo = head_forward_backward(c, h.data(), e.data(), {B, S}, loss_only, one);
      CHECK(std::abs(lo.loss_sum - lr) / lr < 1e-6);
      // Logits (materialised, for evaluation) agree with the reference ones.
      vector<float> logits(N * V);
      head_logits(c, h.data(), e.data(), x.data(), B, S, logits.data(), ws1.data(), one);
      double l2 = 0;
      for (std::int64_t r = 0; r < N; ++r) {
        if (targets[r] < 0) continue;
        double mx = -1e300, sum = 0;
        for (std::int64_t j = 0; j < V; ++j) mx = std::max(mx, double(logits[r * V + j]));
        for (std::int64_t j = 0; j < V; ++j) sum += std::exp(double(logits[r * V + j]) - mx);
        l2 += mx + std::log(sum) - logits[r * V + targets[r]];
      }
      CHECK(std::abs(l2 - lr) / lr < 1e-5);
    }
  }
}

TEST_CASE("embedding forward and backward (repeated tokens, positions)", "[layers][embedding]") {
  for (const auto& [name, c] : all_configs()) {
    INFO(name);
    const std::int64_t B = 2, S = 6, N = B * S, d = c.hidden_size;
    const ParamLayout l = embedding_layout(c);
    const auto pd = mt::test::random_stage_params(l, 10);
    const vector<float> p(pd.begin(), pd.end());
    const vector<token_t> tok = {1, 5, 1, 1, 0, 36, 5, 5, 2, 1, 0, 3};
    vector<float> x(N * d);
    embedding_forward(c, p.data(), tok.data(), B, S, x.data(), ComputeCtx{2});
    const auto dx = mt::test::randn(N * d, 11);
    vector<float> g(l.total_floats, 0.0f);
    embedding_backward(c, tok.data(), B, S, dx.data(), g.data(), ComputeCtx{2});
    vector<double> ge(l.total_floats, 0.0);
    for (std::int64_t r = 0; r < N; ++r)
      for (std::int64_t j = 0; j < d; ++j) {
        double expect = p[l.tensors[0].offset + tok[r] * d + j];
        ge[l.tensors[0].offset + tok[r] * d + j] += dx[r * d + j];
        if (c.is_gpt2()) {
          expect += p[l.at("wpe.weight").offset + (r % S) * d + j];
          ge[l.at("wpe.weight").offset + (r % S) * d + j] += dx[r * d + j];
        }
        REQUIRE(x[r * d + j] == static_cast<float>(expect));
      }
    CHECK(rel_err(g, ge) < 1e-6);
  }
}

TEST_CASE("bad input is a clear error before any compute", "[layers][errors]") {
  const ModelConfig c = mt::test::tiny_llama();
  const ParamLayout l = layer_layout(c, 0);
  vector<float> p(l.total_floats), x(4 * 16), y(4 * 16), ws(1 << 16), e(embedding_layout(c).total_floats);
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const std::invalid_argument& ex) {
      return std::string(ex.what());
    }
    return std::string("no exception");
  };
  LayerBuffers bufs;
  bufs.x_in = x.data();
  bufs.x_out = y.data();
  bufs.workspace = ws.data();
  CHECK_THAT(message([&] { layer_forward(c, p.data(), {0, 4}, bufs, ComputeCtx{}); }), Catch::Contains("batch size"));
  CHECK_THAT(message([&] {
               layer_forward(c, p.data(), {1, -3}, bufs, ComputeCtx{});
             }),
             Catch::Contains("sequence length"));
  CHECK_THAT(message([&] { layer_workspace_floats(c, 1, 65, ActivationMode::keep); }), Catch::Contains("rotary table"));
  const vector<token_t> bad = {1, 2, 37, 0};
  CHECK_THAT(message([&] { embedding_forward(c, e.data(), bad.data(), 1, 4, x.data(), ComputeCtx{}); }),
             Catch::Contains("outside the vocabulary"));
  const vector<token_t> neg = {1, -1, 3, 0};
  CHECK_THAT(message([&] { embedding_forward(c, e.data(), neg.data(), 1, 4, x.data(), ComputeCtx{}); }),
             Catch::Contains("token id -1"));
  CHECK_THAT(message([&] { validate_targets(c, neg.data(), neg.size()); }), Catch::Contains("target id -1"));
  ModelConfig odd = c;
  odd.num_key_value_heads = 3;
  CHECK_THAT(message([&] { layer_saved_floats(odd, 1, 4); }), Catch::Contains("num_key_value_heads"));
  ModelConfig zero = c;
  zero.hidden_size = 0;
  CHECK_THAT(message([&] { layer_saved_floats(zero, 1, 4); }), Catch::Contains("hidden_size"));
  CHECK_THAT(message([&] { stage_workspace_floats(c, 4, 1, 4, ActivationMode::keep); }), Catch::Contains("stage 4"));
  CHECK(stage_workspace_floats(c, 0, 2, 8, ActivationMode::keep) == 0);
  CHECK(stage_workspace_floats(c, 1, 2, 8, ActivationMode::recompute) ==
        layer_workspace_floats(c, 2, 8, ActivationMode::recompute));
  CHECK(stage_workspace_floats(c, 3, 2, 8, ActivationMode::keep) == head_workspace_floats(c, 2, 8));
  ModelConfig g2 = mt::test::tiny_gpt2();
  CHECK_THAT(message([&] { validate_batch_shape(g2, 1, 33); }), Catch::Contains("position embedding"));
  CHECK_THAT(message([&] { validate_batch_shape(c, 1, c.max_position_embeddings + 1); }),
             Catch::Contains("rotary table"));
  // dynamic rope_scaling exists to run past max_position_embeddings (its base grows there)
  const ModelConfig dyn = mt::test::tiny_dynamic_rope();
  CHECK_NOTHROW(validate_batch_shape(dyn, 1, dyn.max_position_embeddings * 4));
  LayerBuffers aliased = bufs;
  aliased.x_out = x.data();
  CHECK_THAT(message([&] { layer_forward(c, p.data(), {1, 4}, aliased, ComputeCtx{}); }), Catch::Contains("alias"));
}
