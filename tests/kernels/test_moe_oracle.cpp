// The mixture-of-experts families against outside oracles: mixtral against transformers' own
// MixtralForCausalLM (tests/kernels/hf_moe_oracle.py, the venv's transformers 4.46.3, eager attention),
// qwen3_moe against a PyTorch model written from transformers' modeling_qwen3_moe.py
// (tests/kernels/qwen3_moe_oracle.py says which version and what it follows; 4.46.3 lacks the family,
// and it runs in fp64), gpt_oss against one written from transformers 4.56's modeling_gpt_oss.py
// (tests/kernels/gpt_oss_oracle.py, fp64). megatrain exports its initial weights as a Hugging Face
// directory, transformers loads it (so the export's names, shapes and config are what transformers
// reads) and runs one forward and backward; the logits, the loss and every parameter's gradient must
// agree within 1e-5 norm-wise relative error per tensor, and a bf16 step's within bf16's tolerances
// (loss 1e-2, gradients 5e-2). The same weights written in transformers v5's fused expert layout must
// load back bit for bit; gpt-oss's hub form (MXFP4 experts) must load as the oracle dequantizes it. And the optimizer
// semantics of idle experts: with fewer choices than experts, the idle ones get a gradient of exactly zero and the
// normal AdamW update (weight decay only, moments untouched but decayed from zero).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/reference_trainer.hpp"
#include "storage/hf/hf_model.hpp"
#include "storage/hf/safetensors_reader.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/kernels/model_configs.hpp"

using namespace mt;
using std::vector;
namespace fs = std::filesystem;

