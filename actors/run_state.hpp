// What a checkpoint's manifest carries besides the tensors (its "run" object), and the resume and
// Hugging Face start-up paths of the engine. No CAF here.
//
// Run state schema (manifest.json "run", format "megatrain-run-state" version 1):
//   step                 optimizer steps done (= every tile's version; the next step is `step`)
//   optimizer_step       AdamW's step counter (bias correction uses optimizer_step + 1 next)
//   lr_schedule          {type, learning_rate, warmup_steps, max_steps, min_lr_ratio, next_lr}: the LR
//                        is a pure function of (step, these); next_lr = the LR of the next update
//   data                 {micro_batches_per_step, global_batch_index (= step * M: the next
//                        micro-batch), cursor (data::Cursor JSON before that batch, or null)}
//   rng                  {seed, note}: the engine draws random numbers only at initialisation (no
//                        dropout); the data order is a pure function of (seed, cursor)
//   tile_versions        per stage, the version saved (= step)
//   train_config         every TrainConfig value as {section: {key: value}}
//   model_name_or_path   where the starting weights came from ("" = random init)
//   evaluations          [{step, loss, perplexity, tokens, batches, seconds}]: the run's evaluations so
//                        far (train.eval_steps), oldest first
//   kernel_choices       {fp32_gemm: {forward, backward_input, backward_weight: "onednn" | "openblas",
//                        shapes: [{product, in, out, lib}] where a layer shape's library differs},
//                        bf16_gemm: "onednn" | "widened", bf16_attention: "pairs" | "fp32"}: runs on the
//                        CPU backend only (the bf16 keys: bf16 runs), the library of each fp32 product,
//                        the path the bf16 products ran on and the attention's block products; a resume
//                        takes them (plan/kernel_choice.hpp), older checkpoints lack them (fp32_gemm:
//                        before the fp32 choice existed, oneDNN; bf16_attention: before the pair
//                        products existed, an fp32 attention)
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/batch_source.hpp"
#include "config/train_config.hpp"
#include "storage/host/host_model.hpp"

namespace mt::actors {

nlohmann::json train_config_json(const TrainConfig& cfg);

// data_cursor: the loader's cursor before the checkpoint's first batch (BatchSource::cursor_before), or null.
nlohmann::json make_run_state(const TrainConfig& cfg, const nlohmann::json& data_cursor, std::int64_t step,
                              std::int64_t micro_batches, const HostModel& host,
                              const nlohmann::json& evaluations = nlohmann::json::array());

// (bugprone-exception-escape: nlohmann::json's noexcept move runs an invariant check the analysis
// cannot prove never throws.)
struct ResumePoint {  // NOLINT(bugprone-exception-escape)
  std::int64_t step = 0;
  std::filesystem::path dir;  // the checkpoint loaded
  nlohmann::json run_state;
  std::vector<std::string> skipped;  // damaged checkpoints skipped (fallback), with why
  std::vector<std::string> notes;    // training keys that differ from the checkpoint's run
};

// Resolves train.resume_from_checkpoint: "latest" = the checkpoint root (`root`), otherwise a root
// or a step directory.
std::filesystem::path resume_path(const TrainConfig& cfg, const std::filesystem::path& root);

// Opens the checkpoint (fully verified; with fallback the newest older one that verifies), checks its
// model config equals `model` (a clear error otherwise), reads every stage's params and Adam moments
// into `host` one stage at a time (straight into the tiles), and sets every tile's version to the
// checkpoint's step. Positions `data` (when given) at the checkpoint's data cursor.
// Throws ckpt::CheckpointError / std::runtime_error with a message naming the file or field.
ResumePoint load_checkpoint(const std::filesystem::path& path, bool fallback_previous_good, const TrainConfig& cfg,
                            const ModelConfig& model, HostModel& host, BatchSource* data);

// Fills every tile's params from a Hugging Face model directory, stage by stage (Adam moments and
// gradients zero, versions 0). Returns config.json as found (kept in checkpoints and exports).
nlohmann::json load_hf_weights(const std::filesystem::path& dir, HostModel& host);

// Writes the tiles' params as a Hugging Face model directory (one stage at a time, from the tiles).
// `fetch(stage, into)`: the fp32 masters of a stage this process does not hold (a bf16 replica under
// cluster.shard_state: its owner sends them), into a buffer of the stage's floats.
using FetchMasters = std::function<void(std::int64_t stage, float* into)>;
void export_hf(const std::filesystem::path& dir, const HostModel& host, const std::string& base_config_json,
               const FetchMasters& fetch = nullptr);

}  // namespace mt::actors
