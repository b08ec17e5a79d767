// The sequential reference trainer: determinism (bit-identical weights from the same seed), equality
// of the two activation modes, learning on a fixed batch, and the init conventions.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "kernels/reference_trainer.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/kernels/model_configs.hpp"

using namespace mt;
using std::vector;

namespace {

ReferenceTrainerOptions options(const ModelConfig& c, ActivationMode mode, int threads) {
  ReferenceTrainerOptions o;
  o.config = c;
  o.micro_batch = 2;
  o.seq = 9;
  o.grad_accum = 2;
  o.hyper.lr = 3e-3f;
  o.hyper.weight_decay = 0.1f;
  o.max_grad_norm = 1.0f;
  o.seed = 1234;
  o.mode = mode;
  o.threads = threads;
  return o;
}

void batch(const ModelConfig& c, int step, vector<token_t>& tok, vector<token_t>& tgt) {
  const std::size_t n = 2 * 2 * 9;
  tok.resize(n);
  tgt.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    tok[i] =
        static_cast<token_t>((i * 5 + static_cast<std::size_t>(step) * 3) % static_cast<std::size_t>(c.vocab_size));
    tgt[i] = (i % 7 == 3) ? kIgnoreIndex : static_cast<token_t>((i * 5 + 5) % static_cast<std::size_t>(c.vocab_size));
  }
}