namespace {

ReferenceTrainerOptions options(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  ReferenceTrainerOptions o;
  o.config = c;
  o.micro_batch = B;
  o.seq = T;
  o.hyper.lr = 1e-3f;
  o.hyper.weight_decay = 0.1f;
  o.max_grad_norm = 0.0f;
  o.seed = 7;
  o.mode = ActivationMode::keep;
  o.threads = 2;
  return o;
}

// The second form of the same weights each oracle writes: transformers v5's fused experts (DIR/fused,
// which must read back bit for bit), or the hub's MXFP4 experts (DIR/mxfp4, whose experts must read as
// the oracle's own dequantization, DIR/mxfp4_dequant.safetensors, and the rest as exported).
enum class SecondForm { v5_fused, mxfp4 };

// One step of `c` from megatrain's reference trainer against `oracle` (a script of tests/kernels run on
// megatrain's export): logits, loss and every gradient; then the second form the oracle wrote.
// `prepare` may change the initial weights first.
void check_step_against(ModelConfig c, const char* oracle, int expected_tensors,
                        SecondForm second = SecondForm::v5_fused,
                        const std::function<void(ReferenceTrainer&)>& prepare = {}, double bf16_grad_tol = 5e-2) {
  c.initializer_range = 0.2f;  // every path carries signal
  const std::int64_t B = 2, T = 7, N = B * T, V = c.vocab_size;
  ReferenceTrainer tr(options(c, B, T));
  if (prepare) prepare(tr);
  const std::int64_t S = tr.num_stages();
  vector<vector<float>> initial(S);
  for (std::int64_t s = 0; s < S; ++s) initial[s].assign(tr.params(s), tr.params(s) + tr.layout(s).total_floats);
  vector<token_t> tok(N), tgt(N);
  for (std::int64_t i = 0; i < N; ++i) {
    tok[i] = static_cast<token_t>((i * 11 + 3) % V);
    tgt[i] = (i % 5 == 2) ? kIgnoreIndex : static_cast<token_t>((i * 13 + 1) % V);
  }
  const fs::path dir = fs::temp_directory_path() /
                       ("mt_moe_oracle_" + std::string(arch_name(c.arch)) + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  hf::write_hf_model(
      dir / "model", c, [&](std::int64_t s) { return initial[s].data(); }, hf::HfExportOptions{});
  mt::test::write_bin(dir / "tokens.bin", tok);
  mt::test::write_bin(dir / "targets.bin", tgt);
  std::ofstream(dir / "shape.json") << nlohmann::json{{"batch", B}, {"seq", T}}.dump();
  const std::string cmd =
      std::string(MEGATRAIN_VENV_PYTHON) + " " + MEGATRAIN_SOURCE_DIR + "/tests/kernels/" + oracle + " " + dir.string();
  REQUIRE(std::system(cmd.c_str()) == 0);

  // Logits through the stage API on the initial weights.
  ComputeCtx ctx{2};
  vector<float> x(N * c.hidden_size), y(N * c.hidden_size), logits(N * V), saved(layer_saved_floats(c, B, T));
  vector<float> ws(std::max(layer_workspace_floats(c, B, T, ActivationMode::recompute),
                            head_workspace_floats(c, B, T, 0, Precision::fp32)));
  embedding_forward(c, tr.params(0), tok.data(), B, T, x.data(), ctx);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerBuffers bufs;
    bufs.x_in = x.data();
    bufs.x_out = y.data();
    bufs.workspace = ws.data();
    layer_forward(c.layer_config(l), tr.params(l + 1), {B, T}, bufs, ctx);
    std::swap(x, y);
  }
  head_logits(c, tr.params(S - 1), tr.params(0), x.data(), B, T, logits.data(), ws.data(), ctx);
  vector<float> torch_logits(logits.size());
  std::ifstream(dir / "logits.bin", std::ios::binary)
      .read(reinterpret_cast<char*>(torch_logits.data()), static_cast<std::streamsize>(logits.size() * 4));
  CHECK(mt::test::rel_err(logits, torch_logits) < 1e-5);

  const StepStats st = tr.step(tok.data(), tgt.data());
  double torch_loss = 0;
  std::ifstream(dir / "loss.txt") >> torch_loss;
  CHECK(std::abs(st.loss - torch_loss) / torch_loss < 1e-5);
  const hf::SafetensorsReader grads(dir / "grads.safetensors");
  int tensors = 0;
  for (std::int64_t s = 0; s < S; ++s)
    for (const auto& t : tr.layout(s).tensors) {
      const std::string name = tr.layout(s).prefix + t.name;
      INFO(name);
      vector<float> theirs(t.numel), ours(t.numel);
      grads.read_f32(name, t.shape, theirs.data());
      for (std::size_t i = 0; i < t.numel; ++i)
        ours[i] = tr.grads(s)[t.offset + i] / static_cast<float>(st.counted);  // accumulators hold d(sum)
      CHECK(mt::test::rel_err(ours, theirs) < 1e-5);
      ++tensors;
    }
  CHECK(tensors == expected_tensors);

  // bf16: the same step with bf16 compute copies of the same weights (products in bf16, fp32 accumulation)
  // against the same fp64 oracle, within what bf16 rounding of the weights and operands allows at these
  // few tokens (a token whose top-k flips moves its experts' gradients wholesale): the loss within 1e-2
  // relative, all gradients together within `bf16_grad_tol` norm-wise.
  {
    ReferenceTrainerOptions o = options(c, B, T);
    o.precision = Precision::bf16;
    ReferenceTrainer t16(o);
    for (std::int64_t s = 0; s < S; ++s) std::copy(initial[s].begin(), initial[s].end(), t16.params(s));
    t16.refresh_compute_copies();
    const StepStats s16 = t16.step(tok.data(), tgt.data());
    INFO("bf16 loss " << s16.loss << " oracle " << torch_loss);
    CHECK(std::abs(s16.loss - torch_loss) / torch_loss < 1e-2);
    vector<float> ours, theirs;
    for (std::int64_t s = 0; s < S; ++s)
      for (const auto& t : t16.layout(s).tensors) {
        vector<float> g(t.numel);
        grads.read_f32(t16.layout(s).prefix + t.name, t.shape, g.data());
        theirs.insert(theirs.end(), g.begin(), g.end());
        for (std::size_t i = 0; i < t.numel; ++i)
          ours.push_back(t16.grads(s)[t.offset + i] / static_cast<float>(s16.counted));
      }
    const double err = mt::test::rel_err(ours, theirs);
    INFO("bf16 gradients against the fp64 oracle: " << err);
    CHECK(err < bf16_grad_tol);
    std::printf("%s bf16 against the oracle: loss %.6f vs %.6f, gradients %.4f\n", arch_name(c.arch), s16.loss,
                torch_loss, err);
  }

  if (second == SecondForm::v5_fused) {  // transformers v5's fused layout of the same weights reads back bit for bit
    const hf::HfModelReader fused(dir / "fused");
    for (std::int64_t s = 0; s < S; ++s) {
      INFO("stage " << s);
      vector<float> back(tr.layout(s).total_floats);
      fused.read_stage(s, back.data());
      CHECK(std::memcmp(back.data(), initial[s].data(), back.size() * sizeof(float)) == 0);
    }
  } else {  // MXFP4 experts dequantized on load as the oracle dequantizes them; everything else as exported
    const hf::HfModelReader quantized(dir / "mxfp4");
    const hf::SafetensorsReader dequant(dir / "mxfp4_dequant.safetensors");
    int matrices = 0;
    for (std::int64_t s = 0; s < S; ++s) {
      const ParamLayout& l = tr.layout(s);
      vector<float> back(l.total_floats);
      quantized.read_stage(s, back.data());
      for (const auto& t : l.tensors) {
        INFO(l.prefix + t.name);
        vector<float> want(initial[s].begin() + static_cast<std::ptrdiff_t>(t.offset),
                           initial[s].begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel));
        if (dequant.find(l.prefix + t.name)) {
          dequant.read_f32(l.prefix + t.name, t.shape, want.data());
          ++matrices;
        }
        CHECK(std::memcmp(back.data() + t.offset, want.data(), t.numel * sizeof(float)) == 0);
      }
    }
    CHECK(matrices == 3 * c.num_experts * c.num_hidden_layers);
  }
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("mixtral: one step against transformers' MixtralForCausalLM, v5 fused experts load", "[moe][oracle]") {
  ModelConfig c = mt::test::tiny_mixtral();
  // embedding; head norm, lm_head; a layer's 2 norms, q, k, v, o, router and 3 matrices an expert
  check_step_against(c, "hf_moe_oracle.py", 3 + 2 * (7 + 3 * static_cast<int>(c.num_experts)));
}

// The load-balancing loss (output_router_logits) as each family's transformers adds it: Mixtral's own
// model computes it, the two written oracles follow load_balancing_loss_func (over gpt-oss's router
// scores, as 4.56 records them). A coefficient large enough to move every gradient.
TEST_CASE("the load-balancing loss of each family against its oracle (output_router_logits)", "[moe][oracle]") {
  ModelConfig mixtral = mt::test::tiny_mixtral();
  mixtral.output_router_logits = true, mixtral.router_aux_loss_coef = 0.5;
  check_step_against(mixtral, "hf_moe_oracle.py", 3 + 2 * (7 + 3 * static_cast<int>(mixtral.num_experts)));
  ModelConfig qwen = mt::test::tiny_qwen3_moe_mixed();
  qwen.output_router_logits = true, qwen.router_aux_loss_coef = 0.5;
  check_step_against(qwen, "qwen3_moe_oracle.py",
                     3 + 4 * (8 + 3) + 2 * (8 + 1 + 3 * static_cast<int>(qwen.num_experts)));
  ModelConfig oss = mt::test::tiny_gpt_oss_alternating();
  oss.swiglu_limit = 7.0f, oss.hidden_size = 32, oss.intermediate_size = oss.moe_intermediate_size = 32;
  oss.output_router_logits = true, oss.router_aux_loss_coef = 0.9;
  check_step_against(oss, "gpt_oss_oracle.py", 3 + 4 * (13 + 6 * static_cast<int>(oss.num_experts)), SecondForm::mxfp4,
                     {}, 0.15);
}

TEST_CASE("qwen3_moe: one step against the PyTorch oracle from modeling_qwen3_moe, v5 fused experts load",
          "[moe][oracle]") {
  // GQA, q/k norms, top-2 of 4 not renormalised; layers 1 and 5 route, 0 2 3 4 are dense (sparse step 2,
  // mlp_only_layers {3})
  const ModelConfig c = mt::test::tiny_qwen3_moe_mixed();
  REQUIRE(c.layers_differ());
  const int dense_layer = 8 + 3, moe_layer = 8 + 1 + 3 * static_cast<int>(c.num_experts);
  check_step_against(c, "qwen3_moe_oracle.py", 3 + 4 * dense_layer + 2 * moe_layer);
}

TEST_CASE("gpt_oss: one step against the PyTorch oracle from modeling_gpt_oss, MXFP4 experts load", "[moe][oracle]") {
  // GQA, q/k/v/o biases, sinks, sliding (window 3 of 7 tokens) and full layers alternating, YaRN
  // (truncate false), the router's bias and top-k-then-softmax, expert biases; the gate and up weights
  // scaled up 8x (the down ones down 8x) so that the clamp at 7 (the only one transformers runs) bites,
  // and every bias (zero at init, as transformers initialises them) set to values of its own.
  ModelConfig c = mt::test::tiny_gpt_oss_alternating();
  c.swiglu_limit = 7.0f;
  c.hidden_size = 32;  // MXFP4 groups 32 values of a row
  c.intermediate_size = c.moe_intermediate_size = 32;
  REQUIRE(c.layers_differ());
  auto scale_experts = [&](ReferenceTrainer& tr) {
    for (std::int64_t s = 0; s < tr.num_stages(); ++s)
      for (const auto& t : tr.layout(s).tensors)
        if (t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0)
          for (std::size_t i = 0; i < t.numel; ++i)
            tr.params(s)[t.offset + i] = 0.3f * std::sin(0.7f * static_cast<float>(i + t.offset) + 0.1f);
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
      for (std::int64_t e = 0; e < c.num_experts; ++e)
        for (ExpertMatrix m : {ExpertMatrix::gate, ExpertMatrix::up, ExpertMatrix::down}) {
          const TensorSpec& t = tr.layout(l + 1).at(moe_expert_tensor(c, e, m));
          const float k = m == ExpertMatrix::down ? 0.125f : 8.0f;
          for (std::size_t i = 0; i < t.numel; ++i) tr.params(l + 1)[t.offset + i] *= k;
        }
  };
  // embedding; head norm, lm_head; a layer's 2 norms, q k v o with biases, sinks, router and its bias,
  // 3 matrices and 3 biases an expert
  const int layer = 2 + 8 + 1 + 2 + 6 * static_cast<int>(c.num_experts);
  // bf16: all gradients within 0.15 (measured 0.089): with the clamp biting, activations within bf16's
  // rounding of 7 switch between a gradient and none, on top of Mixtral's ~0.01.
  check_step_against(c, "gpt_oss_oracle.py", 3 + static_cast<int>(c.num_hidden_layers) * layer, SecondForm::mxfp4,
                     scale_experts, 0.15);
}

TEST_CASE("mixtral, qwen3_moe, gpt_oss: an expert no token chose gets a zero gradient and the normal AdamW update",
          "[moe]") {
  for (ModelConfig c : {mt::test::tiny_mixtral(), mt::test::tiny_qwen3_moe(), mt::test::tiny_gpt_oss()}) {
    INFO(arch_name(c.arch));
    c.num_experts = 8;
    c.num_experts_per_tok = 1;
    const std::int64_t B = 1, T = 3;  // 3 choices of 8 experts: at least 5 idle in every layer
    ReferenceTrainerOptions o = options(c, B, T);
    o.mode = ActivationMode::recompute;
    ReferenceTrainer tr(o);
    const vector<token_t> tok = {1, 2, 3}, tgt = {2, 3, 4};
    vector<vector<float>> before(tr.num_stages());
    for (std::int64_t s = 0; s < tr.num_stages(); ++s)
      before[s].assign(tr.params(s), tr.params(s) + tr.layout(s).total_floats);
    tr.step(tok.data(), tgt.data());
    int idle = 0, used = 0;
    for (std::int64_t s = 1; s <= c.num_hidden_layers; ++s)
      for (std::int64_t e = 0; e < c.num_experts; ++e) {
        const TensorSpec& t = tr.layout(s).at(moe_expert_tensor(c, e, ExpertMatrix::gate));
        bool zero = true;
        for (std::size_t i = 0; i < t.numel; ++i) zero = zero && tr.grads(s)[t.offset + i] == 0.0f;
        if (!zero) {
          ++used;
          continue;
        }
        ++idle;
        INFO("layer " << s - 1 << " expert " << e);
        vector<std::string> tensors;  // the expert's matrices and (gpt-oss) biases
        for (ExpertMatrix m : {ExpertMatrix::gate, ExpertMatrix::up, ExpertMatrix::down}) {
          tensors.push_back(moe_expert_tensor(c, e, m));
          if (c.moe_biases()) tensors.push_back(moe_expert_bias_tensor(c, e, m));
        }
        for (const std::string& name : tensors) {
          const TensorSpec& k = tr.layout(s).at(name);
          const bool decays = k.weight_decay;
          for (std::size_t i = 0; i < k.numel; i += 7) {
            const std::size_t at = k.offset + i;
            REQUIRE(tr.grads(s)[at] == 0.0f);
            REQUIRE(tr.adam_m(s)[at] == 0.0f);
            REQUIRE(tr.adam_v(s)[at] == 0.0f);
            // decoupled weight decay alone: p (1 - lr wd), the Adam term 0 / (0 + eps) = 0 (biases: no decay)
            const float want = before[s][at] * (decays ? 1.0f - o.hyper.lr * o.hyper.weight_decay : 1.0f);
            REQUIRE(std::abs(tr.params(s)[at] - want) <= 1e-7f * std::abs(want));
            if (decays) REQUIRE(tr.params(s)[at] != before[s][at]);
          }
        }
      }
    CHECK(idle >= 2 * 5);
    CHECK(used >= 2);
  }
}

TEST_CASE("qwen3_moe with dense layers: a layer computes with its own layer's config, sizes cover both kinds",
          "[moe]") {
  const ModelConfig c = mt::test::tiny_qwen3_moe_mixed();
  const std::int64_t B = 1, T = 4;
  const ModelConfig dense = c.layer_config(0), moe = c.layer_config(1);
  REQUIRE_FALSE(dense.is_moe());
  REQUIRE(moe.is_moe());
  for (ActivationMode mode : {ActivationMode::keep, ActivationMode::recompute}) {
    const std::size_t want =
        std::max(layer_workspace_floats(dense, B, T, mode), layer_workspace_floats(moe, B, T, mode));
    CHECK(layer_workspace_floats(c, B, T, mode) == want);
  }
  CHECK(layer_saved_floats(c, B, T) == std::max(layer_saved_floats(dense, B, T), layer_saved_floats(moe, B, T)));
  vector<float> params(layer_layout(c, 1).total_floats), x(B * T * c.hidden_size, 0.5f), y(x.size());
  vector<float> ws(layer_workspace_floats(c, B, T, ActivationMode::recompute));
  init_stage_params(c, 2, 1, params.data());
  ComputeCtx ctx{1};
  LayerBuffers bufs;
  bufs.x_in = x.data();
  bufs.x_out = y.data();
  bufs.workspace = ws.data();
  CHECK_THROWS_WITH(layer_forward(c, params.data(), {B, T}, bufs, ctx), Catch::Contains("layer_config"));
  layer_forward(moe, params.data(), {B, T}, bufs, ctx);
  CHECK(std::isfinite(y[0]));
}
