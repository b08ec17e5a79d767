// A small Llama-style model for storage tests: stages of a few hundred KiB, any depth.
#pragma once
#include "kernels/model_config.hpp"

namespace mt::test {

inline ModelConfig tiny_model(std::int64_t layers) {
  ModelConfig c;
  c.arch = Arch::llama;
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.intermediate_size = 384;
  c.max_position_embeddings = 256;
  return c;
}

}  // namespace mt::test
