// Sequence tiles (long context, ComputeCtx::seq_tile): the tiled layer against the fp64 references
// (themselves checked against finite differences in test_layers.cpp, which also checks the tiled head)
// and against the untiled fast path, in fp32 and bf16; tile sizes that do not divide the sequence, one tile short of
// it, and tiles of one token; thread-count independence; the sequence-sized buffers kept apart from the
// workspace (as the engine maps them in host RAM) giving the same bits; and what the workspace sizes promise.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/reference_layers.hpp"
#include "kernels/stage_api.hpp"
#include "kernels/stages.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/kernels/model_configs.hpp"

using namespace mt;
using mt::test::all_configs;
using mt::test::rel_err;
using std::vector;

namespace {

struct LayerRun {
  vector<float> y, dx, g;
  // The layer's buffers for a forward and backward of x, dy into this run (recompute mode, no tiles' buffers
  // apart: the caller adds those).
  LayerBuffers buffers(const vector<float>& x, const vector<float>& dy, vector<float>& ws) {
    LayerBuffers b;
    b.x_in = x.data();
    b.x_out = y.data();
    b.dy = dy.data();
    b.dx = dx.data();
    b.grads = g.data();
    b.workspace = ws.data();
    return b;
  }
};

// One layer's inputs for the tiled runs that place their buffers apart: 2 sequences of 45 tokens in
// tiles of 16 (a short last tile), random parameters (fp32, and rounded to bf16), x and dy.
struct TiledInputs {
  static constexpr std::int64_t B = 2, S = 45, N = B * S, tile = 16;
  vector<float> p, x, dy;
  vector<bf16_t> p16;
  explicit TiledInputs(const ModelConfig& c) {
    const auto pd = mt::test::random_stage_params(layer_layout(c, 0), 41);
    p.assign(pd.begin(), pd.end());
    x = mt::test::randn<float>(N * c.hidden_size, 42);
    dy = mt::test::randn<float>(N * c.hidden_size, 43);
    p16.resize(p.size());
    cpu::to_bf16(p.data(), p16.data(), p.size(), 1);
  }
  const void* weights(Precision prec) const {
    return prec == Precision::bf16 ? static_cast<const void*>(p16.data()) : p.data();
  }
  LayerRun empty_run(const ModelConfig& c) const {
    return {vector<float>(N * c.hidden_size), vector<float>(N * c.hidden_size), vector<float>(p.size(), 0.0f)};
  }
};

// Forward then recomputing backward of one layer with the fast stages at `prec`, `seq_tile`, `threads`.
LayerRun run_layer(const ModelConfig& c, const vector<float>& p32, const vector<float>& x, const vector<float>& dy,
                   std::int64_t B, std::int64_t S, std::int64_t seq_tile, Precision prec, int threads) {
  ComputeCtx ctx{threads};
  ctx.precision = prec;
  ctx.seq_tile = seq_tile;
  vector<bf16_t> p16;
  const void* w = p32.data();
  if (prec == Precision::bf16) {
    p16.resize(p32.size());
    cpu::to_bf16(p32.data(), p16.data(), p32.size(), 1);
    w = p16.data();
  }
  const std::int64_t N = B * S, d = c.hidden_size;
  LayerRun r{vector<float>(N * d), vector<float>(N * d), vector<float>(p32.size(), 0.0f)};
  vector<float> ws(layer_workspace_floats(c, B, S, ActivationMode::recompute, prec, seq_tile));
  LayerBuffers bufs = r.buffers(x, dy, ws);
  layer_forward(c, w, {B, S}, bufs, ctx);
  layer_backward(c, w, {B, S}, bufs, ctx);
  return r;
}

bool same_bits(const vector<float>& a, const vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

vector<ModelConfig> tiled_families() {
  vector<ModelConfig> r;
  for (const auto& n : all_configs())
    if (!n.cfg.is_gpt2()) r.push_back(n.cfg);
  return r;
}

}  // namespace

TEST_CASE("tiled layers match the fp64 reference and the whole-sequence layer", "[layers][tiles]") {
  for (const auto& named : all_configs()) {
    const ModelConfig& c = named.cfg;
    if (c.is_gpt2()) continue;
    INFO(named.name);
    const std::int64_t B = 2, S = 37, N = B * S, d = c.hidden_size;
    const ParamLayout l = layer_layout(c, 0);
    const auto pd = mt::test::random_stage_params(l, 11);
    const auto xd = mt::test::randn<double>(N * d, 12), dyd = mt::test::randn<double>(N * d, 13);
    vector<double> dxr(N * d, 0.0), gr(l.total_floats, 0.0);
    const auto yr = ref::llama_forward(c, pd.data(), xd.data(), B, S).y;
    ref::llama_backward(c, pd.data(), xd.data(), dyd.data(), dxr.data(), gr.data(), B, S);
    const vector<float> p(pd.begin(), pd.end()), x(xd.begin(), xd.end()), dy(dyd.begin(), dyd.end());
    const LayerRun whole = run_layer(c, p, x, dy, B, S, 0, Precision::fp32, 2);
    for (std::int64_t tile : {1, 8, 16, 36}) {
      INFO("seq_tile " << tile);
      const LayerRun t = run_layer(c, p, x, dy, B, S, tile, Precision::fp32, 2);
      CHECK(rel_err(t.y, yr) < 1e-5);
      CHECK(rel_err(t.dx, dxr) < 1e-5);
      for (const auto& ts : l.tensors) {
        INFO(ts.name);
        CHECK(rel_err(t.g.data() + ts.offset, gr.data() + ts.offset, ts.numel) < 1e-5);
      }
      CHECK(rel_err(t.y, whole.y) < 1e-6);  // the same math in another summation order
      CHECK(rel_err(t.dx, whole.dx) < 1e-6);
      CHECK(rel_err(t.g, whole.g) < 1e-6);
    }
    // A tile of the whole sequence or more is the whole-sequence layer, bit for bit.
    for (std::int64_t tile : {S, 4 * S}) {
      const LayerRun t = run_layer(c, p, x, dy, B, S, tile, Precision::fp32, 2);
      CHECK(same_bits(t.y, whole.y));
      CHECK(same_bits(t.g, whole.g));
    }
  }
}

TEST_CASE("tiled layers do not depend on the thread count, and their gradients add", "[layers][tiles]") {
  for (const ModelConfig& c : tiled_families()) {
    const std::int64_t B = 1, S = 61, N = B * S, d = c.hidden_size;
    const ParamLayout l = layer_layout(c, 0);
    const auto pd = mt::test::random_stage_params(l, 21);
    const auto xd = mt::test::randn<float>(N * d, 22), dyd = mt::test::randn<float>(N * d, 23);
    const vector<float> p(pd.begin(), pd.end());
    for (Precision prec : {Precision::fp32, Precision::bf16}) {
      const LayerRun one = run_layer(c, p, xd, dyd, B, S, 16, prec, 1);
      const LayerRun two = run_layer(c, p, xd, dyd, B, S, 16, prec, 2);
      CHECK(same_bits(one.y, two.y));
      CHECK(same_bits(one.dx, two.dx));
      CHECK(same_bits(one.g, two.g));
    }
    // A second backward into the same gradient buffer doubles it.
    ComputeCtx ctx{2};
    ctx.seq_tile = 16;
    vector<float> ws(layer_workspace_floats(c, B, S, ActivationMode::recompute, Precision::fp32, 16));
    vector<float> dx(N * d), g(p.size(), 0.0f);
    LayerBuffers bufs;
    bufs.x_in = xd.data();
    bufs.dy = dyd.data();
    bufs.dx = dx.data();
    bufs.grads = g.data();
    bufs.workspace = ws.data();
    for (int i = 0; i < 2; ++i) layer_backward(c, p.data(), {B, S}, bufs, ctx);
    const LayerRun once = run_layer(c, p, xd, dyd, B, S, 16, Precision::fp32, 2);
    vector<float> twice(once.g.size());
    for (std::size_t i = 0; i < twice.size(); ++i) twice[i] = 2.0f * once.g[i];
    CHECK(rel_err(g, twice) < 1e-6);
  }
}

TEST_CASE("tiled bf16 layers agree with the whole-sequence bf16 layer", "[layers][tiles][bf16]") {
  for (const ModelConfig& c : tiled_families()) {
    const std::int64_t B = 2, S = 45, N = B * S, d = c.hidden_size;
    const ParamLayout l = layer_layout(c, 0);
    const auto pd = mt::test::random_stage_params(l, 31);
    const auto x = mt::test::randn<float>(N * d, 32), dy = mt::test::randn<float>(N * d, 33);
    const vector<float> p(pd.begin(), pd.end());
    const LayerRun whole = run_layer(c, p, x, dy, B, S, 0, Precision::bf16, 2);
    const LayerRun tiled = run_layer(c, p, x, dy, B, S, 16, Precision::bf16, 2);
    // The same roundings to bf16 of values that differ only in fp32 summation order: now and then one
    // operand rounds the other way (2^-8 relative), so a few 1e-3 of norm-wise difference at most.
    CHECK(rel_err(tiled.y, whole.y) < 2e-3);
    CHECK(rel_err(tiled.dx, whole.dx) < 5e-3);
    CHECK(rel_err(tiled.g, whole.g) < 5e-3);
  }
}

TEST_CASE("tiled MoE layers give the load-balancing statistics and gradient of the whole-sequence layer",
          "[layers][tiles][moe]") {
  for (ModelConfig c : {mt::test::tiny_mixtral(), mt::test::tiny_gpt_oss()}) {
    INFO(arch_name(c.arch));
    c.output_router_logits = true;
    const std::int64_t B = 2, S = 9, N = B * S, d = c.hidden_size, E = c.num_experts;
    const ParamLayout l = layer_layout(c, 0);
    vector<float> p(l.total_floats);
    init_stage_params(c, 1, 3, p.data());
    const auto x = mt::test::randn(N * d, 31), dy = mt::test::randn(N * d, 32), g = mt::test::randn(E, 33);
    struct Out {
      vector<std::int64_t> counts;
      vector<float> prob_sums, dx, grads;
    };
    auto run = [&](std::int64_t tile) {
      ComputeCtx ctx{2};
      ctx.seq_tile = tile;
      Out o{vector<std::int64_t>(E, -1), vector<float>(E, -1.0f), vector<float>(N * d), vector<float>(p.size(), 0.0f)};
      vector<float> y(N * d), ws(layer_workspace_floats(c, B, S, ActivationMode::recompute, Precision::fp32, tile));
      MoeBalance stats{o.counts.data(), o.prob_sums.data(), nullptr};
      LayerBuffers bufs;
      bufs.x_in = x.data();
      bufs.x_out = y.data();
      bufs.dy = dy.data();
      bufs.dx = o.dx.data();
      bufs.grads = o.grads.data();
      bufs.workspace = ws.data();
      bufs.balance = &stats;
      layer_forward(c, p.data(), {B, S}, bufs, ctx);
      MoeBalance grad{nullptr, nullptr, g.data()};
      bufs.balance = &grad;
      layer_backward(c, p.data(), {B, S}, bufs, ctx);
      return o;
    };
    const Out whole = run(0), tiled = run(4);
    CHECK(whole.counts == tiled.counts);
    std::int64_t choices = 0;
    for (auto n : whole.counts) choices += n;
    CHECK(choices == N * c.num_experts_per_tok);
    CHECK(rel_err(tiled.prob_sums, whole.prob_sums) < 1e-6);
    double total = 0;
    for (float v : whole.prob_sums) total += v;
    CHECK(total == Approx(static_cast<double>(N)).epsilon(1e-5));  // each token's probabilities sum to 1
    CHECK(rel_err(tiled.dx, whole.dx) < 1e-6);
    CHECK(rel_err(tiled.grads, whole.grads) < 1e-6);
    // The gradient is there: without it the router's gradient differs.
    ComputeCtx ctx{2};
    Out plain{{}, {}, vector<float>(N * d), vector<float>(p.size(), 0.0f)};
    vector<float> ws(layer_workspace_floats(c, B, S, ActivationMode::recompute));
    LayerBuffers bufs;
    bufs.x_in = x.data();
    bufs.dy = dy.data();
    bufs.dx = plain.dx.data();
    bufs.grads = plain.grads.data();
    bufs.workspace = ws.data();
    layer_backward(c, p.data(), {B, S}, bufs, ctx);
    const TensorSpec& router = l.at(moe_router_tensor(c));
    CHECK(rel_err(plain.grads.data() + router.offset, whole.grads.data() + router.offset, router.numel) > 1e-3);
  }
}

TEST_CASE("tiled layers with the sequence-sized buffers apart give the same bits", "[layers][tiles]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  constexpr std::int64_t B = TiledInputs::B, S = TiledInputs::S, tile = TiledInputs::tile;
  for (const ModelConfig& c : tiled_families()) {
    INFO(arch_name(c.arch) << (c.qk_norm ? " qk_norm" : ""));
    const TiledInputs in(c);
    const vector<float>&x = in.x, &dy = in.dy;
    for (Precision prec : {Precision::fp32, Precision::bf16}) {
      INFO((prec == Precision::bf16 ? "bf16" : "fp32"));
      const LayerRun in_workspace = run_layer(c, in.p, x, dy, B, S, tile, prec, 2);
      const void* w = in.weights(prec);
      // Both regions start as NaN: the layer must write every float it reads.
      vector<float> ws(layer_workspace_floats(c, B, S, ActivationMode::recompute, prec, tile, SequenceBuffers::apart),
                       nan);
      vector<float> sequence(layer_sequence_floats(c, B, S, tile), nan);
      REQUIRE(ws.size() + sequence.size() ==
              layer_workspace_floats(c, B, S, ActivationMode::recompute, prec, tile, SequenceBuffers::in_workspace));
      cpu::CpuOps ops(prec, 2);
      LayerRun apart = in.empty_run(c);
      LayerBuffers bufs = apart.buffers(x, dy, ws);
      bufs.sequence = sequence.data();
      layer_forward(ops, c, w, {B, S}, bufs, tile);
      layer_backward(ops, c, w, {B, S}, bufs, tile);
      CHECK(same_bits(apart.y, in_workspace.y));
      CHECK(same_bits(apart.dx, in_workspace.dx));
      CHECK(same_bits(apart.g, in_workspace.g));
    }
  }
}

TEST_CASE("tiled layers with their attention output kept give the same bits, and the backward reads it",
          "[layers][tiles]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  constexpr std::int64_t B = TiledInputs::B, S = TiledInputs::S, N = TiledInputs::N, tile = TiledInputs::tile;
  for (const ModelConfig& c : tiled_families()) {
    INFO(arch_name(c.arch) << (c.qk_norm ? " qk_norm" : ""));
    const TiledInputs in(c);
    const vector<float>&x = in.x, &dy = in.dy;
    REQUIRE(layer_attention_floats(c, B, S, tile) == static_cast<std::size_t>(N * (c.q_dim() + c.num_attention_heads)));
    CHECK(layer_attention_floats(c, B, S, 0) == 0);  // whole sequences: nothing to keep apart
    for (Precision prec : {Precision::fp32, Precision::bf16}) {
      INFO((prec == Precision::bf16 ? "bf16" : "fp32"));
      const LayerRun recomputed = run_layer(c, in.p, x, dy, B, S, tile, prec, 2);
      const void* w = in.weights(prec);
      vector<float> ws(layer_workspace_floats(c, B, S, ActivationMode::recompute, prec, tile), nan);
      vector<float> attention(layer_attention_floats(c, B, S, tile), nan);  // the forward must fill all of it
      cpu::CpuOps ops(prec, 2);
      LayerRun kept = in.empty_run(c);
      LayerBuffers bufs = kept.buffers(x, dy, ws);
      bufs.attention = attention.data();
      layer_forward(ops, c, w, {B, S}, bufs, tile);
      for (float a : attention) REQUIRE(std::isfinite(a));
      layer_backward(ops, c, w, {B, S}, bufs, tile);
      CHECK(same_bits(kept.y, recomputed.y));
      CHECK(same_bits(kept.dx, recomputed.dx));
      CHECK(same_bits(kept.g, recomputed.g));
      // The backward reads what was kept (it does not recompute it): scaled, the gradients change.
      for (float& a : attention) a *= 2.0f;
      LayerRun altered = in.empty_run(c);
      bufs.dx = altered.dx.data();
      bufs.grads = altered.g.data();
      layer_backward(ops, c, w, {B, S}, bufs, tile);
      CHECK_FALSE(same_bits(altered.g, recomputed.g));
    }
  }
}

TEST_CASE("tiled workspace: sequence-sized only in keys and values", "[layers][tiles]") {
  ModelConfig c = mt::test::tiny_llama();
  c.max_position_embeddings = 1 << 20;
  const std::int64_t T = 1 << 16, tile = 256;
  const std::size_t whole = layer_workspace_floats(c, 1, T, ActivationMode::recompute);
  const std::size_t tiled = layer_workspace_floats(c, 1, T, ActivationMode::recompute, Precision::fp32, tile);
  // K, V, dK, dV (4 kv_dim) and the RoPE tables (head_dim) per token, plus one tile's worth.
  const std::size_t per_token = 4 * static_cast<std::size_t>(c.kv_dim()) + static_cast<std::size_t>(c.head_dim);
  CHECK(tiled >= per_token * T);
  CHECK(tiled < per_token * T + 100 * tile * static_cast<std::size_t>(c.intermediate_size + c.hidden_size));
  CHECK(tiled * 4 < whole);
  // Doubling the sequence doubles the sequence-sized part only.
  const std::size_t tiled2 = layer_workspace_floats(c, 1, 2 * T, ActivationMode::recompute, Precision::fp32, tile);
  CHECK(tiled2 - tiled >= per_token * T);
  CHECK(tiled2 - tiled < per_token * T + 1024);
  // Kept apart, the sequence-sized part is exactly that, and what stays in the workspace is one tile's.
  const std::size_t sequence = layer_sequence_floats(c, 1, T, tile);
  CHECK(sequence >= per_token * T);
  CHECK(sequence < per_token * T + 1024);
  const auto apart = [&](std::int64_t t) {
    return layer_workspace_floats(c, 1, t, ActivationMode::recompute, Precision::fp32, tile, SequenceBuffers::apart);
  };
  CHECK(apart(T) + sequence == tiled);
  CHECK(apart(2 * T) == apart(T));
  CHECK(layer_sequence_floats(c, 1, T, 0) == 0);  // whole sequences: nothing apart
  CHECK(layer_sequence_floats(c, 1, T, T) == 0);
  CHECK(layer_workspace_floats(c, 1, T, ActivationMode::recompute, Precision::fp32, 0, SequenceBuffers::apart) ==
        whole);
  // Keep mode runs whole sequences: its workspace ignores the tile.
  CHECK(layer_workspace_floats(c, 1, T, ActivationMode::keep, Precision::fp32, tile) ==
        layer_workspace_floats(c, 1, T, ActivationMode::keep));
  // The head's only sequence-sized buffer is the per-token loss.
  CHECK(head_workspace_floats(c, 1, 2 * T, 0, Precision::fp32, tile) -
            head_workspace_floats(c, 1, T, 0, Precision::fp32, tile) <
        static_cast<std::size_t>(T) + 64);
}

TEST_CASE("sequence tiles: bad values and families without them are refused by name", "[layers][tiles][errors]") {
  const ModelConfig g = mt::test::tiny_gpt2();
  CHECK_THROWS_WITH(layer_workspace_floats(g, 1, 16, ActivationMode::recompute, Precision::fp32, 4),
                    Catch::Contains("gpt2 family has no sequence-tiled form"));
  CHECK_NOTHROW(layer_workspace_floats(g, 1, 16, ActivationMode::recompute, Precision::fp32, 16));
  const ModelConfig c = mt::test::tiny_llama();
  CHECK_THROWS_WITH(layer_workspace_floats(c, 1, 16, ActivationMode::recompute, Precision::fp32, -1),
                    Catch::Contains("seq_tile must be >= 0"));
}
