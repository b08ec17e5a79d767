// Shared helpers of the actor tests: tiny models, synthetic data, and the sequential reference
// trainer run on the same batches. Includes no CAF (the engine's entry point does not).
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "actors/engine.hpp"
#include "kernels/reference_trainer.hpp"

namespace mt::actors::test {

struct Tiny {
  Arch arch = Arch::llama;
  std::int64_t layers = 2;
  std::int64_t hidden = 32;
  std::int64_t heads = 4;
  std::int64_t vocab = 64;
  std::int64_t batch = 2;
  std::int64_t seq = 8;
  std::int64_t micro_batches = 1;
  std::int64_t steps = 20;
  std::int64_t weight_slots = 2;
  double max_grad_norm = 1.0;
  double weight_decay = 0.1;
  std::string keep = "boundary";
  std::string schedule = "interleaved";
  double bandwidth_gbps = 0.0;           // copy engine limit per direction; 0 = unlimited
  bool bf16 = false;                     // train.bf16: bf16 compute copies streamed, fp32 masters
  std::string master_weights = "auto";   // train.master_weights (bf16: auto = split)
  std::string gradient_buffer = "auto";  // train.gradient_buffer (auto: stage without clipping at M = 1)
  std::size_t budget_bytes = 0;          // device budget (device.max_vram_gb); 0 = 64 MiB
  std::int64_t seq_tile = 0;             // device.seq_tile; 0 = auto
  std::string attention_kv = "auto";     // device.attention_kv
  double host_ram_gb = 0.0;              // plan.host_ram_gb: the host RAM auto's all_mapped may use half of
  std::int64_t max_positions = 64;
  std::int64_t decoder_sparse_step = 1;  // qwen3_moe: every step-th layer has experts
  std::string mlp_only_layers;           // qwen3_moe: dense layers ("0,2")
  std::int64_t sliding_window = 0;       // gpt_oss: the even layers' window (0 = 128)
  bool output_router_logits = false;     // MoE: the load-balancing loss
  double router_aux_loss_coef = 0.0;     // its weight (0: the family's default)
};

inline TrainConfig tiny_config(const Tiny& t) {
  TrainConfig c;
  c.model.arch = arch_name(t.arch);
  c.model.hidden_size = t.hidden;
  c.model.layers = t.layers;
  c.model.heads = t.heads;
  c.model.kv_heads = t.arch == Arch::gpt2 ? 0 : t.heads / 2;
  c.model.intermediate_size = 2 * t.hidden + 8;
  c.model.vocab_size = t.vocab;
  c.model.max_position_embeddings = t.max_positions;
  c.model.tie_word_embeddings = t.arch == Arch::gpt2;
  c.model.decoder_sparse_step = t.decoder_sparse_step;
  c.model.mlp_only_layers = t.mlp_only_layers;
  c.model.sliding_window = t.sliding_window;
  c.model.output_router_logits = t.output_router_logits;
  c.model.router_aux_loss_coef = t.router_aux_loss_coef;
  c.train.per_device_train_batch_size = t.batch;
  c.train.gradient_accumulation_steps = t.micro_batches;
  c.train.max_steps = t.steps;
  c.train.learning_rate = 3e-3;
  c.train.lr_scheduler_type = "cosine";
  c.train.warmup_steps = 3;
  c.train.weight_decay = t.weight_decay;
  c.train.max_grad_norm = t.max_grad_norm;
  c.train.bf16 = t.bf16;
  c.train.master_weights = t.master_weights;
  c.train.gradient_buffer = t.gradient_buffer;
  c.train.seed = 1234;
  c.data.seq_length = t.seq;
  const std::size_t budget = t.budget_bytes > 0 ? t.budget_bytes : std::size_t{64} << 20;
  c.device.max_vram_gb = static_cast<double>(budget) / (1024.0 * 1024.0 * 1024.0);
  c.device.weight_slots = t.weight_slots;
  c.device.grad_slots = 2;
  c.device.keep_intermediates = t.keep;
  c.device.seq_tile = t.seq_tile;
  c.device.attention_kv = t.attention_kv;
  c.plan.host_ram_gb = t.host_ram_gb;
  c.device.schedule = t.schedule;
  c.device.copy_bandwidth_gbps = t.bandwidth_gbps;
  c.monitor.enabled = false;  // engine-level tests: no endpoint (tests/actors/monitor/ test it)
  c.threads.total = 2;
  c.threads.blas = 1;
  c.threads.optimizer = 1;
  c.threads.copy = 1;
  c.threads.scheduler = 1;
  return c;
}

// t with keep_intermediates = auto and a device budget that holds the boundary plan plus room for
// `layers` layers' intermediates, and no more: auto then keeps the last `layers` layers
// (EnginePlan::kept_layers) and recomputes the others. Its host RAM (plan.host_ram_gb, 1 KiB) is too
// small for auto to keep every intermediate mapped there (all_mapped) instead.
inline Tiny with_kept_layers(Tiny t, std::int64_t layers) {
  t.host_ram_gb = 1.0 / (1024 * 1024);
  const ModelConfig model = tiny_config(t).model_config_from_keys();
  t.keep = "boundary";
  const std::size_t boundary = plan::plan_engine(tiny_config(t), model).arena.total_bytes;
  t.keep = "all";
  const std::size_t all = plan::plan_engine(tiny_config(t), model).arena.total_bytes;
  const std::size_t per_layer = (all - boundary) / static_cast<std::size_t>(t.layers);
  t.keep = "auto";
  t.budget_bytes = boundary + per_layer * static_cast<std::size_t>(layers) + per_layer / 2;
  return t;
}

// Deterministic, learnable batches (the target is a fixed function of the input token, so the loss
// falls); about one target in eleven is ignored (-100), so the counted-token normalisation is exercised.
inline std::vector<data::Batch> tiny_batches(const Tiny& t, std::size_t count, std::uint64_t seed = 99) {
  std::vector<data::Batch> out;
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (std::size_t i = 0; i < count; ++i) {
    data::Batch b;
    b.batch_size = static_cast<int>(t.batch);
    b.seq_len = static_cast<int>(t.seq);
    const std::size_t n = static_cast<std::size_t>(t.batch * t.seq);
    for (std::size_t k = 0; k < n; ++k)
      b.inputs.push_back(static_cast<std::int32_t>(next() % static_cast<std::uint64_t>(t.vocab)));
    for (std::size_t k = 0; k < n; ++k) {
      const bool ignore = next() % 11 == 0;
      b.targets.push_back(ignore ? -100 : static_cast<std::int32_t>((b.inputs[k] * 7 + 3) % t.vocab));
    }
    b.index = i;
    out.push_back(std::move(b));
  }
  return out;
}

// The same batches packed as documents (data.packing = documents): each row cut into documents of 1 to
// seq/2 + 1 tokens (seeded), positions restarting at each, and a document's last token without a target,
// as the loader makes them.
inline std::vector<data::Batch> with_documents(std::vector<data::Batch> batches, std::uint64_t seed = 5) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 3;
  for (data::Batch& b : batches) {
    const std::size_t T = static_cast<std::size_t>(b.seq_len);
    b.positions.assign(b.inputs.size(), 0);
    for (std::size_t r = 0; r < static_cast<std::size_t>(b.batch_size); ++r) {
      std::size_t left = 0;  // tokens left in the current document
      for (std::size_t t = 0; t < T; ++t) {
        if (left == 0) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          left = 1 + x % (T / 2 + 1);
        } else {
          b.positions[r * T + t] = b.positions[r * T + t - 1] + 1;
        }
        --left;
        if (left == 0 && t + 1 < T) b.targets[r * T + t] = data::Batch::kIgnoreIndex;  // the next starts one
      }
    }
  }
  return batches;
}

