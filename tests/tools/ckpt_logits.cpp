// Test helper: the logits megatrain's forward pass (kernels/stage_api.hpp) computes for a checkpoint
// on the fixed batch compare_hf_models.py uses, written as raw float32 [batch, seq, vocab].
//   ckpt_logits CKPT OUT_FILE
#include <cstdio>
#include <exception>
#include <vector>

#include "kernels/stage_api.hpp"
#include "storage/checkpoint/checkpoint_reader.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: ckpt_logits CKPT OUT_FILE\n");
    return 2;
  }
  try {
    const auto r = mt::ckpt::CheckpointReader::open(argv[1]);
    const mt::ModelConfig& c = r.model_config();
    const std::int64_t batch = 2, seq = 8, n = batch * seq;
    std::vector<mt::token_t> tokens(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      tokens[static_cast<std::size_t>(i)] = static_cast<mt::token_t>((7 * i + 3) % c.vocab_size);
    mt::ComputeCtx ctx;
    const auto d = static_cast<std::size_t>(c.hidden_size);
    std::vector<float> x(static_cast<std::size_t>(n) * d), y(x.size());
    std::vector<float> embed(mt::stage_layout(c, 0).total_floats), params;
    r.read_stage_state(0, "params", embed.data());
    mt::embedding_forward(c, embed.data(), tokens.data(), batch, seq, x.data(), ctx);
    std::vector<float> ws(mt::layer_workspace_floats(c, batch, seq, mt::ActivationMode::recompute));
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
      params.resize(mt::stage_layout(c, l + 1).total_floats);
      r.read_stage_state(l + 1, "params", params.data());
      mt::LayerBuffers bufs;
      bufs.x_in = x.data();
      bufs.x_out = y.data();
      bufs.workspace = ws.data();
      mt::layer_forward(c, params.data(), {batch, seq}, bufs, ctx);
      x.swap(y);
    }
    params.resize(mt::stage_layout(c, c.num_hidden_layers + 1).total_floats);
    r.read_stage_state(c.num_hidden_layers + 1, "params", params.data());
    std::vector<float> logits(static_cast<std::size_t>(n * c.vocab_size));
    ws.assign(mt::head_workspace_floats(c, batch, seq), 0.0f);
    mt::head_logits(c, params.data(), embed.data(), x.data(), batch, seq, logits.data(), ws.data(), ctx);
    std::FILE* f = std::fopen(argv[2], "wb");
    if (!f || std::fwrite(logits.data(), 4, logits.size(), f) != logits.size() || std::fclose(f) != 0) {
      std::fprintf(stderr, "ckpt_logits: cannot write %s\n", argv[2]);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt_logits: error: %s\n", e.what());
    return 1;
  }
}
