// The device plan of a run (EnginePlan), decided before anything is allocated: the arena, where the
// activations live (device, host, mapped host RAM), the sequence tiles, slots, micro-batches and
// threads. plan_engine() checks everything that can be checked before training (the arena fits the
// device budget, slot counts, modes) and throws ConfigError / ArenaBudgetError naming the key. The run
// computes it once, the engine executes it (actors/engine.hpp, EngineJob::plan) and `megatrain plan`
// prints the same object (plan_summary). No CAF.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/train_config.hpp"
#include "device/arena_plan.hpp"
#include "device/backend.hpp"
#include "kernels/model_config.hpp"
#include "kernels/stage_api.hpp"
#include "plan/placements.hpp"
#include "storage/host/host_model.hpp"

namespace mt::plan {

// The device side of a run, decided before anything is allocated.
struct EnginePlan {
  ArenaPlan arena;
  ActivationMode mode = ActivationMode::recompute;
  std::int64_t batch = 0, seq = 0, stages = 0;
  // device.gpus = N devices, each with its own arena of this plan (device memory is per device) and
  // device_micro_batches (train.gradient_accumulation_steps) micro-batches per step; a step has
  // micro_batches = N x device_micro_batches in all (device d runs global micro-batches d, d + N, ...).
  int devices = 1;
  std::int64_t device_micro_batches = 0;
  // Ranks of the job (cfg.cluster.ranks, one device each): a step has micro_batches = ranks x devices x
  // device_micro_batches in all; rank r runs its device_micro_batches (cluster/grad_reduce.hpp).
  int ranks = 1;
  std::int64_t micro_batches = 0;
  int weight_slots = 0, grad_slots = 0, prefetch_depth = 0;
  // train.gradient_buffer=stage: no gradient accumulator in the tiles (Context::stage_gradients); a step
  // runs gradient_passes (2 with clipping) passes of its one micro-batch, each a schedule micro-batch.
  bool stage_gradients = false;
  int gradient_passes = 1;
  std::size_t hidden_floats = 0;  // one boundary activation: batch * seq * hidden_size
  MicroBatchOrder order = MicroBatchOrder::interleaved;
  int activation_sets = 1;  // micro-batches whose activations are alive at once
  // Where the boundaries and dx buffers live (placements.hpp): the arena (boundary, all), host RAM
  // through a ring (boundary_host), or mapped host RAM used in place by the stage operations, the compute
  // seeing them as if on the device (boundary_mapped, all_mapped: with mode keep every layer's
  // intermediates too).
  BoundaryPlacement boundaries = BoundaryPlacement::device;
  int ring_entries = 0;      // host_ring: forward ring entries on the device
  int activation_slots = 0;  // host_ring: backward input slots on the device
  // Boundaries in host RAM: the host store (grows with depth); mapped, everything in the mapped block
  // (with all_mapped the kept intermediates, with keys and values mapped those, with attention outputs
  // kept every layer's attention output and log-sum-exp).
  std::size_t host_boundary_bytes = 0;
  // KeysValues::mapped (boundaries mapped and sequence tiles), when even the smallest tile's keys and
  // values do not fit the budget: the tiled layers' sequence-sized buffers (layer_sequence_floats: keys,
  // values, their gradients, the RoPE tables) are mapped in host RAM after the boundaries, and the
  // workspace holds one tile. The arena then bounds nothing sequence-sized; host RAM does. Results do
  // not change.
  KeysValues keys_values = KeysValues::device_workspace;
  std::size_t sequence_floats = 0;  // keys and values mapped: those buffers (also in host_boundary_bytes)
  // AttentionOutputs::kept_mapped: sequence tiles with the boundaries mapped (by auto or by name), on a
  // device sharing host memory, while half the host RAM holds it (as all_mapped's guard), and not in a
  // forward-only (evaluation) pipeline. Every layer's attention output and log-sum-exp
  // (layer_attention_floats per layer and activation set) sits in the mapped block after the rest, so
  // the tiled backward does not run the attention forward again. Results do not change.
  AttentionOutputs attention = AttentionOutputs::recomputed;
  std::size_t attention_floats = 0;  // kept: one layer's (all of them also in host_boundary_bytes)
  std::size_t saved_floats = 0;      // keep mode, or kept_layers > 0: one layer's intermediates
  // Recompute mode with the boundaries on the device: the last kept_layers layers keep their
  // intermediates anyway (device.keep_intermediates=auto spends budget left over on them), so their
  // backward recomputes nothing. The results do not change (the recomputation is the same forward).
  std::int64_t kept_layers = 0;
  std::size_t workspace_floats = 0;
  // Sequence tiles (long context, device.seq_tile): tokens per tile of the recomputing layers and the
  // head (ComputeCtx::seq_tile), 0 = whole sequences. Auto: 0 when the whole sequence fits the budget,
  // else the largest power of two below seq (down to kMinAutoSeqTile) that fits. No layer is kept then.
  std::int64_t seq_tile = 0;
  ThreadBudget threads;
  std::vector<std::string> notes;  // adjustments made (e.g. grad slots raised for tied embeddings)
};

inline constexpr std::int64_t kMinAutoSeqTile = 128;  // smaller tiles cost GEMM efficiency and save little
EnginePlan plan_engine(const TrainConfig& cfg, const ModelConfig& model);
// The keep_intermediates mode a plan runs (never automatic): what auto chose, or what was asked.
KeepIntermediates planned_keep(const EnginePlan& p);
// The plan's placements and sizes as one object: what `megatrain train` and `megatrain plan` print.
nlohmann::json plan_summary(const EnginePlan& p);
// AttentionOutputs::kept_mapped: the bytes of every layer's kept attention output in each activation set
// (part of host_boundary_bytes); 0 when none is kept.
std::size_t kept_attention_bytes(const EnginePlan& p, const ModelConfig& model);
// What the run asks of its backend (kind, precision, threads, link), from the config and the plan.
BackendOptions backend_options(const TrainConfig& cfg, const EnginePlan& plan);
// The CUDA ops' scratch a run of this plan takes beside the arena (BackendOptions::cuda_scratch): its
// micro-batch shape, sequence tiles and precision. The planner counts it on a GPU.
cuda::ScratchPlan cuda_ops_scratch(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan);

// The host tiles a run needs: with train.bf16, each tile also holds the bf16 compute copy the
// optimizer writes and the prefetcher streams; with train.offload_dir or train.optimizer_compression
// the moments live outside the tiles (moment_store_for).
HostTileOptions host_tile_options(const TrainConfig& cfg);
// The stages whose optimizer state this rank holds (cluster.shard_state with several ranks: stage s on
// rank s mod N, cluster::stage_owner; else empty: every stage). Pass it to HostModel.
OwnedStages host_owned_stages(const TrainConfig& cfg, const ModelConfig& model);
// train.gradient_buffer=stage summing into the two stage accumulators (actors/stage_accumulators.hpp):
// with several micro-batches a step, or several ranks (each stage's owner sums every rank's rounds).
inline bool sums_into_stage_accumulators(const EnginePlan& p) {
  return p.stage_gradients && (p.device_micro_batches > 1 || p.ranks > 1);
}
// Each stage accumulator's floats: the largest stage this rank owns (host_owned_stages; 0 when it owns none).
std::size_t stage_accumulator_floats(const TrainConfig& cfg, const ModelConfig& model);
// The stage accumulators a run with sums_into_stage_accumulators holds (actors/stage_accumulators.hpp):
// the stage being summed, and the one before it in the optimizer.
inline constexpr int kStageAccumulators = 2;
// The plan's placements exist together (placements_consistent), and kept layers only with the boundaries
// on the device in whole sequences: std::invalid_argument naming the combination otherwise (a plan built
// by hand; plan_engine forms no other).
void check_placements(const EnginePlan& p);

}  // namespace mt::plan
