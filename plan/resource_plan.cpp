#include "plan/resource_plan.hpp"

#include <cstdio>
#include <map>
#include <sstream>

#include "plan/hardware.hpp"
#include "plan/tier_bytes.hpp"
#include "storage/host/host_model.hpp"
#include "storage/offload/staged_moment_store.hpp"

namespace mt::plan {

std::string gib(double bytes) {
  char b[64];
  if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(b, sizeof b, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  else
    std::snprintf(b, sizeof b, "%.1f MiB", bytes / (1024.0 * 1024));
  return b;
}

double process_baseline_bytes() {
  // Cached: later calls in the same process must not count the run's own buffers as libraries.
  static const double loaded = [] {
    const double rss = process_status_bytes("VmRSS");
    return rss > 0 ? rss : 18.0 * (1 << 20);  // no /proc: a CPU-only build's figure
  }();
  return kProcessRuntimeBytes + loaded;
}

namespace {

double largest_stage_bytes(const ModelConfig& model) {
  std::size_t largest = 0;
  for (std::int64_t s = 0; s < num_stages(model); ++s) largest = std::max(largest, stage_layout(model, s).total_floats);
  return static_cast<double>(largest) * sizeof(float);
}

// The arena's regions as device rows, each the space it takes up to the next region (the rows sum to the
// arena's total), and what sizes each: at long context the workspace is the sequence-sized part.
// A GPU holds, beside each arena, its ops' scratch for the run's shapes (allocated when the backend is
// made) and the backend's fixed reserve (the context, cuBLASLt, token buffers).
void add_cuda_side(ResourcePlan& p, const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& e) {
  const cuda::ScratchPlan s = cuda_ops_scratch(cfg, model, e);
  std::string parts;
  for (int i = 0; i < cuda::kSlots; ++i)
    if (s.bytes[i] > 0)
      parts += (parts.empty() ? "" : ", ") + std::string(cuda::scratch_slot_name(i)) + " " +
               gib(static_cast<double>(s.bytes[i]));
  p.bytes.push_back({"device",
                     "beside the arena: the CUDA ops' scratch for these shapes (" +
                         (parts.empty() ? std::string("none") : parts) + "), allocated at start",
                     static_cast<double>(s.total())});
  p.bytes.push_back({"device", "beside the arena: the CUDA backend's reserve (context, cuBLASLt, token buffers)",
                     static_cast<double>(cuda::kDeviceReserveBytes)});
  p.device_side_bytes = static_cast<double>(s.total() + cuda::kDeviceReserveBytes);
}

// A GPU's copies need page-locked host memory (else they are staged through pageable memory, block the
// thread and serialise with compute): the node pins the tiles, the engine the host boundaries (mapped
// ones are allocated pinned) and every gradient landing buffer, each at its exact size. Counts them in
// p.pinned_bytes and adds the row of the collector's buffer where no other row counts it; returns
// that row's bytes.
double add_pinned(ResourcePlan& p, const ModelConfig& model, const EnginePlan& e, double host_tiles) {
  const double stage = largest_stage_bytes(model);
  double landing = 0.0, added = 0.0;
  if (sums_into_stage_accumulators(e)) {
    landing = stage;  // counted with the accumulators
  } else if (e.stage_gradients) {
    landing = static_cast<double>(e.grad_slots) * stage;  // counted above
  } else {
    landing = added = stage;
    p.bytes.push_back({"host RAM", "the collector's gradient buffer (one stage, over the link)", stage});
  }
  p.pinned_bytes = host_tiles + static_cast<double>(e.devices) * static_cast<double>(e.host_boundary_bytes) + landing;
  return added;
}

void add_device_regions(ResourcePlan& p, const EnginePlan& e, const ModelConfig& model) {
  const ArenaPlan& a = e.arena;
  std::map<ArenaRegionKind, double> taken;
  for (std::size_t i = 0; i < a.regions.size(); ++i) {
    const std::size_t end = i + 1 < a.regions.size() ? a.regions[i + 1].offset : a.total_bytes;
    taken[a.regions[i].kind] += static_cast<double>(end - a.regions[i].offset);
  }
  const double floats = 4.0;
  const double seq_part = 4.0 * static_cast<double>(e.batch * e.seq * model.kv_dim()) * floats;
  const double boundary = static_cast<double>(e.hidden_floats) * floats;
  p.bytes.push_back({"device",
                     "weight slots: " + std::to_string(a.weight_slots) + " x " +
                         gib(static_cast<double>(a.weight_slot_bytes)) + " (the largest stage's streamed parameters)",
                     taken[ArenaRegionKind::weight_slot]});
  p.bytes.push_back({"device",
                     "gradient slots: " + std::to_string(a.grad_slots) + " x " +
                         gib(static_cast<double>(a.grad_slot_bytes)) + " (fp32, staged for the device-to-host copy)",
                     taken[ArenaRegionKind::grad_slot]});
  std::string ws;
  if (e.seq_tile > 0 && e.keys_values == KeysValues::mapped)
    ws = "workspace: one layer in sequence tiles of " + std::to_string(e.seq_tile) +
         " tokens: one tile's activations (keys, values and their gradients are mapped in host RAM)";
  else if (e.seq_tile > 0)
    ws = "workspace: one layer in sequence tiles of " + std::to_string(e.seq_tile) +
         " tokens: keys, values and their gradients of the whole micro-batch (4 x " + std::to_string(e.batch) + " x " +
         std::to_string(e.seq) + " x kv_dim " + std::to_string(model.kv_dim()) + " fp32 = " + gib(seq_part) +
         ", the sequence-sized part), the RoPE tables and one tile's activations";
  else if (e.mode == ActivationMode::keep)
    ws = "workspace: one layer's and the head's scratch at whole sequences of " + std::to_string(e.seq) + " tokens";
  else
    ws = "workspace: one layer at whole sequences of " + std::to_string(e.seq) +
         " tokens, its intermediates recomputed in backward (the head's, when larger)";
  p.bytes.push_back({"device", ws, taken[ArenaRegionKind::workspace]});
  const double act = taken[ArenaRegionKind::activations];
  char b[256];
  std::snprintf(b, sizeof b, "activations: %.1f x a layer boundary (%s: %lld x %lld x hidden %lld fp32)%s",
                boundary > 0 ? act / boundary : 0.0, gib(boundary).c_str(), static_cast<long long>(e.batch),
                static_cast<long long>(e.seq), static_cast<long long>(model.hidden_size),
                e.boundaries == BoundaryPlacement::mapped && e.mode == ActivationMode::keep
                    ? ": none, the boundaries and every layer's intermediates are mapped in host RAM"
                : e.boundaries == BoundaryPlacement::mapped ? ": none, the boundaries are mapped in host RAM"
                : e.boundaries == BoundaryPlacement::host_ring
                    ? ": the backward's dx, the forward ring and the backward's input slots"
                : e.mode == ActivationMode::keep ? ": boundaries, dx and every layer's intermediates"
                : e.kept_layers > 0              ? ": boundaries, dx and the kept layers' intermediates"
                                                 : ": the layer boundaries and the backward's dx");
  p.bytes.push_back({"device", b, act});
}

// What the host tiles hold and their bytes per parameter, as the plan prints it.
std::string tiles_description(const TrainConfig& cfg, const ModelConfig& model, const HostTileOptions& tiles) {
  const bool bf16 = cfg.precision() == Precision::bf16;
  const bool masters_on_tier = cfg.train.offload_params;
  const char* grads = tiles.grad_in_tile ? ", fp32 gradients" : "";
  std::string tiles_what =
      masters_on_tier ? std::string("host tiles:") + (tiles.grad_in_tile ? " fp32 gradients" : "")
      : tiles.split_master
          ? std::string("host tiles: fp32 masters split (the bf16 compute copy + 16-bit low halves)") + grads
          : std::string("host tiles: fp32 masters") + grads;
  if (tiles.moments_in_tile) tiles_what += ", Adam m and v";
  if (bf16 && !tiles.split_master) tiles_what += ", bf16 compute copy";
  {
    // Bytes per parameter of the tiles (what train.master_weights and the moments' home decide), from the
    // tiles' own sizing on a large aligned stage.
    constexpr std::size_t kFloats = std::size_t{1} << 20;
    char b[64];
    std::snprintf(b, sizeof b, " (%.0f bytes/parameter)",
                  static_cast<double>(HostTile::allocation_bytes(kFloats, tiles)) / kFloats);
    tiles_what += b;
    // cluster.shard_state: this rank's stages whole, of the others only what compute streams.
    if (!host_owned_stages(cfg, model).empty()) {
      std::snprintf(b, sizeof b, " for rank %d's stages, %.0f for the %d other ranks'", cfg.cluster.rank,
                    static_cast<double>(HostTile::allocation_bytes(kFloats, replica_tile_options(tiles))) / kFloats,
                    cfg.cluster.ranks - 1);
      tiles_what += b;
    }
  }
  return tiles_what;
}

// The host boundaries (and what is mapped beside them) of each device; returns their bytes.
double add_host_boundaries(ResourcePlan& p, const EnginePlan& e, const ModelConfig& model) {
  if (e.host_boundary_bytes == 0) return 0.0;
  // Each device has its own (the engine allocates them per device).
  const double devices = static_cast<double>(e.devices);
  const std::string each = e.devices > 1 ? ", each of " + std::to_string(e.devices) + " devices" : "";
  const double sequence = static_cast<double>(align_floats(e.sequence_floats) * sizeof(float));
  const double attention = static_cast<double>(kept_attention_bytes(e, model));
  p.bytes.push_back({"host RAM",
                     (e.boundaries == BoundaryPlacement::mapped && e.mode == ActivationMode::keep
                          ? "layer boundaries, the backward's two dx buffers and every layer's intermediates, used "
                            "in place by the device (keep_intermediates=all_mapped"
                      : e.boundaries == BoundaryPlacement::mapped
                          ? "layer boundaries and the backward's two dx buffers, used in place by "
                            "the device (keep_intermediates=boundary_mapped"
                          : "layer boundaries (keep_intermediates=boundary_host") +
                         each + ")",
                     devices * (static_cast<double>(e.host_boundary_bytes) - sequence - attention)});
  if (e.keys_values == KeysValues::mapped)
    p.bytes.push_back({"host RAM",
                       "attention's keys, values and their gradients over the whole micro-batch, and the RoPE "
                       "tables, used in place by the device (device.attention_kv" +
                           each + ")",
                       devices * sequence});
  if (e.attention == AttentionOutputs::kept_mapped)
    p.bytes.push_back({"host RAM",
                       "every layer's attention output and log-sum-exp, so the tiled backward does not run the "
                       "attention forward again" +
                           each,
                       devices * attention});
  return devices * static_cast<double>(e.host_boundary_bytes);
}

// Where the gradients of several micro-batches, ranks or stage updates wait on the host; returns their bytes.
double add_gradient_buffers(ResourcePlan& p, const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& x,
                            const EnginePlan& e) {
  double host = 0.0;
  if (sums_into_stage_accumulators(e)) {
    // Several micro-batches (or ranks) are summed into two stage accumulators
    // (actors/stage_accumulators.hpp), each the largest stage this rank owns, over a link through one
    // host buffer (the largest stage).
    const bool link = !(cfg.device.backend == "cpu" && !x.device_is_gpu && cfg.device_shares_host_memory());
    const double accums =
        kStageAccumulators * static_cast<double>(stage_accumulator_floats(cfg, model)) * sizeof(float) +
        (link ? largest_stage_bytes(model) : 0.0);
    const std::string what =
        e.ranks > 1
            ? "stage gradients of " + std::to_string(e.ranks) + " ranks: two stage accumulators of rank " +
                  std::to_string(cfg.cluster.rank) + "'s stages"
            : "stage gradients of " + std::to_string(e.device_micro_batches) + " micro-batches: two stage accumulators";
    p.bytes.push_back({"host RAM", what + (link ? " and a landing buffer" : ""), accums});
    host += accums;
  } else if (e.stage_gradients &&
             !(cfg.device.backend == "cpu" && !x.device_is_gpu && cfg.device_shares_host_memory())) {
    // Over a link each staging slot's gradient lands in a host buffer of its own (Context::grad_landing).
    const double landing = static_cast<double>(e.grad_slots) * largest_stage_bytes(model);
    p.bytes.push_back({"host RAM",
                       "stage gradients: a landing buffer per staging slot (" + std::to_string(e.grad_slots) + ")",
                       landing});
    host += landing;
  }
  return host;
}

// The engine's part: device regions, the CUDA side, host boundaries, gradient buffers, pinned memory and
// the CPU backend's arenas; returns the host bytes it adds.
double count_engine_bytes(ResourcePlan& p, const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& x,
                          double host_tiles) {
  const EnginePlan& e = *p.engine;
  double host = 0.0;
  p.device_bytes = static_cast<double>(e.arena.total_bytes);
  add_device_regions(p, e, model);
  const bool gpu = cfg.device.backend == "cuda" || x.device_is_gpu;
  if (gpu) add_cuda_side(p, cfg, model, e);
  host += add_host_boundaries(p, e, model);
  host += add_gradient_buffers(p, cfg, model, x, e);
  if (gpu) host += add_pinned(p, model, e, host_tiles);
  if (cfg.device.backend == "cpu" && !x.device_is_gpu) {
    const double arenas = static_cast<double>(cfg.device.gpus) * p.device_bytes;
    p.bytes.push_back({"host RAM",
                       cfg.device.gpus > 1
                           ? "the CPU backend's " + std::to_string(cfg.device.gpus) + " device arenas (host memory)"
                           : std::string("the CPU backend's device arena (host memory)"),
                       arenas});
    host += arenas;
  }
  return host;
}

// Where the engine keeps weights in flight, activations and the sequence.
void add_engine_homes(ResourcePlan& p, const TrainConfig& cfg, const EnginePlan& e) {
  p.homes.push_back("weights in flight: device, " + std::to_string(e.weight_slots) + " slots (prefetch depth " +
                    std::to_string(e.prefetch_depth) + ")");
  p.homes.push_back(
      std::string("activations: ") +
      (e.mode == ActivationMode::keep && e.boundaries == BoundaryPlacement::mapped
           ? "host RAM, used in place (mapped), every intermediate kept (no recomputation)"
       : e.mode == ActivationMode::keep ? "device, every intermediate kept (no recomputation)"
       : e.boundaries == BoundaryPlacement::mapped
           ? "layer boundaries and dx in host RAM, used in place (mapped), recomputed once in backward"
       : e.boundaries == BoundaryPlacement::host_ring ? "layer boundaries in host RAM, recomputed once in backward"
       : e.kept_layers > 0 ? "layer boundaries on the device, recomputed once in backward except the last " +
                                 std::to_string(e.kept_layers) + " layer(s), whose intermediates are kept"
                           : "layer boundaries on the device, recomputed once in backward") +
      (e.attention == AttentionOutputs::kept_mapped
           ? " (but the attention forward: each layer's output is kept in host RAM)"
           : "") +
      ", " + std::to_string(e.activation_sets) + " activation set(s)");
  p.homes.push_back(e.seq_tile > 0 ? "sequence: tiles of " + std::to_string(e.seq_tile) +
                                         " tokens of one sequence through each layer and the "
                                         "head (device.seq_tile" +
                                         (cfg.device.seq_tile > 0 ? "" : "=auto: the whole sequence does not fit") +
                                         "); only attention's keys and values and their gradients are "
                                         "sequence-sized" +
                                         (e.keys_values == KeysValues::mapped ? ", in host RAM" : ", on the device")
                                   : "sequence: whole sequences of " + std::to_string(e.seq) +
                                         " tokens through each layer (device.seq_tile" +
                                         (cfg.device.seq_tile > 0 ? "" : "=auto: they fit the budget") + ")");
}

// Where each part of the state lives, as the plan prints it.
void add_homes(ResourcePlan& p, const TrainConfig& cfg, const HostTileOptions& tiles) {
  const bool bf16 = cfg.precision() == Precision::bf16;
  const bool masters_on_tier = cfg.train.offload_params;
  const std::string moments =
      tiles.moments_in_tile ? "host RAM (the tiles)"
      : cfg.train.offload_dir.empty()
          ? std::string("host RAM, ") + optimizer_compression_name(cfg.optimizer_compression()) +
                " encoded (staged through " + std::to_string(cfg.train.offload_staging_stages) + " slots)"
          : "files in " + cfg.train.offload_dir + " (" + optimizer_compression_name(cfg.optimizer_compression()) +
                ", " + std::to_string(cfg.train.offload_staging_stages) + " stages staged in RAM)";
  p.homes.push_back(std::string("fp32 master weights: ") +
                    (masters_on_tier ? "files in " + cfg.train.offload_dir + ", with the moments"
                     : tiles.split_master
                         ? "host RAM (the tiles), split: the bf16 copy is their high half, 16-bit low halves beside "
                           "it, exact (train.master_weights=split; fp32 would add 2 bytes/parameter)"
                         : "host RAM (the tiles)"));
  if (tiles.grad_in_tile)
    p.homes.push_back("fp32 gradient accumulators: host RAM (the tiles; train.gradient_buffer=model)");
  else
    p.homes.push_back(std::string(cfg.shards_host_state()
                                      ? "fp32 gradients: each round sent from its staging slot to the stage's owner, "
                                        "summed there into a stage accumulator until its update "
                                      : "fp32 gradients: only in the staging slots until each stage's update ") +
                      "(train.gradient_buffer=stage" +
                      (cfg.stage_gradient_passes() == 2
                           ? "; with clipping every step runs forward and backward twice, the first pass for the norm)"
                           : "; one pass: no clipping)"));
  p.homes.push_back("Adam m and v: " + moments);
  if (bf16)
    p.homes.push_back(std::string("bf16 compute copy (what streams): host RAM (the tiles)") +
                      (tiles.split_master ? ", the masters' high halves" : ""));
  if (p.engine) add_engine_homes(p, cfg, *p.engine);
  if (cfg.device.gpus > 1)
    p.homes.push_back(std::to_string(cfg.device.gpus) + " devices, one arena each (the arena above is per device)");
}

// The byte side alone (no misfits): fills p.bytes, p.homes and the totals.
void count_bytes(ResourcePlan& p, const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& x) {
  const HostTileOptions tiles = host_tile_options(cfg);
  const bool masters_on_tier = cfg.train.offload_params;
  // The engine's own sizing (tested equal to a run's accounting): tiles, staging slots, files.
  const TierBytes tb = tier_bytes(cfg, model);
  const double host_tiles = static_cast<double>(tb.tiles);
  const double staging = static_cast<double>(tb.staging + tb.ram_encodings);
  const double disk = static_cast<double>(tb.disk);
  // cluster.shard_state: a rank's moment store holds its own stages only (tier_bytes counts those).
  const std::string own_stages =
      host_owned_stages(cfg, model).empty() ? "" : " of rank " + std::to_string(cfg.cluster.rank) + "'s stages";
  p.bytes.push_back({"host RAM", tiles_description(cfg, model, tiles), host_tiles});
  if (staging > 0)
    p.bytes.push_back({"host RAM",
                       cfg.train.offload_dir.empty()
                           ? std::string("Adam moments") + own_stages + ", " +
                                 optimizer_compression_name(cfg.optimizer_compression()) +
                                 " in RAM (staging slots + every stage's encoding at its bound)"
                           : std::string(masters_on_tier ? "fp32 master and " : "") + "Adam moment staging slots (" +
                                 std::to_string(cfg.train.offload_staging_stages) + ")" + own_stages,
                       staging});
  double host = host_tiles + staging;
  if (p.engine) host += count_engine_bytes(p, cfg, model, x, host_tiles);
  if (disk > 0)
    p.bytes.push_back({"disk",
                       std::string(masters_on_tier ? "fp32 master and " : "") + "Adam moment files" + own_stages +
                           " in " + cfg.train.offload_dir,
                       disk});
  p.host_bytes = host;
  p.host_peak_rss_bytes = host + process_baseline_bytes();
  p.disk_bytes = disk;

  add_homes(p, cfg, tiles);
}

// `given`: the run's own plan of cfg (not planned again); null = planned here.
ResourcePlan plan_once(const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& x, std::string* device_error,
                       std::string* device_key, bool* budget_error = nullptr, const EnginePlan* given = nullptr) {
  ResourcePlan p;
  try {
    p.engine = given != nullptr ? *given : plan_engine(cfg, model);
  } catch (const ConfigError& e) {
    *device_error = e.what();
    *device_key = e.key();
  } catch (const ArenaBudgetError& e) {
    *device_error = e.what();
    *device_key = cfg.device_budget_name().substr(0, cfg.device_budget_name().find('='));
    if (budget_error != nullptr) *budget_error = true;
  }
  count_bytes(p, cfg, model, x);
  return p;
}

double host_need(const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& x) {
  std::string err, key;
  return plan_once(cfg, model, x, &err, &key).host_bytes;
}

}  // namespace

std::optional<EnginePlan> least_device_plan(const TrainConfig& cfg, const ModelConfig& model) {
  TrainConfig c = cfg;
  c.device.max_vram_gb = 1e9;  // no budget: the plan's own size is the answer
  c.device.weight_slots = 2;
  c.device.grad_slots = 1;
  c.device.prefetch_depth = 0;
  const std::int64_t seq = cfg.data.seq_length;
  c.device.seq_tile = layer_has_seq_tiles(model) && seq > kMinAutoSeqTile ? kMinAutoSeqTile : 0;
  std::optional<EnginePlan> best;
  const std::vector<KeepIntermediates> modes{KeepIntermediates::boundary_host, KeepIntermediates::boundary_mapped};
  for (KeepIntermediates k : modes) {
    c.device.keep_intermediates = keep_intermediates_name(k);
    // Mapped boundaries in tiles: attention's keys and values mapped too (the least device memory).
    // As auto maps them, on a device sharing host memory only (across a link every tile would read them
    // there), or where the config asks for it.
    const bool may_map = cfg.device_shares_host_memory() || cfg.device.attention_kv == "host";
    c.device.attention_kv =
        k == KeepIntermediates::boundary_mapped && c.device.seq_tile > 0 && may_map ? "host" : "device";
    try {
      EnginePlan e = plan_engine(c, model);
      if (!best || e.arena.total_bytes < best->arena.total_bytes) best = std::move(e);
    } catch (const std::exception&) {
      // a shape the engine refuses whatever the budget: plan_resources reports that error itself
    }
  }
  return best;
}

void plan_as_gpu(TrainConfig& cfg, const HardwareProfile& hw) {
  cfg.device.backend = "cpu";
  cfg.device.copy_bandwidth_gbps = hw.link_h2d / 1e9;
}

namespace {

// device.max_vram_gb above the device, or the arena with the backend's side above it.
void add_device_limit_misfit(ResourcePlan& p, const TrainConfig& cfg, double budget, double device_limit) {
  if (device_limit > 0 && budget > device_limit) {
    p.misfits.push_back({"device", budget, device_limit,
                         cfg.device_budget_name().substr(0, cfg.device_budget_name().find('=')),
                         cfg.device_budget_name() + " asks for more than the device's " + gib(device_limit) +
                             ": lower it to at most " + gib(device_limit)});
  } else if (device_limit > 0 && p.engine && p.device_bytes + p.device_side_bytes > device_limit) {
    const std::string key = cfg.device_budget_name().substr(0, cfg.device_budget_name().find('='));
    p.misfits.push_back({"device", p.device_bytes + p.device_side_bytes, device_limit, key,
                         "the arena (" + gib(p.device_bytes) +
                             ") with the CUDA ops' scratch and the backend's reserve (" + gib(p.device_side_bytes) +
                             ") is more than the device's " + gib(device_limit) + ": lower " + key + " by " +
                             gib(p.device_bytes + p.device_side_bytes - device_limit)});
  }
}

// The budget misfit's fix: the least the run takes and which key the config fixed beyond it.
void explain_least_device(ResourcePlan& p, Misfit& m, const TrainConfig& cfg, const ModelConfig& model, double budget,
                          double device_limit) {
  // What the run takes at the least (the smallest tiles, boundaries off the device, the fewest
  // slots): the budget it needs, or how far over the device it is.
  if (const auto least = least_device_plan(cfg, model)) {
    p.least_device_bytes = static_cast<double>(least->arena.total_bytes);
    m.need = p.least_device_bytes;
    const std::string settings =
        "device.seq_tile=" + std::to_string(least->seq_tile) + " device.keep_intermediates=" +
        (least->boundaries == BoundaryPlacement::mapped ? "boundary_mapped" : "boundary_host") +
        (least->keys_values == KeysValues::mapped ? " device.attention_kv=host" : "") +
        " device.weight_slots=2 device.grad_slots=1: workspace " +
        gib(static_cast<double>(least->workspace_floats) * 4.0);
    if (p.least_device_bytes <= budget) {
      // The budget holds the least plan: what the config fixed beyond it is the key to change.
      if (cfg.device.seq_tile > 0 && cfg.device.seq_tile != least->seq_tile)
        m.key = "device.seq_tile";
      else if (least->keys_values == KeysValues::mapped && cfg.device.attention_kv == "device")
        m.key = "device.attention_kv";
      else if (cfg.device.weight_slots > 2)
        m.key = "device.weight_slots";
      else if (cfg.device.grad_slots > 1)
        m.key = "device.grad_slots";
      m.message += "; it fits with " + settings + " (" + gib(p.least_device_bytes) + "): change " + m.key;
    } else if (device_limit > 0 && p.least_device_bytes > device_limit)
      m.message += "; the least this run takes is " + gib(p.least_device_bytes) + " (" + settings +
                   "), more than the device's " + gib(device_limit) +
                   ": lower data.seq_length or train.per_device_train_batch_size";
    else
      m.message += "; the least this run takes is " + gib(p.least_device_bytes) + " (" + settings + "): raise " +
                   m.key + " to at least that";
  } else {
    m.message += "; raise the budget, or lower train.per_device_train_batch_size or data.seq_length";
  }
}

// The engine's plan failed on the device: the misfit and the first change that fits.
void add_device_error_misfit(ResourcePlan& p, const TrainConfig& cfg, const ModelConfig& model,
                             const std::string& device_error, const std::string& device_key, bool budget_error,
                             double budget, double device_limit) {
  Misfit m{"device", 0, budget, device_key, device_error};
  if (cfg.keep_intermediates() != KeepIntermediates::boundary_host) {
    TrainConfig c2 = cfg;
    c2.device.keep_intermediates = "boundary_host";
    try {
      plan_engine(c2, model);
      m.key = "device.keep_intermediates";
      m.message += "; device.keep_intermediates=boundary_host fits (layer boundaries in host RAM)";
    } catch (const std::exception&) {
    }
  }
  if (budget_error && m.key != "device.keep_intermediates")
    explain_least_device(p, m, cfg, model, budget, device_limit);
  p.misfits.push_back(m);
}

// More host RAM than the limit: the misfit, the first change that fits as its key, the others as alternatives.
void add_host_misfit(ResourcePlan& p, const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& x,
                     double host_limit, const std::string& host_source) {
  Misfit m{"host RAM", p.host_peak_rss_bytes, host_limit, "", ""};
  std::ostringstream why;
  why << "host RAM: the run needs " << gib(p.host_peak_rss_bytes) << " (" << gib(p.host_bytes)
      << " allocated by the engine + " << gib(process_baseline_bytes()) << " the process itself), " << host_source
      << " is " << gib(host_limit);
  // The first change that fits names the key; the others are listed as alternatives.
  std::vector<std::pair<std::string, std::string>> options;
  auto try_change = [&](const std::string& key, const std::string& text, const TrainConfig& c2, const PlanExtras& x2) {
    const double need = host_need(c2, model, x2) + process_baseline_bytes();
    options.emplace_back(key, text + " needs " + gib(need) + (need <= host_limit ? " (fits)" : " (still too much)"));
    if (need <= host_limit && m.key.empty()) m.key = key;
  };
  if (cfg.train.bf16 && !cfg.split_masters() && cfg.train.offload_dir.empty() && !cfg.train.offload_params &&
      cfg.optimizer_compression() == OptimizerCompression::none) {
    // Exact, and no slower: the masters as the bf16 copy + low halves.
    TrainConfig c2 = cfg;
    c2.train.master_weights = "split";
    try_change("train.master_weights", "train.master_weights=split (exact fp32 masters in 4 bytes/parameter)", c2, x);
  }
  if (!cfg.stage_gradients() && cfg.stage_gradients_unsupported().empty()) {
    // Exact too; with clipping it costs a second forward and backward per step.
    TrainConfig c2 = cfg;
    c2.train.gradient_buffer = "stage";
    const std::string passes = cfg.train.max_grad_norm > 0 ? ", a second forward and backward per step for the clip"
                                                           : ", one pass without clipping";
    try_change("train.gradient_buffer",
               "train.gradient_buffer=stage (no gradient accumulators: 4 bytes/parameter less" + passes + ")", c2, x);
  }
  if (cfg.train.offload_dir.empty()) {
    TrainConfig c2 = cfg;
    c2.train.offload_dir = "/path/on/nvme";
    try_change("train.offload_dir", "train.offload_dir=DIR (Adam moments in files)", c2, x);
    c2.train.optimizer_compression = "int8";
    try_change("train.optimizer_compression", "train.offload_dir=DIR with train.optimizer_compression=int8", c2, x);
  } else if (!cfg.train.offload_params) {
    TrainConfig c2 = cfg;
    c2.train.offload_params = true;
    c2.train.bf16 = true;  // offload_params keeps only the bf16 compute copy in RAM
    try_change("train.offload_params",
               std::string("train.offload_params=true (fp32 masters in files too") +
                   (cfg.train.bf16 ? ")" : ", with train.bf16=true)"),
               c2, x);
  }
  if (cfg.optimizer_compression() == OptimizerCompression::none) {
    TrainConfig c2 = cfg;
    c2.train.optimizer_compression = "int8";
    try_change("train.optimizer_compression", "train.optimizer_compression=int8 (moments ~2 bytes/parameter, lossy)",
               c2, x);
  }
  if (p.engine && p.engine->host_boundary_bytes > 0) {
    // The activations in host RAM grow linearly in the sequence: the longest that fits beside the rest.
    const double acts = static_cast<double>(p.engine->devices) * static_cast<double>(p.engine->host_boundary_bytes);
    const double rest = p.host_peak_rss_bytes - acts;
    if (rest < host_limit) {
      const auto longest =
          static_cast<long long>(static_cast<double>(cfg.data.seq_length) * (host_limit - rest) / acts);
      options.emplace_back("data.seq_length", "data.seq_length of about " + std::to_string(longest) +
                                                  " tokens or fewer fits (the activations in host RAM, " + gib(acts) +
                                                  ", grow linearly in it)");
      if (m.key.empty()) m.key = "data.seq_length";
    }
  }
  if (m.key.empty()) m.key = "plan.host_ram_gb";
  why << "; fix: " << m.key;
  for (const auto& [k, t] : options) why << "; " << t;
  if (m.key == "plan.host_ram_gb") why << "; nothing here fits: a host with more RAM or a smaller model";
  m.message = why.str();
  p.misfits.push_back(m);
}

// More disk than the limit.
void add_disk_misfit(ResourcePlan& p, const TrainConfig& cfg, double disk_limit, const std::string& disk_source) {
  Misfit m{"disk", p.disk_bytes, disk_limit, "train.offload_dir", ""};
  std::ostringstream why;
  why << "disk: the offload files need " << gib(p.disk_bytes) << ", " << disk_source << " is " << gib(disk_limit)
      << "; fix: train.offload_dir on a larger drive";
  if (cfg.optimizer_compression() != OptimizerCompression::int8) {
    m.key = "train.optimizer_compression";
    why.str("");
    why << "disk: the offload files need " << gib(p.disk_bytes) << ", " << disk_source << " is " << gib(disk_limit)
        << "; fix: train.optimizer_compression=int8 (about a quarter of the bytes) or train.offload_dir on a larger "
           "drive";
  }
  m.message = why.str();
  p.misfits.push_back(m);
}

}  // namespace

ResourcePlan plan_resources(const TrainConfig& asked, const ModelConfig& model, const PlanExtras& x, double host_limit,
                            const std::string& host_source, double disk_limit, const std::string& disk_source,
                            double device_limit, const EnginePlan* run_plan) {
  // The engine's own choices that weigh host RAM (auto's all_mapped) weigh the RAM planned for, not
  // this machine's.
  TrainConfig cfg = asked;
  if (cfg.plan.host_ram_gb <= 0 && host_limit > 0) cfg.plan.host_ram_read_bytes = host_limit;
  std::string device_error, device_key;
  bool budget_error = false;
  ResourcePlan p = plan_once(cfg, model, x, &device_error, &device_key, &budget_error, run_plan);
  p.host_limit = host_limit;
  p.disk_limit = disk_limit;
  p.host_limit_source = host_source;
  p.disk_limit_source = disk_source;
  const double budget = static_cast<double>(cfg.device_budget_bytes());
  add_device_limit_misfit(p, cfg, budget, device_limit);
  if (!device_error.empty())
    add_device_error_misfit(p, cfg, model, device_error, device_key, budget_error, budget, device_limit);
  if (host_limit > 0 && p.host_peak_rss_bytes > host_limit) add_host_misfit(p, cfg, model, x, host_limit, host_source);
  if (disk_limit > 0 && p.disk_bytes > disk_limit) add_disk_misfit(p, cfg, disk_limit, disk_source);
  return p;
}

std::string describe_resources(const ResourcePlan& p) {
  std::ostringstream out;
  out << "bytes per tier (from the engine's own sizing functions):\n";
  for (const char* tier : {"device", "host RAM", "disk"}) {
    double total = 0;
    for (const auto& b : p.bytes)
      if (b.tier == tier) total += b.bytes;
    if (total == 0 && std::string(tier) == "disk") {
      out << "  disk: nothing (no train.offload_dir)\n";
      continue;
    }
    out << "  " << tier << ": " << gib(total);
    if (std::string(tier) == "host RAM")
      out << " (predicted peak resident memory " << gib(p.host_peak_rss_bytes) << " with the process's own "
          << gib(process_baseline_bytes()) << ")";
    if (std::string(tier) == "host RAM" && p.host_limit > 0)
      out << " of " << gib(p.host_limit) << " (" << p.host_limit_source << ")";
    if (std::string(tier) == "disk" && p.disk_limit > 0)
      out << " of " << gib(p.disk_limit) << " (" << p.disk_limit_source << ")";
    out << "\n";
    if (std::string(tier) == "host RAM" && p.pinned_bytes > 0)
      out << "    (" << gib(p.pinned_bytes)
          << " of it pinned for the GPU's copies: the tiles, host boundaries and gradient landing buffers, each at "
             "its exact size)\n";
    for (const auto& b : p.bytes)
      if (b.tier == tier) out << "    " << gib(b.bytes) << "  " << b.what << "\n";
  }
  out << "where each state lives:\n";
  for (const auto& h : p.homes) out << "  " << h << "\n";
  if (p.misfits.empty()) {
    out << "fits: yes\n";
  } else {
    out << "DOES NOT FIT:\n";
    for (const auto& m : p.misfits) out << "  [" << m.tier << "] " << m.message << "\n";
  }
  return out.str();
}

std::string check_run_fits(const TrainConfig& cfg, const ModelConfig& model, const PlanExtras& extras,
                           const EnginePlan* run_plan) {
  const double host = cfg.host_ram_bytes();
  const std::string host_source = cfg.host_ram_source();
  double disk = 0;
  std::string disk_source;
  if (!cfg.train.offload_dir.empty()) {
    disk = cfg.plan.disk_gb > 0 ? cfg.plan.disk_gb * 1073741824.0 : free_disk_bytes(cfg.train.offload_dir);
    disk_source = cfg.plan.disk_gb > 0 ? "plan.disk_gb" : "the free space under " + cfg.train.offload_dir;
  }
  const ResourcePlan p = plan_resources(cfg, model, extras, host, host_source, disk, disk_source, 0.0, run_plan);
  std::string out;
  for (const auto& m : p.misfits) {
    if (m.tier == "device") continue;  // plan_engine's own error, raised by the engine itself
    out += (out.empty() ? "" : "\n") + m.message;
  }
  return out;
}

}  // namespace mt::plan