struct RefRun {
  std::unique_ptr<ReferenceTrainer> trainer;
  std::vector<double> losses;
};

inline RefRun run_reference(const TrainConfig& cfg, const ModelConfig& model, const std::vector<data::Batch>& batches,
                            std::int64_t steps) {
  ReferenceTrainerOptions o;
  o.config = model;
  o.micro_batch = cfg.train.per_device_train_batch_size;
  o.seq = cfg.data.seq_length;
  o.grad_accum = cfg.train.gradient_accumulation_steps;
  o.hyper = cfg.adamw_at(0);
  o.max_grad_norm = static_cast<float>(cfg.train.max_grad_norm);
  o.seed = static_cast<std::uint64_t>(cfg.train.seed);
  // The named keep modes run the reference in keep mode too; auto's choices are checked against recompute.
  o.mode = cfg.device.keep_intermediates == "all" || cfg.device.keep_intermediates == "all_mapped"
               ? ActivationMode::keep
               : ActivationMode::recompute;
  o.threads = 1;
  o.precision = cfg.precision();
  o.seq_tile = plan::plan_engine(cfg, model).seq_tile;  // the engine's sequence tiles (long context), if any
  RefRun r;
  r.trainer = std::make_unique<ReferenceTrainer>(o);
  const std::int64_t M = o.grad_accum;
  for (std::int64_t s = 0; s < steps; ++s) {
    std::vector<token_t> tokens, targets;
    std::vector<std::int32_t> positions;  // data.packing = documents: the batches carry them
    for (std::int64_t mb = 0; mb < M; ++mb) {
      const auto& b = batches[static_cast<std::size_t>(s * M + mb) % batches.size()];
      tokens.insert(tokens.end(), b.inputs.begin(), b.inputs.end());
      targets.insert(targets.end(), b.targets.begin(), b.targets.end());
      positions.insert(positions.end(), b.positions.begin(), b.positions.end());
    }
    r.trainer->set_lr(cfg.adamw_at(s).lr);
    r.losses.push_back(
        r.trainer->step(tokens.data(), targets.data(), positions.empty() ? nullptr : positions.data()).loss);
  }
  return r;
}

