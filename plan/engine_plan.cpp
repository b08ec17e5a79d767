// plan_engine: the device plan's search (modes fastest first, sequence tiles from the largest, keys
// and values mapped last), then the budget left over; and the plan's derived figures.
#include "plan/engine_plan.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

#include "cluster/grad_reduce.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/param_layout.hpp"
#include "plan/schedule.hpp"
#include "plan/tier_bytes.hpp"

namespace mt::plan {

namespace {

// Sizes the activations for keep mode `keep` (not automatic): sets p's mode, boundary placement and
// activation sizes, and returns the arena request for p.
ArenaRequest size_activations(EnginePlan& p, const TrainConfig& cfg, const ModelConfig& model, KeepIntermediates keep) {
  const bool mapped = keep == KeepIntermediates::boundary_mapped || keep == KeepIntermediates::all_mapped;
  p.mode = keep == KeepIntermediates::all || keep == KeepIntermediates::all_mapped ? ActivationMode::keep
                                                                                   : ActivationMode::recompute;
  p.boundaries = mapped                                     ? BoundaryPlacement::mapped
                 : keep == KeepIntermediates::boundary_host ? BoundaryPlacement::host_ring
                                                            : BoundaryPlacement::device;
  const std::int64_t L = model.num_hidden_layers;
  const std::size_t boundary = align_floats(p.hidden_floats);
  const bool layer_major = p.order == MicroBatchOrder::layer_major;
  const std::size_t sets = static_cast<std::size_t>(p.activation_sets);
  // dx ping-pong: one pair, or layer-major a pair per micro-batch (their backwards alternate op by op).
  const std::size_t dx_buffers = layer_major ? 2 * sets : 2;
  std::size_t act = dx_buffers * boundary;
  p.ring_entries = p.activation_slots = 0;
  p.host_boundary_bytes = 0;
  if (p.boundaries ==
      BoundaryPlacement::mapped) {  // all of it in host RAM: (L + 1) boundaries per set and the dx buffers
    p.host_boundary_bytes = (sets * static_cast<std::size_t>(L + 1) + dx_buffers) * boundary * sizeof(float);
    act = 0;
  } else if (p.boundaries == BoundaryPlacement::host_ring) {
    // Independent of depth: a ring for the forward (3 entries: one read, one written, one still
    // being copied out) and one input slot per weight slot for the backward. Layer-major the heads'
    // inputs (boundary L) stay on the device per micro-batch: a second pass's heads read them again.
    p.ring_entries = 3;
    p.activation_slots = p.weight_slots;
    act += static_cast<std::size_t>(p.ring_entries + p.activation_slots) * boundary;
    if (layer_major) act += sets * boundary;
    p.host_boundary_bytes =
        static_cast<std::size_t>(p.activation_sets) * static_cast<std::size_t>(L) * boundary * sizeof(float);
  } else {
    act += static_cast<std::size_t>(p.activation_sets) * static_cast<std::size_t>(L + 1) * boundary;
  }
  p.saved_floats = 0;
  if (p.mode == ActivationMode::keep) p.seq_tile = 0;  // kept intermediates are whole-sequence
  if (p.mode == ActivationMode::keep || p.boundaries != BoundaryPlacement::device || p.seq_tile > 0) p.kept_layers = 0;
  p.kept_layers = std::clamp<std::int64_t>(p.kept_layers, 0, L);
  const std::int64_t saved_layers = p.mode == ActivationMode::keep ? L : p.kept_layers;
  if (saved_layers > 0) {
    p.saved_floats = layer_saved_floats(model, p.batch, p.seq);
    const std::size_t saved = static_cast<std::size_t>(p.activation_sets) * static_cast<std::size_t>(saved_layers) *
                              align_floats(p.saved_floats);
    if (p.boundaries ==
        BoundaryPlacement::mapped)  // all_mapped: after the boundaries and dx in host RAM (carve_activations)
      p.host_boundary_bytes += saved * sizeof(float);
    else
      act += saved;
  }
  const Precision prec = cfg.precision();
  if (!placements_consistent(p.boundaries, p.keys_values, p.attention, p.seq_tile)) {  // this mode maps neither
    p.keys_values = KeysValues::device_workspace;
    p.attention = AttentionOutputs::recomputed;
  }
  const bool kv_mapped = p.keys_values == KeysValues::mapped;
  p.sequence_floats = kv_mapped ? layer_sequence_floats(model, p.batch, p.seq, p.seq_tile) : 0;
  p.host_boundary_bytes += align_floats(p.sequence_floats) * sizeof(float);
  p.attention_floats =
      p.attention == AttentionOutputs::kept_mapped ? layer_attention_floats(model, p.batch, p.seq, p.seq_tile) : 0;
  p.host_boundary_bytes += kept_attention_bytes(p, model);
  p.workspace_floats =
      std::max(layer_workspace_floats(model, p.batch, p.seq, p.mode, prec, p.seq_tile,
                                      kv_mapped ? SequenceBuffers::apart : SequenceBuffers::in_workspace),
               head_workspace_floats(model, p.batch, p.seq, 0, prec, p.seq_tile));
  ArenaRequest req;
  req.budget_bytes = cfg.device_budget_bytes();
  req.budget_name = cfg.device_budget_name();
  req.weight_slots = p.weight_slots;
  req.weight_bytes_per_param = bytes_per_param(cfg.precision());  // slots hold what the tiles stream
  req.grad_slots = p.grad_slots;
  req.workspace_bytes = p.workspace_floats * sizeof(float);
  req.activation_bytes = act * sizeof(float);
  return req;
}

// The budget left over, spent one unit at a time while the arena fits: with device.*_slots = auto,
// gradient slots (so compute does not wait for the collector to drain the one staging slot: the
// demo's 1.1 s of offload on the critical path), up to kAutoSlots across a link; on the CPU backend
// without one (it maps the tiles and writes micro-batch 0's gradients in place, so a slot's memory
// is only used by later micro-batches) 2 with gradient accumulation, else the 1 the protocol needs;
// with keep_intermediates = auto in recompute mode, kept layers (each saves a layer's forward
// recomputation, a quarter of its backward's work); then gradient and weight slots (a deeper
// prefetch) up to kAutoSlots each. The results do not depend on any of these (bit-identical), only
// the overlap and the work do.
void grow_into_budget(EnginePlan& p, const TrainConfig& cfg, const ModelConfig& model, bool grad, bool weight,
                      bool layers) {
  constexpr int kAutoSlots = 4;
  const KeepIntermediates keep = planned_keep(p);
  auto fits = [&](EnginePlan& trial) {
    const ArenaRequest req = size_activations(trial, cfg, model, keep);
    if (arena_bytes_needed(model, req) > req.budget_bytes) return false;
    trial.arena = plan_arena(model, req);
    return true;
  };
  auto try_grow = [&](int EnginePlan::*slots, int up_to) {
    while (p.*slots < up_to) {
      EnginePlan trial = p;
      ++(trial.*slots);
      if (!fits(trial)) return;
      p = std::move(trial);
    }
  };
  const bool link = !cfg.device_shares_host_memory();
  // Several ranks stage micro-batch 0 too (it is sent from its slot): 2, so compute runs on while one is sent.
  // Stage gradients stage micro-batch 0 too and hold a slot until the optimizer used it: 2.
  if (grad)
    try_grow(&EnginePlan::grad_slots,
             link ? kAutoSlots : (p.device_micro_batches > 1 || p.ranks > 1 || p.stage_gradients ? 2 : 1));
  if (layers && keep == KeepIntermediates::boundary && p.seq_tile == 0) {
    while (p.kept_layers + 1 < model.num_hidden_layers) {
      EnginePlan trial = p;
      ++trial.kept_layers;
      if (!fits(trial)) break;
      p = std::move(trial);
    }
    if (p.kept_layers > 0)
      p.notes.push_back("device.keep_intermediates=auto also keeps the intermediates of the last " +
                        std::to_string(p.kept_layers) +
                        " layer(s) (the budget left over): their backward recomputes nothing");
  }
  if (grad) try_grow(&EnginePlan::grad_slots, kAutoSlots);
  if (weight) try_grow(&EnginePlan::weight_slots, kAutoSlots);
  if (grad || weight)
    p.notes.push_back("device slots: " + std::to_string(p.weight_slots) + " weight, " + std::to_string(p.grad_slots) +
                      " gradient (" +
                      (grad && weight ? "both auto"
                       : grad         ? "gradient auto"
                                      : "weight auto") +
                      ": as many as the budget allows, up to " + std::to_string(kAutoSlots) + ")");
}

// The sequence tiles plan_engine tries, in order: the configured one (device.seq_tile > 0; one >= seq
// is whole sequences), or (auto) whole sequences, then powers of two below seq down to kMinAutoSeqTile.
std::vector<std::int64_t> seq_tile_candidates(const TrainConfig& cfg, const ModelConfig& model, std::int64_t seq) {
  if (cfg.device.seq_tile > 0) return {cfg.device.seq_tile < seq ? cfg.device.seq_tile : 0};
  std::vector<std::int64_t> r{0};
  if (!layer_has_seq_tiles(model)) return r;
  std::int64_t t = 1;
  while (t * 2 < seq) t *= 2;
  for (; t >= kMinAutoSeqTile; t /= 2) r.push_back(t);
  return r;
}

}  // namespace

KeepIntermediates planned_keep(const EnginePlan& p) {
  const bool keep = p.mode == ActivationMode::keep;
  switch (p.boundaries) {
    case BoundaryPlacement::mapped:
      return keep ? KeepIntermediates::all_mapped : KeepIntermediates::boundary_mapped;
    case BoundaryPlacement::host_ring:
      return KeepIntermediates::boundary_host;
    case BoundaryPlacement::device:
      break;
  }
  return keep ? KeepIntermediates::all : KeepIntermediates::boundary;
}

const char* boundary_placement_name(BoundaryPlacement b) {
  switch (b) {
    case BoundaryPlacement::host_ring:
      return "host_ring";
    case BoundaryPlacement::mapped:
      return "mapped";
    case BoundaryPlacement::device:
      break;
  }
  return "device";
}

const char* keys_values_name(KeysValues k) { return k == KeysValues::mapped ? "mapped" : "device_workspace"; }

const char* attention_outputs_name(AttentionOutputs a) {
  return a == AttentionOutputs::kept_mapped ? "kept_mapped" : "recomputed";
}

void check_placements(const EnginePlan& p) {
  const std::string what = std::string("boundaries ") + boundary_placement_name(p.boundaries) + ", keys and values " +
                           keys_values_name(p.keys_values) + ", attention outputs " +
                           attention_outputs_name(p.attention) + ", seq_tile " + std::to_string(p.seq_tile);
  if (!placements_consistent(p.boundaries, p.keys_values, p.attention, p.seq_tile))
    throw std::invalid_argument("plan: " + what +
                                ": only the mapped block of a tiled run holds keys, values or "
                                "attention outputs");
  if (p.kept_layers > 0 &&
      (p.boundaries != BoundaryPlacement::device || p.seq_tile > 0 || p.mode == ActivationMode::keep))
    throw std::invalid_argument("plan: " + what +
                                ": kept layers need recompute mode with the boundaries on the "
                                "device in whole sequences");
}

nlohmann::json plan_summary(const EnginePlan& p) {
  return {{"keep_intermediates", keep_intermediates_name(planned_keep(p))},
          {"seq_tile", p.seq_tile},
          {"kept_layers", p.kept_layers},
          {"attention_kept", p.attention == AttentionOutputs::kept_mapped},
          {"sequence_mapped", p.keys_values == KeysValues::mapped},
          {"boundaries", boundary_placement_name(p.boundaries)},
          {"keys_values", keys_values_name(p.keys_values)},
          {"attention_outputs", attention_outputs_name(p.attention)},
          {"micro_batch_order", micro_batch_order_name(p.order)},
          {"stage_gradients", p.stage_gradients},
          {"gradient_passes", p.gradient_passes},
          {"batch", p.batch},
          {"seq", p.seq},
          {"micro_batches", p.micro_batches},
          {"devices", p.devices},
          {"ranks", p.ranks},
          {"weight_slots", p.weight_slots},
          {"grad_slots", p.grad_slots},
          {"prefetch_depth", p.prefetch_depth},
          {"activation_sets", p.activation_sets},
          {"arena_bytes", p.arena.total_bytes},
          {"arena_budget_bytes", p.arena.budget_bytes},
          {"host_boundary_bytes", p.host_boundary_bytes},
          {"workspace_bytes", p.workspace_floats * sizeof(float)}};
}

std::size_t kept_attention_bytes(const EnginePlan& p, const ModelConfig& model) {
  if (p.attention != AttentionOutputs::kept_mapped) return 0;
  return static_cast<std::size_t>(p.activation_sets * model.num_hidden_layers) * align_floats(p.attention_floats) *
         sizeof(float);
}

BackendOptions backend_options(const TrainConfig& cfg, const EnginePlan& plan) {
  BackendOptions o;
  o.kind = cfg.device.backend;
  o.precision = cfg.precision();
  o.compute_threads = std::max(1, plan.threads.blas);
  o.link_workers = std::clamp(plan.threads.copy, 1, 2);
  o.link_bytes_per_s = cfg.copy_bandwidth_bytes_per_s();
  o.seq_tile = plan.seq_tile;
  o.cuda_tf32 = cfg.train.tf32;
  o.devices = static_cast<int>(cfg.device.gpus);
  if (cfg.cluster.ranks > 1) {  // one GPU per rank: its place among the ranks of its host
    o.host_rank = cfg.cluster.local_rank;
    o.host_ranks = cfg.cluster.local_ranks;
    if (cfg.rank_grad_transport() == "nccl") o.rank_transport_ranks = cfg.cluster.ranks;
  }
  return o;
}

cuda::ScratchPlan cuda_ops_scratch(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan) {
  return cuda::cuda_scratch_plan(model, plan.batch, plan.seq, plan.seq_tile, 0, cfg.precision());
}

namespace {

// The plan's shape before any placement: batch, sequence, micro-batches, slots as configured (auto:
// the minimum), stage gradients, the tied embedding's staging slots; every check of those keys.
EnginePlan plan_shape(const TrainConfig& cfg, const ModelConfig& model) {
  EnginePlan p;
  p.batch = cfg.train.per_device_train_batch_size;
  p.seq = cfg.data.seq_length;
  p.device_micro_batches = cfg.train.gradient_accumulation_steps;
  p.stages = num_stages(model);
  if (p.batch < 1) throw ConfigError("train.per_device_train_batch_size", "must be >= 1");
  if (p.device_micro_batches < 1) throw ConfigError("train.gradient_accumulation_steps", "must be >= 1");
  if (cfg.device.gpus < 1) throw ConfigError("device.gpus", "must be >= 1");
  p.devices = static_cast<int>(cfg.device.gpus);
  p.ranks = cfg.cluster.ranks;
  p.micro_batches = p.ranks * p.devices * p.device_micro_batches;
  if (p.seq < 1) throw ConfigError("data.seq_length", "must be >= 1");
  if (p.seq > model.max_position_embeddings && !model.positions_extend_past_max())
    throw ConfigError("data.seq_length", std::to_string(p.seq) + " exceeds the model's max_position_embeddings (" +
                                             std::to_string(model.max_position_embeddings) + ")");
  validate_batch_shape(model, p.batch, p.seq);
  const bool auto_weight = cfg.device.weight_slots == 0, auto_grad = cfg.device.grad_slots == 0;
  if (!auto_weight && cfg.device.weight_slots < 2)
    throw ConfigError("device.weight_slots", "must be >= 2 (double buffering), or auto");
  if (!auto_grad && cfg.device.grad_slots < 1) throw ConfigError("device.grad_slots", "must be >= 1, or auto");
  p.weight_slots = auto_weight ? 2 : static_cast<int>(cfg.device.weight_slots);
  p.grad_slots = auto_grad ? 1 : static_cast<int>(cfg.device.grad_slots);
  p.hidden_floats = static_cast<std::size_t>(p.batch * p.seq * model.hidden_size);
  p.order = cfg.micro_batch_order();
  p.stage_gradients = cfg.stage_gradients();
  if (p.stage_gradients) {
    if (const std::string why = cfg.stage_gradients_unsupported(); !why.empty())
      throw ConfigError("train.gradient_buffer",
                        "stage needs each stage's gradient complete after one backward: " + why);
    p.gradient_passes = cfg.stage_gradient_passes();
    if (p.device_micro_batches > 1 && cfg.device.schedule != micro_batch_order_name(p.order))
      p.notes.push_back("device.schedule=" + cfg.device.schedule + " gives way to layer_major: stage gradients of " +
                        std::to_string(p.device_micro_batches) +
                        " micro-batches need each stage's backward over every micro-batch back to back");
  }
  // Tied embeddings: the head's gradient of the embedding is staged until the embedding's backward of
  // the same micro-batch (layer-major: every micro-batch's at once), and one more slot takes the rest.
  const bool tied = model.tie_word_embeddings || model.is_gpt2();
  const int tied_slots =
      tied ? 1 + (p.order == MicroBatchOrder::layer_major ? static_cast<int>(p.device_micro_batches) : 1) : 0;
  if (tied && p.grad_slots < tied_slots) {
    p.notes.push_back("device.grad_slots raised from " + std::to_string(p.grad_slots) + " to " +
                      std::to_string(tied_slots) +
                      ": with tied embeddings the head's gradient of the embedding is staged until the "
                      "embedding's backward" +
                      (tied_slots > 2 ? " (layer-major: every micro-batch's)" : ""));
    p.grad_slots = tied_slots;
  }
  p.activation_sets = activation_sets(p.order, p.device_micro_batches);  // a second pass replays the first's
  return p;
}

// The modes to try, fastest first: every intermediate kept (no recomputation) on the device, or where
// the device's memory is the host's, in host RAM; the boundaries on the device, offloaded to the host
// (device memory flat in depth); each with whole sequences, then (auto) sequence tiles from the largest.
// boundary_mapped last under auto: the arena no longer bounds activations then, only host RAM does
// (and on a GPU the kernels read them across the link).
std::vector<KeepIntermediates> modes_to_try(const TrainConfig& cfg, KeepIntermediates keep) {
  if (keep != KeepIntermediates::automatic) return {keep};
  std::vector<KeepIntermediates> modes = {KeepIntermediates::all};
  if (cfg.device_shares_host_memory()) modes.push_back(KeepIntermediates::all_mapped);
  for (KeepIntermediates k :
       {KeepIntermediates::boundary, KeepIntermediates::boundary_host, KeepIntermediates::boundary_mapped})
    modes.push_back(k);
  return modes;
}

// all_mapped under auto spends host RAM to save the recomputation: only while what the run holds in
// host RAM (the tiles, staging, encodings, stage accumulators, and per device the arena, host memory
// here, and the mapped block) stays within half the host RAM (TrainConfig::host_ram_bytes), the other
// half left to what the fit check does not count (the data, checkpoint snapshots, the page cache). A
// run it would crowd recomputes as before.
bool crowds_host_ram(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& trial,
                     const ArenaRequest& req) {
  const double host_ram = cfg.host_ram_bytes();  // read here: most plans never weigh it
  const TierBytes tb = tier_bytes(cfg, model);
  double need = static_cast<double>(tb.tiles + tb.staging + tb.ram_encodings) +
                static_cast<double>(trial.devices) *
                    static_cast<double>(arena_bytes_needed(model, req) + trial.host_boundary_bytes);
  if (sums_into_stage_accumulators(trial))
    need += kStageAccumulators * static_cast<double>(stage_accumulator_floats(cfg, model) * sizeof(float));
  return host_ram <= 0 || need > 0.5 * host_ram;
}

// The search for the fastest placement that fits: its inputs and the first budget error met.
struct FitSearch {
  FitSearch(const TrainConfig& c, const ModelConfig& m) : cfg(c), model(m) {}
  const TrainConfig& cfg;
  const ModelConfig& model;
  KeepIntermediates keep = KeepIntermediates::automatic;
  std::vector<KeepIntermediates> modes;
  std::vector<std::int64_t> tiles;
  bool tiles_possible = false;
  bool kv_host = false;           // device.attention_kv = host
  bool may_map_sequence = false;  // a pass with attention's keys and values mapped is allowed
  std::optional<ArenaBudgetError> last_error;
};

// Last, when nothing above fits (device.attention_kv=auto, on a device sharing host memory: across a
// link every tile would read them there), or only (host): boundaries mapped with the tiled layers' keys
// and values mapped too (the arena then holds the weight and gradient slots and one tile's work).
FitSearch fit_search(const TrainConfig& cfg, const ModelConfig& model, std::int64_t seq) {
  FitSearch f(cfg, model);
  f.keep = cfg.keep_intermediates();
  f.tiles_possible = layer_has_seq_tiles(model);
  if (cfg.device.seq_tile > 0 && cfg.device.seq_tile < seq && !f.tiles_possible)
    throw ConfigError("device.seq_tile",
                      "GPT-2 layers run whole sequences (their learned positions bound the "
                      "context); use auto or a value >= data.seq_length");
  f.modes = modes_to_try(cfg, f.keep);
  f.tiles = seq_tile_candidates(cfg, model, seq);
  f.kv_host = cfg.device.attention_kv == "host";
  const bool keep_maps = f.keep == KeepIntermediates::automatic || f.keep == KeepIntermediates::boundary_mapped;
  if (f.kv_host && !keep_maps)
    throw ConfigError("device.attention_kv", std::string("host maps them beside the boundaries: it needs "
                                                         "device.keep_intermediates=boundary_mapped or auto, not ") +
                                                 cfg.device.keep_intermediates);
  if (f.kv_host && f.tiles.back() == 0)
    throw ConfigError("device.attention_kv",
                      "host needs sequence tiles (device.seq_tile below data.seq_length=" + std::to_string(seq) +
                          (f.tiles_possible ? ")" : "; GPT-2 layers run whole sequences)"));
  f.may_map_sequence = f.tiles.back() > 0 && keep_maps &&
                       (f.kv_host || (cfg.device.attention_kv == "auto" && cfg.device_shares_host_memory()));
  return f;
}

// Why auto chose mode k (a note of the plan).
std::string keep_choice_note(const FitSearch& f, const EnginePlan& trial, KeepIntermediates k) {
  return std::string("device.keep_intermediates=auto chose ") + keep_intermediates_name(k) +
         (k == KeepIntermediates::all ? " (every intermediate fits the budget)"
          : k == KeepIntermediates::all_mapped
              ? " (the device shares host memory: every intermediate is kept there, " +
                    format_bytes(trial.host_boundary_bytes) + " with the boundaries, and nothing is recomputed)"
          : f.kv_host ? " (device.attention_kv=host maps keys and values beside the boundaries)"
                      : " (keeping more does not fit the budget)");
}

// Plan p with sequence tile `tile`, mode k and attention's keys and values placed `kv`, when that
// combination exists and fits; else nullopt (a budget error is kept in f.last_error).
std::optional<EnginePlan> try_fit(FitSearch& f, const EnginePlan& p, std::int64_t tile, KeepIntermediates k,
                                  KeysValues kv) {
  const bool map_sequence = kv == KeysValues::mapped;
  const bool keeps_all = k == KeepIntermediates::all || k == KeepIntermediates::all_mapped;
  if (tile > 0 && keeps_all) return std::nullopt;  // keep mode is whole-sequence
  if (map_sequence && (tile == 0 || k != KeepIntermediates::boundary_mapped)) return std::nullopt;
  EnginePlan trial = p;
  trial.seq_tile = tile;
  trial.keys_values = kv;
  const ArenaRequest req = size_activations(trial, f.cfg, f.model, k);
  if (k == KeepIntermediates::all_mapped && f.keep == KeepIntermediates::automatic &&
      crowds_host_ram(f.cfg, f.model, trial, req))
    return std::nullopt;
  try {
    trial.arena = plan_arena(f.model, req);
  } catch (const ArenaBudgetError& e) {
    if (!f.last_error) f.last_error = e;  // the whole-sequence error says most; tiles are appended below
    return std::nullopt;
  }
  if (f.keep == KeepIntermediates::automatic) trial.notes.push_back(keep_choice_note(f, trial, k));
  if (map_sequence)
    trial.notes.push_back("attention's keys, values and their gradients (" +
                          format_bytes(trial.sequence_floats * sizeof(float)) + ") are mapped in host RAM too (" +
                          (f.kv_host ? "device.attention_kv=host"
                                     : "device.attention_kv=auto: the budget holds them at no sequence tile") +
                          ")");
  return trial;
}

// Nothing fitted: the error that says why.
[[noreturn]] void throw_no_fit(const FitSearch& f) {
  const TrainConfig& cfg = f.cfg;
  if (!f.last_error)  // no trial at all: keep mode runs whole sequences only
    throw ConfigError("device.keep_intermediates", cfg.device.keep_intermediates +
                                                       " keeps whole-sequence intermediates: it cannot run in "
                                                       "sequence tiles (device.seq_tile=" +
                                                       std::to_string(cfg.device.seq_tile) + " below data.seq_length)");
  if (f.kv_host)
    throw ArenaBudgetError(std::string(f.last_error->what()) + "; nor does it fit in sequence tiles down to " +
                           "device.seq_tile=" + std::to_string(f.tiles.back()) +
                           " tokens with the boundaries and attention's keys and values in host RAM "
                           "(device.attention_kv=host): raise the budget or lower data.seq_length");
  std::string msg = f.last_error->what();
  if (f.tiles.size() > 1)
    msg += "; nor does it fit in sequence tiles down to device.seq_tile=" + std::to_string(f.tiles.back()) +
           " tokens (what device.seq_tile=auto tries" +
           (f.may_map_sequence ? ", with the boundaries and attention's keys and values in host RAM" : "") +
           "): raise the budget or lower data.seq_length";
  throw ArenaBudgetError(msg);
}

// The first fit in order: keys and values on the device, then (when allowed) mapped (host: mapped
// only); in each, tiles from whole sequences down; in each tile, the modes fastest first.
EnginePlan choose_fit(FitSearch& f, const EnginePlan& p) {
  std::vector<KeysValues> passes;
  if (!f.kv_host) passes.push_back(KeysValues::device_workspace);
  if (f.may_map_sequence) passes.push_back(KeysValues::mapped);
  for (KeysValues kv : passes)
    for (std::int64_t tile : f.tiles)
      for (KeepIntermediates k : f.modes)
        if (std::optional<EnginePlan> fit = try_fit(f, p, tile, k, kv)) return std::move(*fit);
  throw_no_fit(f);
}

// Tiles with the boundaries mapped where the device shares host memory: keep each layer's attention
// output and log-sum-exp there too when half the host RAM holds them (the arena does not change). As
// for all_mapped, the guard is weighed before grow_into_budget adds slots to the arena (host memory
// here too): a few layers' weights, small beside what it weighs.
void keep_attention_if_room(EnginePlan& p, const TrainConfig& cfg, const ModelConfig& model) {
  if (p.boundaries != BoundaryPlacement::mapped || p.seq_tile <= 0 || !cfg.device_shares_host_memory()) return;
  EnginePlan trial = p;
  trial.attention = AttentionOutputs::kept_mapped;
  const ArenaRequest req = size_activations(trial, cfg, model, KeepIntermediates::boundary_mapped);
  if (crowds_host_ram(cfg, model, trial, req)) return;
  trial.arena = plan_arena(model, req);
  trial.notes.push_back("each layer's attention output and log-sum-exp (" +
                        format_bytes(trial.attention_floats * sizeof(float)) +
                        " a layer) are kept in host RAM too: the tiled backward does not run the attention "
                        "forward again");
  p = std::move(trial);
}

// After the placement: the tiles' note, the budget left over (auto slots and kept layers), prefetch
// depth and threads.
void finish_plan(EnginePlan& p, const FitSearch& f) {
  const TrainConfig& cfg = f.cfg;
  if (p.seq_tile > 0)
    p.notes.push_back("sequence tiles of " + std::to_string(p.seq_tile) + " tokens (device.seq_tile=" +
                      (cfg.device.seq_tile > 0 ? std::to_string(cfg.device.seq_tile)
                       : f.kv_host ? std::string("auto: the largest that fits with keys and values in host RAM")
                                   : std::string("auto: the whole sequence does not fit the budget")) +
                      "): layers and the head run a tile at a time; attention's keys and values are sequence-sized");
  const bool auto_weight = cfg.device.weight_slots == 0, auto_grad = cfg.device.grad_slots == 0;
  const bool auto_layers = f.keep == KeepIntermediates::automatic;
  if (auto_grad || auto_weight || auto_layers) grow_into_budget(p, cfg, f.model, auto_grad, auto_weight, auto_layers);
  if (cfg.device.prefetch_depth > p.weight_slots - 1)
    throw ConfigError("device.prefetch_depth", std::to_string(cfg.device.prefetch_depth) + " exceeds the " +
                                                   std::to_string(p.weight_slots) + " weight slots minus one");
  p.prefetch_depth = static_cast<int>(cfg.device.prefetch_depth > 0 ? cfg.device.prefetch_depth : p.weight_slots - 1);
  p.threads = cfg.thread_budget();
}

}  // namespace

EnginePlan plan_engine(const TrainConfig& cfg, const ModelConfig& model) {
  model.validate();
  try {
    check_backend_available(backend_options(cfg, EnginePlan{}));
  } catch (const BackendUnavailable& e) {
    throw ConfigError(e.key(), e.reason());
  }
  const EnginePlan shape = plan_shape(cfg, model);
  FitSearch f = fit_search(cfg, model, shape.seq);
  EnginePlan p = choose_fit(f, shape);
  keep_attention_if_room(p, cfg, model);
  finish_plan(p, f);
  check_placements(p);
  return p;
}

OwnedStages host_owned_stages(const TrainConfig& cfg, const ModelConfig& model) {
  if (!cfg.shards_host_state()) return {};
  OwnedStages owned(static_cast<std::size_t>(num_stages(model)));
  for (std::size_t s = 0; s < owned.size(); ++s)
    owned[s] = cluster::stage_owner(static_cast<std::int64_t>(s), cfg.cluster.ranks) == cfg.cluster.rank ? 1 : 0;
  return owned;
}

std::size_t stage_accumulator_floats(const TrainConfig& cfg, const ModelConfig& model) {
  const OwnedStages owned = host_owned_stages(cfg, model);
  std::size_t largest = 0;
  for (std::int64_t s = 0; s < num_stages(model); ++s)
    if (owned.empty() || owned[static_cast<std::size_t>(s)] != 0)
      largest = std::max(largest, stage_layout(model, s).total_floats);
  return largest;
}

HostTileOptions host_tile_options(const TrainConfig& cfg) {
  HostTileOptions o;
  o.compute_bytes_per_param = cfg.precision() == Precision::bf16 ? sizeof(bf16_t) : 0;
  o.moments_in_tile = cfg.train.offload_dir.empty() && cfg.optimizer_compression() == OptimizerCompression::none &&
                      !cfg.train.offload_params;
  o.params_in_tile = !cfg.train.offload_params;  // else the masters live with the moments (bf16: the copy streams)
  o.split_master = cfg.split_masters();          // bf16: the copy is the masters' high half (master_halves.hpp)
  o.grad_in_tile = !cfg.stage_gradients();       // else each gradient waits in its staging slot
  o.convert_threads = std::max(1, cfg.thread_budget().optimizer);  // the optimizer's pool: the run's budget
  return o;
}

}  // namespace mt::plan
