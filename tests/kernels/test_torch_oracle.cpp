// The outside oracle: Debian's PyTorch builds the same models from the same weights
// (tests/kernels/torch_oracle.py). Logits, the loss, every parameter gradient and the parameters after
// one clipped AdamW step must agree within 1e-5 norm-wise relative error per tensor, for Llama (GQA),
// Qwen2 (bias, tied), Qwen3 (q/k norm), Llama-3 rope scaling and GPT-2, at two shapes each (one with an
// odd sequence length).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/reference_trainer.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/kernels/model_configs.hpp"

using namespace mt;
using std::vector;
namespace fs = std::filesystem;

namespace {

template <class T>
void write_bin(const fs::path& p, const vector<T>& v) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

vector<float> read_bin(const fs::path& p, std::size_t n) {
  vector<float> v(n);
  std::ifstream f(p, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  REQUIRE(static_cast<std::size_t>(f.gcount()) == n * sizeof(float));
  return v;
}

void check_against_torch(const std::string& name, ModelConfig c, std::int64_t B, std::int64_t T) {
  INFO(name << " B=" << B << " T=" << T);
  c.initializer_range = 0.2f;  // larger than HF's 0.02 so every path carries signal
  ReferenceTrainerOptions o;
  o.config = c;
  o.micro_batch = B;
  o.seq = T;
  o.hyper.lr = 1e-3f;
  o.hyper.weight_decay = 0.1f;
  o.max_grad_norm = 0.5f;
  o.seed = 99;
  o.mode = ActivationMode::keep;
  o.threads = 2;
  ReferenceTrainer tr(o);
  const std::int64_t N = B * T, V = c.vocab_size, S = tr.num_stages();
  vector<token_t> tok(N), tgt(N);
  for (std::int64_t i = 0; i < N; ++i) {
    tok[i] = static_cast<token_t>((i * 11 + 3) % V);
    tgt[i] = (i % 5 == 2) ? kIgnoreIndex : static_cast<token_t>((i * 13 + 1) % V);
  }

  const fs::path dir =
      fs::temp_directory_path() / ("mt_oracle_" + name + "_" + std::to_string(T) + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  nlohmann::json j;
  j["arch"] = arch_name(c.arch);
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = {{"factor", c.rope_scaling.factor},
                       {"low_freq_factor", c.rope_scaling.low_freq_factor},
                       {"high_freq_factor", c.rope_scaling.high_freq_factor},
                       {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  j["norm_eps"] = c.norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings || c.is_gpt2();
  j["qk_norm"] = c.qk_norm;
  j["batch"] = B;
  j["seq"] = T;
  j["lr"] = o.hyper.lr;
  j["beta1"] = o.hyper.beta1;
  j["beta2"] = o.hyper.beta2;
  j["eps"] = o.hyper.eps;
  j["weight_decay"] = o.hyper.weight_decay;
  j["max_grad_norm"] = o.max_grad_norm;
  struct Where {
    std::int64_t stage;
    const TensorSpec* t;
    std::size_t flat;
  };
  vector<Where> where;
  vector<float> flat;
  for (std::int64_t s = 0; s < S; ++s)
    for (const auto& t : tr.layout(s).tensors) {
      where.push_back({s, &t, flat.size()});
      j["tensors"].push_back({{"name", tr.layout(s).prefix + t.name},
                              {"shape", t.shape},
                              {"offset", flat.size()},
                              {"numel", t.numel},
                              {"weight_decay", t.weight_decay}});
      flat.insert(flat.end(), tr.params(s) + t.offset, tr.params(s) + t.offset + t.numel);
    }
  std::ofstream(dir / "config.json") << j.dump(1);
  write_bin(dir / "params.bin", flat);
  write_bin(dir / "tokens.bin", tok);
  write_bin(dir / "targets.bin", tgt);
  // Logits through the stage API on the initial weights.
  const ComputeCtx ctx{2};
  vector<float> x(N * c.hidden_size), y(N * c.hidden_size), logits(N * V);
  vector<float> ws(
      std::max(layer_workspace_floats(c, B, T, ActivationMode::recompute), head_workspace_floats(c, B, T)));
  embedding_forward(c, tr.params(0), tok.data(), B, T, x.data(), ctx);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    layer_forward(c, tr.params(l + 1), x.data(), y.data(), B, T, nullptr, ws.data(), ctx);
    std::swap(x, y);
  }
  head_logits(c, tr.params(S - 1), tr.params(0), x.data(), B, T, logits.data(), ws.data(), ctx);

  // One training step; our gradients (mean-loss scale) go to the oracle for its AdamW step.
  const StepStats st = tr.step(tok.data(), tgt.data());
  vector<float> ours;
  for (const auto& w : where)
    for (std::size_t i = 0; i < w.t->numel; ++i)
      ours.push_back(tr.grads(w.stage)[w.t->offset + i] / static_cast<float>(st.counted));  // accumulators hold d(sum)
  write_bin(dir / "grads_in.bin", ours);
  const std::string cmd =
      std::string(MEGATRAIN_PYTHON) + " " + MEGATRAIN_SOURCE_DIR + "/tests/kernels/torch_oracle.py " + dir.string();
  REQUIRE(std::system(cmd.c_str()) == 0);

  CHECK(mt::test::rel_err(logits, read_bin(dir / "logits.bin", logits.size())) < 1e-5);
  double torch_loss = 0;
  std::ifstream(dir / "loss.txt") >> torch_loss;
  CHECK(std::abs(st.loss - torch_loss) / torch_loss < 1e-5);
  CHECK(st.clip < 1.0);  // the clipping path is exercised

  const auto grads = read_bin(dir / "grads.bin", flat.size());
  const auto after = read_bin(dir / "params_after.bin", flat.size());
  for (const auto& w : where) {
    INFO(tr.layout(w.stage).prefix + w.t->name);
    vector<float> g(w.t->numel), p(w.t->numel), delta(w.t->numel), delta_torch(w.t->numel);
    for (std::size_t i = 0; i < w.t->numel; ++i) {
      g[i] = ours[w.flat + i];
      p[i] = tr.params(w.stage)[w.t->offset + i];
      delta[i] = p[i] - flat[w.flat + i];
      delta_torch[i] = after[w.flat + i] - flat[w.flat + i];
    }
    CHECK(mt::test::rel_err(g.data(), grads.data() + w.flat, g.size()) < 1e-5);
    CHECK(mt::test::rel_err(p.data(), after.data() + w.flat, p.size()) < 1e-5);
    CHECK(mt::test::rel_err(delta, delta_torch) < 1e-4);  // the update itself, much more sensitive
  }
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("PyTorch oracle: Llama with grouped-query attention", "[oracle]") {
  check_against_torch("llama", mt::test::tiny_llama(), 2, 7);
  check_against_torch("llama", mt::test::tiny_llama(), 1, 16);
}
TEST_CASE("PyTorch oracle: Llama-3 rope scaling", "[oracle]") {
  check_against_torch("llama3", mt::test::tiny_llama3_scaled(), 2, 13);
}
TEST_CASE("PyTorch oracle: Qwen2 (q/k/v bias, tied embeddings)", "[oracle]") {
  check_against_torch("qwen2", mt::test::tiny_qwen2(), 2, 7);
  check_against_torch("qwen2", mt::test::tiny_qwen2(), 3, 12);
}
TEST_CASE("PyTorch oracle: Qwen3 (q/k RMSNorm, head_dim != hidden/heads)", "[oracle]") {
  check_against_torch("qwen3", mt::test::tiny_qwen3(), 2, 9);
  check_against_torch("qwen3", mt::test::tiny_qwen3(), 1, 20);
}
TEST_CASE("PyTorch oracle: GPT-2", "[oracle]") {
  check_against_torch("gpt2", mt::test::tiny_gpt2(), 2, 7);
  check_against_torch("gpt2", mt::test::tiny_gpt2(), 2, 32);
}
