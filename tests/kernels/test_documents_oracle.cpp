// data.packing = documents against transformers' own model (tests/kernels/hf_documents_oracle.py, the
// venv's transformers 4.46.3, eager attention, fp32): a packed window of several documents, one cut by
// the window's start and continued in the next row, a prompt masked by the loss mask, positions and
// targets as the loader makes them. transformers runs each document (each piece) alone; the loss (the
// mean over every target) and every parameter's gradient of megatrain's reference trainer must agree
// within 1e-5 norm-wise relative error per tensor, and each piece's logits too. Llama with GQA and
// Llama-3 rope scaling, linear rope scaling, and GPT-2 (learned positions read at the documents').
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
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

// Two windows of 16 inputs over one stream of 33 tokens (stride 16: the last token of row 0 is the first
// of row 1), as the loader cuts them. Documents of 5, 9, 13 and 6 tokens: the third starts at 14 and is
// cut by row 1's start; the second's first 3 tokens are a prompt (loss mask 0).
struct Packed {
  std::int64_t B = 2, T = 16;
  vector<token_t> tokens, targets;
  vector<std::int32_t> positions;
};

Packed pack(std::int64_t V) {
  Packed p;
  const std::set<std::int64_t> starts = {0, 5, 14, 27};
  auto masked = [](std::int64_t i) { return i >= 5 && i < 8; };
  vector<token_t> stream(33);
  for (std::int64_t i = 0; i < 33; ++i) stream[i] = static_cast<token_t>((i * 11 + 3) % V);
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t t = 0; t < p.T; ++t) {
      const std::int64_t i = b * p.T + t;  // the token's offset in the stream
      p.tokens.push_back(stream[i]);
      p.positions.push_back(t == 0 || starts.count(i) ? 0 : p.positions.back() + 1);
      const bool target = !starts.count(i + 1) && !masked(i + 1);
      p.targets.push_back(target ? stream[i + 1] : kIgnoreIndex);
    }
  return p;
}

void check_documents_against_transformers(ModelConfig c, const std::string& name) {
  c.initializer_range = 0.2f;  // every path carries signal
  const Packed p = pack(c.vocab_size);
  const std::int64_t B = p.B, T = p.T, N = B * T, V = c.vocab_size;
  ReferenceTrainerOptions o;
  o.config = c;
  o.micro_batch = B;
  o.seq = T;
  o.max_grad_norm = 0.0f;
  o.seed = 11;
  o.threads = 2;
  ReferenceTrainer tr(o);
  const std::int64_t S = tr.num_stages();
  vector<vector<float>> initial(S);
  for (std::int64_t s = 0; s < S; ++s) initial[s].assign(tr.params(s), tr.params(s) + tr.layout(s).total_floats);
  const fs::path dir = fs::temp_directory_path() / ("mt_documents_oracle_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  hf::write_hf_model(
      dir / "model", c, [&](std::int64_t s) { return initial[s].data(); }, hf::HfExportOptions{});
  mt::test::write_bin(dir / "tokens.bin", p.tokens);
  mt::test::write_bin(dir / "targets.bin", p.targets);
  mt::test::write_bin(dir / "positions.bin", p.positions);
  std::ofstream(dir / "shape.json") << nlohmann::json{{"batch", B}, {"seq", T}}.dump();
  const std::string cmd = std::string("env -u ONEDNN_MAX_CPU_ISA -u DNNL_MAX_CPU_ISA ") + MEGATRAIN_VENV_PYTHON + " " +
                          MEGATRAIN_SOURCE_DIR + "/tests/kernels/hf_documents_oracle.py " + dir.string();
  REQUIRE(std::system(cmd.c_str()) == 0);
  int pieces = 0;
  std::ifstream(dir / "pieces.txt") >> pieces;
  CHECK(pieces == 5);  // row 0: 5, 9, the cut document's first 2 tokens; row 1: its other 11, then 5 of 6

  // Each piece's logits: the forward through the stage API with the positions.
  ComputeCtx ctx{2};
  const BatchRows rows{B, T, p.positions.data()};
  vector<float> x(N * c.hidden_size), y(N * c.hidden_size), logits(N * V);
  vector<float> ws(std::max(layer_workspace_floats(c, B, T, ActivationMode::recompute),
                            head_workspace_floats(c, B, T, 0, Precision::fp32)));
  embedding_forward(c, tr.params(0), p.tokens.data(), rows, x.data(), ctx);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerBuffers bufs;
    bufs.x_in = x.data();
    bufs.x_out = y.data();
    bufs.workspace = ws.data();
    layer_forward(c, tr.params(l + 1), rows, bufs, ctx);
    std::swap(x, y);
  }
  head_logits(c, tr.params(S - 1), tr.params(0), x.data(), B, T, logits.data(), ws.data(), ctx);
  vector<float> theirs_logits(logits.size());
  std::ifstream(dir / "logits.bin", std::ios::binary)
      .read(reinterpret_cast<char*>(theirs_logits.data()), static_cast<std::streamsize>(logits.size() * 4));
  CHECK(mt::test::rel_err(logits, theirs_logits) < 1e-5);

  const StepStats st = tr.step(p.tokens.data(), p.targets.data(), p.positions.data());
  double torch_loss = 0;
  std::ifstream(dir / "loss.txt") >> torch_loss;
  INFO("loss " << st.loss << " transformers " << torch_loss);
  CHECK(std::abs(st.loss - torch_loss) / torch_loss < 1e-5);
  const hf::SafetensorsReader grads(dir / "grads.safetensors");
  for (std::int64_t s = 0; s < S; ++s)
    for (const auto& t : tr.layout(s).tensors) {
      const std::string tensor = tr.layout(s).prefix + t.name;
      INFO(tensor);
      vector<float> theirs(t.numel), ours(t.numel);
      // GPT-2's Conv1D weights are stored [in, out] by transformers.
      const bool conv1d = c.is_gpt2() && t.shape.size() == 2 && tensor.find(".h.") != std::string::npos;
      if (conv1d)
        grads.read_f32_transposed(tensor, {t.shape[1], t.shape[0]}, theirs.data());
      else
        grads.read_f32(tensor, t.shape, theirs.data());
      for (std::size_t i = 0; i < t.numel; ++i)
        ours[i] = tr.grads(s)[t.offset + i] / static_cast<float>(st.counted);  // accumulators hold d(sum)
      CHECK(mt::test::rel_err(ours, theirs) < 1e-5);
    }

  // The stream's answer differs: documents are not a no-op on this window.
  ReferenceTrainer stream(o);
  const double stream_loss = stream.eval_loss(p.tokens.data(), p.targets.data());
  CHECK(std::abs(stream_loss - torch_loss) / torch_loss > 1e-3);
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("documents oracle: Llama, GQA, Llama-3 rope scaling", "[oracle][documents]") {
  check_documents_against_transformers(mt::test::tiny_llama3_scaled(), "llama3");
}
TEST_CASE("documents oracle: linear rope scaling", "[oracle][documents]") {
  check_documents_against_transformers(mt::test::tiny_linear_rope(), "linear");
}
TEST_CASE("documents oracle: GPT-2 (learned positions)", "[oracle][documents]") {
  check_documents_against_transformers(mt::test::tiny_gpt2(), "gpt2");
}