bool same_weights(ReferenceTrainer& a, ReferenceTrainer& b) {
  for (std::int64_t s = 0; s < a.num_stages(); ++s) {
    const std::size_t n = a.layout(s).total_floats;
    if (std::memcmp(a.params(s), b.params(s), n * 4) != 0 || std::memcmp(a.adam_m(s), b.adam_m(s), n * 4) != 0 ||
        std::memcmp(a.adam_v(s), b.adam_v(s), n * 4) != 0)
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE("two runs with the same seed give bit-identical weights after 10 steps", "[trainer][determinism]") {
  for (const ModelConfig& c : {mt::test::tiny_llama(), mt::test::tiny_gpt2(), mt::test::tiny_qwen3()}) {
    INFO(arch_name(c.arch));
    ReferenceTrainer a(options(c, ActivationMode::recompute, 2)), b(options(c, ActivationMode::recompute, 2));
    ReferenceTrainer keep(options(c, ActivationMode::keep, 2));
    vector<token_t> tok, tgt;
    for (int step = 0; step < 10; ++step) {
      batch(c, step, tok, tgt);
      const StepStats sa = a.step(tok.data(), tgt.data());
      const StepStats sb = b.step(tok.data(), tgt.data());
      keep.step(tok.data(), tgt.data());
      REQUIRE(sa.loss == sb.loss);
      REQUIRE(sa.grad_norm == sb.grad_norm);
    }
    CHECK(same_weights(a, b));
    CHECK(same_weights(a, keep));  // keeping activations changes nothing but the speed
  }
}

TEST_CASE("the thread count does not change the bits", "[trainer][determinism]") {
  // Big enough that every kernel takes its threaded path (split sgemm, attention tasks, row loops).
  ModelConfig llama = mt::test::tiny_llama(), gpt2 = mt::test::tiny_gpt2();
  for (ModelConfig* c : {&llama, &gpt2}) {
    c->hidden_size = 64;
    c->intermediate_size = 256;
    c->num_attention_heads = 4;
    c->num_key_value_heads = c->is_gpt2() ? 4 : 2;
    c->head_dim = 16;
    c->vocab_size = 300;
    c->max_position_embeddings = 128;
  }
  for (const ModelConfig* c : {&llama, &gpt2}) {
    INFO(arch_name(c->arch));
    ReferenceTrainerOptions o1 = options(*c, ActivationMode::keep, 1);
    o1.micro_batch = 2;
    o1.seq = 100;
    o1.grad_accum = 1;
    ReferenceTrainerOptions o2 = o1;
    o2.threads = 2;
    ReferenceTrainer one(o1), two(o2);
    vector<token_t> tok(200), tgt(200);
    for (std::size_t i = 0; i < tok.size(); ++i) {
      tok[i] = static_cast<token_t>((i * 37) % 300);
      tgt[i] = static_cast<token_t>((i * 11 + 1) % 300);
    }
    for (int step = 0; step < 2; ++step) {
      one.step(tok.data(), tgt.data());
      two.step(tok.data(), tgt.data());
    }
    CHECK(same_weights(one, two));
  }
}

TEST_CASE("the reference trainer learns a fixed batch", "[trainer]") {
  const ModelConfig c = mt::test::tiny_llama();
  ReferenceTrainer t(options(c, ActivationMode::keep, 1));
  vector<token_t> tok, tgt;
  batch(c, 0, tok, tgt);
  const double before = t.eval_loss(tok.data(), tgt.data());
  StepStats s{};
  for (int i = 0; i < 30; ++i) s = t.step(tok.data(), tgt.data());
  CHECK(s.step == 30);
  CHECK(s.counted == 31);                                          // 36 targets, 5 of them -100
  CHECK(std::abs(before - std::log(double(c.vocab_size))) < 0.1);  // untrained: about uniform
  CHECK(t.eval_loss(tok.data(), tgt.data()) < 0.7 * before);
}

TEST_CASE("initialisation follows Hugging Face conventions, stage by stage", "[trainer][init]") {
  ModelConfig c = mt::test::tiny_gpt2();
  c.hidden_size = 64;
  c.intermediate_size = 256;
  c.num_attention_heads = c.num_key_value_heads = 4;
  c.head_dim = 16;
  c.num_hidden_layers = 8;
  const ParamLayout l = layer_layout(c, 0);
  vector<float> p(l.total_floats), q(l.total_floats), r(l.total_floats);
  init_stage_params(c, 3, 7, p.data());
  init_stage_params(c, 4, 7, r.data());
  init_stage_params(c, 3, 7, q.data(), 2);                    // any thread count, same bits
  CHECK(std::memcmp(p.data(), q.data(), p.size() * 4) == 0);  // deterministic
  CHECK(std::memcmp(p.data(), r.data(), p.size() * 4) != 0);  // streams differ per stage
  auto stddev = [&](const char* name) {
    const TensorSpec& t = l.at(name);
    double s = 0;
    for (std::size_t i = 0; i < t.numel; ++i) s += double(p[t.offset + i]) * p[t.offset + i];
    return std::sqrt(s / double(t.numel));
  };
  CHECK(stddev("attn.c_attn.weight") == Approx(0.02).epsilon(0.05));
  CHECK(stddev("mlp.c_proj.weight") == Approx(0.02 / std::sqrt(16.0)).epsilon(0.05));
  CHECK(p[l.at("ln_1.weight").offset] == 1.0f);
  CHECK(p[l.at("ln_1.bias").offset] == 0.0f);
  CHECK(p[l.at("attn.c_attn.bias").offset + 5] == 0.0f);
}

TEST_CASE("step scale: loss normalisation and clipping", "[trainer][step]") {
  // sumsq of the summed-loss gradient 400 over 10 counted tokens: norm = 20 / 10 = 2
  const StepScale s = compute_step_scale({100.0, 300.0}, 10, 1.0f, 25.0);
  CHECK(s.loss == 2.5);
  CHECK(s.grad_norm == Approx(2.0));
  CHECK(s.clip == Approx(0.5).epsilon(1e-6));
  CHECK(s.grad_scale == Approx(0.05f).epsilon(1e-6));
  const StepScale none = compute_step_scale({100.0, 300.0}, 10, 0.0f);
  CHECK(none.clip == 1.0);
  CHECK(none.grad_scale == 0.1f);
  CHECK(compute_step_scale({1.0}, 0, 1.0f).grad_scale == 0.0f);
}

// The engine's side of the contract in step_math.hpp, written out by hand with its own buffers: the
// same calls in the documented order must reproduce the reference trainer's bits exactly, even with
// the accumulation of each stage deferred until after the whole backward and done in reverse order.
TEST_CASE("a hand-written stage loop following step_math.hpp matches the reference trainer bit for bit",
          "[trainer][contract]") {
  for (const ModelConfig& c : {mt::test::tiny_qwen2(), mt::test::tiny_gpt2(), mt::test::tiny_llama()}) {
    INFO(arch_name(c.arch));
    const ReferenceTrainerOptions o = options(c, ActivationMode::recompute, 2);
    ReferenceTrainer ref(o);
    const std::int64_t S = num_stages(c), L = c.num_hidden_layers, B = o.micro_batch, T = o.seq;
    vector<vector<float>> params(S), accum(S), staging(S), m(S), v(S);
    vector<ParamLayout> layouts;
    std::size_t ws_floats = 0;
    for (std::int64_t s = 0; s < S; ++s) {
      layouts.push_back(stage_layout(c, s));
      const std::size_t n = layouts.back().total_floats;
      params[s].resize(n);
      init_stage_params(c, s, o.seed, params[s].data());
      accum[s].resize(n);
      staging[s].resize(n);
      m[s].assign(n, 0.0f);
      v[s].assign(n, 0.0f);
      ws_floats = std::max(ws_floats, stage_workspace_floats(c, s, B, T, ActivationMode::recompute));
    }
    vector<float> ws(ws_floats), dx(B * T * c.hidden_size), dy(B * T * c.hidden_size);
    vector<vector<float>> acts(L + 1, vector<float>(B * T * c.hidden_size));
    const ComputeCtx ctx{1};  // a different thread count from the reference: same bits
    vector<token_t> tok, tgt;
    for (int step = 1; step <= 3; ++step) {
      batch(c, step, tok, tgt);
      ref.step(tok.data(), tgt.data());
      for (std::int64_t s = 0; s < S; ++s) cpu::zero(accum[s].data(), accum[s].size(), 1);
      double loss_sum = 0;
      std::int64_t counted = 0;
      for (std::int64_t mb = 0; mb < o.grad_accum; ++mb) {
        const token_t* tk = tok.data() + mb * B * T;
        const token_t* tg = tgt.data() + mb * B * T;
        embedding_forward(c, params[0].data(), tk, B, T, acts[0].data(), ctx);
        // Layer l's buffers: its input and output activations, the gradients flowing back, the workspace.
        auto layer_buffers = [&](std::int64_t l) {
          LayerBuffers b;
          b.x_in = acts[l].data();
          b.x_out = acts[l + 1].data();
          b.dy = dy.data();
          b.dx = dx.data();
          b.grads = staging[l + 1].data();
          b.workspace = ws.data();
          return b;
        };
        for (std::int64_t l = 0; l < L; ++l) layer_forward(c, params[l + 1].data(), {B, T}, layer_buffers(l), ctx);
        for (std::int64_t s = 0; s < S; ++s) cpu::zero(staging[s].data(), staging[s].size(), 1);
        HeadBuffers hb;
        hb.x_in = acts[L].data();
        hb.targets = tg;
        hb.dx = dy.data();
        hb.head_grads = staging[S - 1].data();
        hb.embed_grads = staging[0].data();
        hb.workspace = ws.data();
        const LossSum ls = head_forward_backward(c, params[S - 1].data(), params[0].data(), {B, T}, hb, ctx);
        loss_sum += ls.loss_sum;
        counted += ls.counted;
        for (std::int64_t l = L - 1; l >= 0; --l) {
          layer_backward(c, params[l + 1].data(), {B, T}, layer_buffers(l), ctx);
          std::swap(dx, dy);
        }
        embedding_backward(c, tk, B, T, dy.data(), staging[0].data(), ctx);
        for (std::int64_t s = S - 1; s >= 0; --s)
          cpu::accumulate(accum[s].data(), staging[s].data(), accum[s].size(), 1);
      }
      vector<double> sumsq;
      for (std::int64_t s = 0; s < S; ++s) sumsq.push_back(stage_grad_sumsq(layouts[s], accum[s].data(), 1));
      const StepScale sc = compute_step_scale(sumsq, counted, o.max_grad_norm, loss_sum);
      for (std::int64_t s = 0; s < S; ++s)
        adamw_stage(layouts[s], params[s].data(), accum[s].data(), m[s].data(), v[s].data(), o.hyper, step,
                    sc.grad_scale, 1);
    }
    for (std::int64_t s = 0; s < S; ++s) {
      INFO("stage " << s);
      CHECK(std::memcmp(params[s].data(), ref.params(s), params[s].size() * 4) == 0);
      CHECK(std::memcmp(v[s].data(), ref.adam_v(s), v[s].size() * 4) == 0);
    }
  }
}