struct EngineRun {
  std::unique_ptr<HostModel> host;
  EngineResult result;
};

// A job of `cfg` over `host`, reading `data` (both must outlive the run).
inline EngineJob engine_job(const TrainConfig& cfg, const ModelConfig& model, BatchSource& data, HostModel& host) {
  EngineJob job;
  job.cfg = cfg;
  job.model = model;
  job.data = &data;
  job.host = &host;
  return job;
}

inline EngineRun run_pipeline(const TrainConfig& cfg, const ModelConfig& model, const std::vector<data::Batch>& batches,
                              FaultPlan* fault = nullptr) {
  EngineRun r;
  r.host = std::make_unique<HostModel>(model, plan::host_tile_options(cfg), nullptr, moment_store_for(cfg, model));
  init_host_model(*r.host, static_cast<std::uint64_t>(cfg.train.seed));
  VectorBatchSource source(batches);
  EngineJob job = engine_job(cfg, model, source, *r.host);
  job.fault = fault;
  r.result = run_engine(std::move(job));
  return r;
}

// The restart log as one text, for INFO (an INFO inside a loop body ends with that iteration).
inline std::string restart_log_text(const EngineResult& r) {
  std::string text;
  for (const auto& line : r.restart_log) text += line + "\n";
  return text;
}

// Bytes of stage s's params / moments equal between the engine's tiles and the reference's.
inline bool same_bits(const float* a, const float* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Stage s's moments (wherever the host model keeps them: tiles, compressed, NVMe) equal m and v; v as
// the fp32 path holds it (split masters keep a tie bit in its sign: the lease clears it).
inline bool moments_equal(HostModel& host, std::int64_t s, const float* m, const float* v, std::size_t n) {
  StateLease l(host, s);
  return same_bits(l.m(), m, n) && same_bits(l.v(), v, n);
}

// Stage s's fp32 masters (the tile's, or the moment store's with train.offload_params) equal p.
inline bool masters_equal(HostModel& host, std::int64_t s, const float* p, std::size_t n) {
  bool same = false;
  host.read_masters(s, [&](const float* masters) { same = same_bits(masters, p, n); });
  return same;
}

inline bool tiles_equal(HostModel& a, HostModel& b) {
  for (std::int64_t s = 0; s < a.num_stages(); ++s) {
    const std::size_t n = a.tile(s).floats();
    {
      StateLease lb(b, s);
      if (!masters_equal(a, s, lb.master(), n)) return false;
      if (!moments_equal(a, s, lb.m(), lb.v(), n)) return false;
    }
    if (a.tile(s).has_compute_copy() != b.tile(s).has_compute_copy() ||
        (a.tile(s).has_compute_copy() &&
         std::memcmp(a.tile(s).compute_copy(), b.tile(s).compute_copy(), a.tile(s).compute_copy_bytes()) != 0))
      return false;
  }
  return true;
}

inline bool equals_reference(HostModel& host, ReferenceTrainer& ref) {
  for (std::int64_t s = 0; s < host.num_stages(); ++s) {
    const std::size_t n = static_cast<std::size_t>(ref.layout(s).total_floats);
    if (!masters_equal(host, s, ref.params(s), n) || !moments_equal(host, s, ref.adam_m(s), ref.adam_v(s), n))
      return false;
    // bf16 runs: the streamed compute copy too (what the next step would compute with).
    if (ref.compute_copy(s) != nullptr &&
        std::memcmp(host.tile(s).compute_copy(), ref.compute_copy(s), n * sizeof(bf16_t)) != 0)
      return false;
  }
  return true;
}

}  // namespace mt::actors::test
