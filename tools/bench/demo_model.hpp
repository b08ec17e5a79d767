// The demo model (config/demo.ini: Llama d=384, 8 layers, 4 x 128 tokens, vocabulary 4096, 64 MiB
// device budget) as benchmarks run it through the engine, with reproducible random tokens.
#pragma once
#include <cstdint>
#include <vector>

#include "config/train_config.hpp"
#include "data/loader.hpp"

namespace mt::bench {

// config/demo.ini's model, batch, optimizer and device keys, `steps` steps, 2 threads.
inline TrainConfig demo_train_config(std::int64_t steps) {
  TrainConfig c;
  c.model.arch = "llama";
  c.model.hidden_size = 384;
  c.model.layers = 8;
  c.model.heads = 6;
  c.model.kv_heads = 2;
  c.model.intermediate_size = 1024;
  c.model.vocab_size = 4096;
  c.model.max_position_embeddings = 256;
  c.train.per_device_train_batch_size = 4;
  c.train.gradient_accumulation_steps = 1;
  c.train.max_steps = steps;
  c.train.learning_rate = 1e-3;
  c.train.weight_decay = 0.1;
  c.train.max_grad_norm = 1.0;
  c.data.seq_length = 128;
  c.device.max_vram_gb = 64 / 1024.0;
  c.threads.total = 2;
  c.monitor.enabled = false;  // no endpoint (the monitor bench measures it through the node binary)
  return c;
}

// `count` micro-batches of uniformly random inputs and targets for `cfg`'s batch and vocabulary.
inline std::vector<data::Batch> random_batches(const TrainConfig& cfg, int count, std::uint64_t seed) {
  std::vector<data::Batch> out;
  std::uint64_t x = seed;
  const std::int64_t n = cfg.train.per_device_train_batch_size * cfg.data.seq_length;
  const auto vocab = static_cast<std::uint64_t>(cfg.model.vocab_size);
  for (int i = 0; i < count; ++i) {
    data::Batch b;
    b.batch_size = static_cast<int>(cfg.train.per_device_train_batch_size);
    b.seq_len = static_cast<int>(cfg.data.seq_length);
    for (std::int64_t k = 0; k < n; ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      b.inputs.push_back(static_cast<std::int32_t>((x >> 33) % vocab));
      b.targets.push_back(static_cast<std::int32_t>((x >> 17) % vocab));
    }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace mt::bench
