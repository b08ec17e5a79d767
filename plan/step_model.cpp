#include "plan/step_model.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "data/loader.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/param_layout.hpp"
#include "kernels/stage_api.hpp"
#include "kernels/stages.hpp"
#include "plan/resource_plan.hpp"
#include "plan/schedule.hpp"

namespace mt::plan {

namespace {

// What a token computes with (a mixture of experts: its top-k experts, not all of them).
double matmul_params_of_layer(const ModelConfig& model) {
  return static_cast<double>(layer_active_param_count(model, 0));
}

// The fastest of several runs after a warm-up (first-touch pages, thread pools, kernel choice): on a
// busy machine the fastest run is the one least disturbed. Ops over a second run fewer times.
double best_of(const std::function<void()>& fn, int reps) {
  auto once = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double best = once();
  best = std::min(best, once());
  for (int i = 2; i < reps && best < 1.0; ++i) best = std::min(best, once());
  return best;
}

// One resource serving its tasks in program order.
struct Resource {
  double free = 0.0;
  double busy = 0.0;  // within the measured window
  double run(double ready, double duration, bool count) {
    const double start = std::max(free, ready);
    free = start + duration;
    if (count) busy += duration;
    return free;
  }
};

// Shared cores (the CPU backend): the work of threads other than compute's (the optimizer, the
// collector, the NVMe tier's checksums and system calls), as a union of intervals, during which compute
// makes no progress. That work runs when its inputs are there, at its measured speed, and compute fills
// the time around it: an update that waits for an NVMe read leaves the cores to the next step's forward
// (a single in-order resource would make compute wait through the optimizer's read waits as well).
// Intervals may arrive out of time order (a read's checksums are placed at the disk's time).
class CpuShare {
 public:
  void add(double start, double end) {
    if (!(end > start)) return;
    auto it = busy_.upper_bound(start);
    if (it != busy_.begin() && std::prev(it)->second >= start) --it;  // the one before touches: merge
    while (it != busy_.end() && it->first <= end) {
      start = std::min(start, it->first);
      end = std::max(end, it->second);
      it = busy_.erase(it);
    }
    busy_.emplace(start, end);
  }
  // When `work` seconds of compute that start at `start` end, paused during the intervals.
  double finish(double start, double work) const {
    auto it = busy_.upper_bound(start);
    if (it != busy_.begin() && std::prev(it)->second > start) --it;  // compute starts inside it
    double t = start;
    for (; it != busy_.end(); ++it) {
      const auto [a, b] = *it;
      if (a >= t + work) break;
      if (a > t) work -= a - t;
      t = std::max(t, b);
    }
    return t + work;
  }

 private:
  std::map<double, double> busy_;  // start -> end, disjoint
};

}  // namespace

double model_flops_per_step(const ModelConfig& model, double tokens, double seq) {
  double embedding = 0;
  for (const auto& t : stage_layout(model, 0).tensors) embedding += static_cast<double>(t.numel);
  const bool tied = model.tie_word_embeddings || model.is_gpt2();
  const double params = static_cast<double>(active_param_count(model)) - embedding +
                        (tied ? static_cast<double>(model.vocab_size * model.hidden_size) : 0.0);
  return 6.0 * params * tokens + 6.0 * static_cast<double>(model.num_hidden_layers * model.q_dim()) * seq * tokens;
}

LayerFlops layer_flops(const ModelConfig& model, std::int64_t batch, std::int64_t seq,
                       double attention_backward_products, double document_pairs) {
  const double B = static_cast<double>(batch), T = static_cast<double>(seq);
  // The causal pairs of a sequence, averaged over the layers: T (T + 1) / 2, or within a sliding window W
  // (gpt-oss's, Mistral's) W (W + 1) / 2 + (T - W) W once T > W (the kernels skip the blocks outside it).
  double pairs = 0;
  for (std::int64_t l = 0; l < model.num_hidden_layers; ++l) {
    const double W = model.layer_slides(l) ? static_cast<double>(model.sliding_window) : 0.0;
    const double layer = W > 0 && T > W ? W * (W + 1.0) / 2.0 + (T - W) * W : T * (T + 1.0) / 2.0;
    pairs += document_pairs > 0 ? std::min(layer, document_pairs) : layer;
  }
  pairs /= static_cast<double>(std::max<std::int64_t>(1, model.num_hidden_layers));
  // One product over those pairs of every query head: 2 x head_dim FLOPs a pair.
  const double product = 2.0 * static_cast<double>(model.q_dim()) * B * pairs;
  LayerFlops f;
  f.gemm_forward = 2.0 * matmul_params_of_layer(model) * B * T;
  f.attention_forward = kAttentionForwardProducts * product;
  f.attention_backward = attention_backward_products * product;
  return f;
}

OpTimes op_times_from_flops(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan,
                            const HardwareProfile& hw) {
  const double tokens = static_cast<double>(plan.batch * plan.seq);
  const double rate =
      (cfg.precision() == Precision::bf16 ? hw.device_flops_bf16 : hw.device_flops_fp32) * hw.achievable_fraction;
  double document_pairs = 0;  // documents: the shards' own pairs (the stream's when they cannot be read)
  if (cfg.data.packing == "documents") try {
      document_pairs = data::document_pairs_per_window({cfg.data.train_files}, static_cast<int>(plan.seq));
    } catch (const data::DataError&) {
    }
  const LayerFlops f = layer_flops(model, plan.batch, plan.seq, kCudaAttentionBackwardProducts, document_pairs);
  const bool recompute = plan.mode == ActivationMode::recompute;
  OpTimes t;
  t.layer_forward = f.forward() / rate;
  t.layer_backward = f.backward(recompute, plan.attention) / rate;
  t.layer_backward_kept = f.backward(false) / rate;
  t.attention_forward = f.attention_forward / rate;
  t.attention_backward = (f.attention_backward +
                          (recompute && plan.attention == AttentionOutputs::recomputed ? f.attention_forward : 0.0)) /
                         rate;
  t.head = 6.0 * static_cast<double>(model.vocab_size * model.hidden_size) * tokens / rate;
  // The embedding is a gather and a scatter: memory-bound, hidden_size floats per token each way.
  const double rows = tokens * static_cast<double>(model.hidden_size) * 8.0;
  t.embed_forward = t.embed_backward = hw.device_memory_bytes > 0 ? rows / 1e12 : 0.0;
  char b[160];
  std::snprintf(b, sizeof b, "FLOPs at %.0f%% of %.0f TFLOP/s (%s, %s)", hw.achievable_fraction * 100,
                rate / hw.achievable_fraction / 1e12, cfg.precision() == Precision::bf16 ? "bf16" : "fp32",
                hw.key.c_str());
  t.source = b;
  return t;
}

namespace {

// The op times at sequence length T (the plan's batch, mode and tiles).
OpTimes measure_at(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan, std::int64_t T) {
  const Precision prec = cfg.precision();
  const std::int64_t B = plan.batch, L = model.num_hidden_layers;
  ComputeCtx ctx;
  ctx.threads = std::max(1, plan.threads.blas);
  ctx.precision = prec;
  ctx.seq_tile = plan.seq_tile;  // the tiled layers and head when the plan runs tiles (long context)
  // Parameters as the engine streams them: fp32, or the bf16 compute copy.
  auto params_of = [&](std::int64_t stage, std::vector<float>& fp32, std::vector<bf16_t>& half) -> const void* {
    fp32.assign(stage_layout(model, stage).total_floats, 0.0f);
    init_stage_params(model, stage, 1, fp32.data(), ctx.threads);
    if (prec != Precision::bf16) return fp32.data();
    half.resize(fp32.size());
    cpu::to_bf16(fp32.data(), half.data(), fp32.size(), ctx.threads);
    return half.data();
  };
  std::vector<float> p0, p1, ph;
  std::vector<bf16_t> h0, h1, hh;
  const void* embed = params_of(0, p0, h0);
  // A layer with experts and full attention stands for every layer (a Qwen3-MoE dense layer and a gpt-oss
  // sliding layer are cheaper: an upper bound).
  std::int64_t measured = 0;
  auto heaviest = [&](std::int64_t l) { return (!model.is_moe() || model.layer_is_moe(l)) && !model.layer_slides(l); };
  while (measured + 1 < L && !heaviest(measured)) ++measured;
  if (!heaviest(measured)) measured = 0;
  while (measured + 1 < L && model.is_moe() && !model.layer_is_moe(measured)) ++measured;
  const ModelConfig lm = model.layer_config(measured);
  const void* layer = params_of(measured + 1, p1, h1);
  const void* head = params_of(L + 1, ph, hh);
  const bool tied = model.tie_word_embeddings || model.is_gpt2();
  const std::size_t hidden = static_cast<std::size_t>(B * T * model.hidden_size);
  std::vector<float> x(hidden), y(hidden), dy(hidden, 1e-3f), dx(hidden);
  std::vector<token_t> tokens(static_cast<std::size_t>(B * T));
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<token_t>((i * 7919) % model.vocab_size);
  std::vector<float> g0(p0.size()), g1(p1.size()), gh(ph.size());
  std::vector<float> ws(std::max(stage_workspace_floats(model, 1, B, T, plan.mode, prec, plan.seq_tile),
                                 stage_workspace_floats(model, L + 1, B, T, plan.mode, prec, plan.seq_tile)));
  std::vector<float> saved(plan.mode == ActivationMode::keep ? layer_saved_floats(model, B, T) : 0);
  LayerBuffers lb;  // the measured layer's
  lb.x_in = x.data();
  lb.x_out = y.data();
  lb.dy = dy.data();
  lb.dx = dx.data();
  lb.grads = g1.data();
  lb.saved = saved.empty() ? nullptr : saved.data();
  lb.workspace = ws.data();
  OpTimes t;
  t.embed_forward = best_of([&] { embedding_forward(model, embed, tokens.data(), B, T, x.data(), ctx); }, 6);
  t.layer_forward = best_of([&] { layer_forward(lm, layer, {B, T}, lb, ctx); }, 6);
  // AttentionOutputs::kept_mapped: the tiled backward reads the forward's attention output and log-sum-exp.
  // Timed so in tiles even where this T fits the plan's one tile (the shorter length the long-context
  // extrapolation measures), so both lengths time the backward the engine runs.
  const std::int64_t kept_tile = plan.attention == AttentionOutputs::recomputed ? 0
                                 : layer_runs_tiled(lm, T, plan.seq_tile)       ? plan.seq_tile
                                                                          : std::max<std::int64_t>(64, T / 2 / 64 * 64);
  if (kept_tile > 0 && layer_runs_tiled(lm, T, kept_tile)) {
    cpu::CpuOps ops(prec, ctx.threads);
    std::vector<float> att(layer_attention_floats(lm, B, T, kept_tile));
    std::vector<float> tiled_ws(layer_workspace_floats(lm, B, T, ActivationMode::recompute, prec, kept_tile));
    LayerBuffers tb = lb;
    tb.saved = nullptr;
    tb.workspace = tiled_ws.data();
    tb.attention = att.data();
    mt::layer_forward(ops, lm, layer, {B, T}, tb, kept_tile);
    t.layer_backward = best_of([&] { mt::layer_backward(ops, lm, layer, {B, T}, tb, kept_tile); }, 6);
  } else {
    t.layer_backward = best_of([&] { layer_backward(lm, layer, {B, T}, lb, ctx); }, 6);
  }
  if (plan.mode == ActivationMode::recompute && plan.kept_layers > 0) {  // a kept layer: forward saves, no recompute
    std::vector<float> kept(layer_saved_floats(model, B, T));
    LayerBuffers kb = lb;
    kb.saved = kept.data();
    layer_forward(lm, layer, {B, T}, kb, ctx);
    t.layer_backward_kept = best_of([&] { layer_backward(lm, layer, {B, T}, kb, ctx); }, 6);
  } else {
    t.layer_backward_kept = t.layer_backward;
  }
  HeadBuffers hb;
  hb.x_in = y.data();
  hb.targets = tokens.data();
  hb.dx = dx.data();
  hb.head_grads = gh.data();
  hb.embed_grads = tied ? g0.data() : nullptr;
  hb.workspace = ws.data();
  t.head = best_of([&] { head_forward_backward(model, head, tied ? embed : nullptr, {B, T}, hb, ctx); }, 6);
  t.embed_backward = best_of([&] { embedding_backward(model, tokens.data(), B, T, dx.data(), g0.data(), ctx); }, 6);
  t.source = std::to_string(ctx.threads) + " threads, " + (prec == Precision::bf16 ? "bf16" : "fp32") + ", " +
             (plan.mode == ActivationMode::keep                 ? "intermediates kept"
              : plan.attention == AttentionOutputs::kept_mapped ? "recompute, attention output kept"
                                                                : "recompute") +
             (plan.seq_tile > 0 ? ", sequence tiles of " + std::to_string(plan.seq_tile) + " tokens" : "");
  return t;
}

double causal_pairs(std::int64_t T) { return static_cast<double>(T) * (static_cast<double>(T) + 1.0) / 2.0; }

}  // namespace

double extrapolate_layer_time(double t1, std::int64_t T1, double t2, std::int64_t T2, std::int64_t T) {
  const double x1 = static_cast<double>(T1), x2 = static_cast<double>(T2);
  const double p1 = causal_pairs(T1), p2 = causal_pairs(T2);
  const double det = x1 * p2 - x2 * p1;
  double a = (t1 * p2 - t2 * p1) / det, b = (x1 * t2 - x2 * t1) / det;
  if (b < 0) b = 0, a = t2 / x2;  // noise: no measurable attention share
  if (a < 0) a = 0, b = t2 / p2;  // noise: all of it attention
  return a * static_cast<double>(T) + b * causal_pairs(T);
}

OpTimes measure_op_times(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan,
                         std::int64_t max_measured_tokens) {
  const std::int64_t T = plan.seq;
  if (T <= max_measured_tokens || max_measured_tokens < 2) {
    OpTimes t = measure_at(cfg, model, plan, T);
    t.source = "measured: the engine's stage kernels at this shape (" + t.source + ")";
    return t;
  }
  const std::int64_t T2 = max_measured_tokens, T1 = max_measured_tokens / 2;
  const OpTimes a = measure_at(cfg, model, plan, T1), b = measure_at(cfg, model, plan, T2);
  auto layer = [&](double OpTimes::*op) { return extrapolate_layer_time(a.*op, T1, b.*op, T2, T); };
  const double linear = static_cast<double>(T) / static_cast<double>(T2);
  OpTimes t;
  t.layer_forward = layer(&OpTimes::layer_forward);
  t.layer_backward = layer(&OpTimes::layer_backward);
  t.layer_backward_kept = layer(&OpTimes::layer_backward_kept);
  t.head = b.head * linear;
  t.embed_forward = b.embed_forward * linear;
  t.embed_backward = b.embed_backward * linear;
  t.source = "measured: the engine's stage kernels at " + std::to_string(T1) + " and " + std::to_string(T2) +
             " tokens a sequence (" + b.source + "), extrapolated to " + std::to_string(T) +
             ": per-token work linear, attention's causal pairs quadratic";
  return t;
}

namespace {

// The costs of one stage's transfers and host work on `hw`, seconds.
struct StageCosts {
  StageCosts(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan, const HardwareProfile& hw,
             std::int64_t micro_batches)
      : hw(hw), S(plan.stages), M(micro_batches), stage_grads(plan.stage_gradients), passes(plan.gradient_passes) {
    for (std::int64_t s = 0; s < S; ++s) floats.push_back(static_cast<double>(stage_layout(model, s).total_floats));
    bf16 = cfg.precision() == Precision::bf16;
    split = cfg.split_masters();
    h2d = hw.link_h2d, d2h = hw.link_d2h;
    if (hw.shared_cores && cfg.copy_bandwidth_bytes_per_s() > 0) {
      h2d = std::min(h2d, cfg.copy_bandwidth_bytes_per_s());
      d2h = std::min(d2h, cfg.copy_bandwidth_bytes_per_s());
    }
    wbytes_per = static_cast<double>(bytes_per_param(cfg.precision()));
    // CPU backend without a modelled link: weights are mapped, not copied, micro-batch 0's gradients
    // are written into the tile by compute and later ones summed from the staging slot in one pass
    // (Backend::shares_host_memory, Context::grads_in_place).
    mapped = hw.shared_cores && cfg.device_shares_host_memory();
    in_place = mapped && cfg.device.gpus <= 1 && !stage_grads;
    // NVMe: each stage's moments (and with train.offload_params its masters) read before and written after
    // its update.
    tier = !cfg.train.offload_dir.empty();
    const double moment_bytes_per = cfg.optimizer_compression() == OptimizerCompression::int8       ? 2.0 + 16.0 / 256
                                    : cfg.optimizer_compression() == OptimizerCompression::lossless ? 8.0 * 0.8
                                                                                                    : 8.0;
    nvme_per = (tier ? moment_bytes_per : 0.0) + (cfg.train.offload_params ? 4.0 : 0.0);
    disk_r = hw.disk_read > 0 ? hw.disk_read : 2e9, disk_w = hw.disk_write > 0 ? hw.disk_write : 1e9;
    staging = static_cast<int>(cfg.train.offload_staging_stages);
    reads = tier && S > staging;  // a store whose slots hold every stage reads nothing
    coded = cfg.optimizer_compression() != OptimizerCompression::none;
  }

  double load(std::int64_t s) const { return floats[s] * wbytes_per / h2d; }
  double out(std::int64_t s) const { return floats[s] * 4.0 / d2h; }
  // The collector: read staged + acc, write acc (nothing for an in-place micro-batch 0), and after the
  // last micro-batch the sum of squares reads the accumulator. Stage gradients: one micro-batch
  // accumulates nothing, only the sum of squares read from the slot (once, in the first pass); several
  // are summed into a stage accumulator, and the first pass's last reads it for the sum of squares.
  // `mb`: the schedule micro-batch (pass * M + data micro-batch).
  double accumulate(std::int64_t s, std::int64_t mb) const {
    const bool first_pass = mb < M, data_last = mb % M + 1 == M;
    if (stage_grads && M == 1) return first_pass ? floats[s] * 4.0 / hw.host_mem : 0.0;
    if (stage_grads) return floats[s] * (12.0 + (first_pass && data_last ? 4.0 : 0.0)) / hw.host_mem;
    return floats[s] * ((in_place && mb == 0 ? 0.0 : 12.0) + (mb + 1 == M * passes ? 4.0 : 0.0)) / hw.host_mem;
  }
  // AdamW reads p, g, m, v and writes p, m, v (28 bytes per parameter), + the bf16 copy; split masters
  // read and write the two halves in p's place (28 in all).
  double optimize(std::int64_t s) const {
    return hw.adamw_params_per_s > 0 ? floats[s] / hw.adamw_params_per_s
                                     : floats[s] * (28.0 + (bf16 && !split ? 2.0 : 0.0)) / hw.host_mem;
  }
  double read(std::int64_t s) const { return floats[s] * nvme_per / disk_r; }
  double write(std::int64_t s) const { return floats[s] * nvme_per / disk_w; }
  // The tier's CPU work per transfer (the probe's CPU seconds per byte through the tier's own code: block
  // checksums and system calls, on the store's worker and I/O threads), inside the transfer's time: a
  // write checksums its blocks before it writes, a read verifies them after it has read.
  double read_cpu(std::int64_t s) const { return floats[s] * nvme_per * hw.disk_read_cpu_s_per_byte; }
  double write_cpu(std::int64_t s) const { return floats[s] * nvme_per * hw.disk_write_cpu_s_per_byte; }
  // A moment codec (train.optimizer_compression): a stage's moments are encoded after each update and,
  // when the stages outnumber the slots, decoded before it (this machine's measured rates; on shared
  // cores the store's workers take the cores like the optimizer).
  double encode(std::int64_t s) const {
    return coded && hw.codec_encode_params_per_s > 0 ? floats[s] / hw.codec_encode_params_per_s : 0.0;
  }
  double decode(std::int64_t s) const {
    return coded && S > staging && hw.codec_decode_params_per_s > 0 ? floats[s] / hw.codec_decode_params_per_s : 0.0;
  }

  const HardwareProfile& hw;
  std::int64_t S, M;
  bool stage_grads;
  std::int64_t passes;
  std::vector<double> floats;  // per stage
  bool bf16 = false, split = false, mapped = false, in_place = false, tier = false, reads = false, coded = false;
  double h2d = 0, d2h = 0, wbytes_per = 0, nvme_per = 0, disk_r = 0, disk_w = 0;
  int staging = 0;
};

// The engine's step as a discrete-event simulation: the schedule's ops in order on the device, loads on
// the link in, gradients out, the collector and the optimizer on the host, moments on NVMe.
class StepSimulator {
 public:
  StepSimulator(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan, const HardwareProfile& hw,
                const OpTimes& ops)
      : model_(model),
        plan_(plan),
        hw_(hw),
        ops_(ops),
        // Several ranks: each runs its own share of the step's micro-batches (the reduction between ranks
        // is not modelled here); the step's tokens are every rank's.
        sched_(model, plan.micro_batches / std::max(1, plan.ranks), plan.order, plan.boundaries, plan.gradient_passes),
        c_(cfg, model, plan, hw, plan.micro_batches / std::max(1, plan.ranks)),
        boundary_bytes_(static_cast<double>(plan.hidden_floats) * 4.0),
        ahead_(std::max(1, c_.staging - 2)),
        // The optimizer's visiting order: forward with clipping (after every norm), else as gradients complete.
        clip_(cfg.train.max_grad_norm > 0 && !plan.stage_gradients),
        wslots_(static_cast<std::size_t>(plan.weight_slots)),
        gslots_(static_cast<std::size_t>(plan.grad_slots), 0.0),
        updated_(static_cast<std::size_t>(plan.stages), 0.0) {}

  // Simulates step t (counting its busy and wait times into `p` when `count`); returns when it ends.
  double step(int t, bool count, StepPrediction& p);

 private:
  struct Slot {
    std::int64_t stage = -1, version = -1;
    double free = 0.0, last = 0.0;
  };
  // One step's optimizer state.
  struct StepState {
    int t = 0;
    bool count = false;
    std::vector<double> stage_done;  // last accumulation of the stage
    std::vector<int> remaining;      // gradient-producing ops of the stage still to run
    double opt_end = 0.0;
    std::vector<double> read_done;
    std::vector<double> acquired;  // when the optimizer asked for each stage of `order` (no clipping)
    std::vector<std::int64_t> order;
  };

  static bool makes_gradients(OpKind k) {
    return k == OpKind::layer_backward || k == OpKind::head || k == OpKind::embed_backward;
  }
  double host_run(double ready, double duration, bool cnt) {
    const double end = host_.run(ready, duration, cnt);
    if (hw_.shared_cores) shared_.add(end - duration, end);
    return end;
  }
  // More CPU than the transfer's time is several threads at once: the cores are taken throughout.
  void tier_cpu(double start, double duration, double transfer) {
    if (hw_.shared_cores) shared_.add(start, start + std::min(duration, transfer));
  }
  // A copy on `link` of `bytes`. On shared cores the copy engine is a memcpy on a thread of its own, and
  // compute's cores run it: a copy that starts while compute is busy delays compute by its CPU time
  // (the memcpy time, whatever DeviceSection::copy_bandwidth_gbps paces the link to). Compute's team waits for
  // the thread that gave up its core, so the delay is the whole copy, not a share of it.
  double copy(Resource& link, double ready, double bytes, double rate, double cpu_rate, bool cnt) {
    const double end = link.run(ready, bytes / rate, cnt);
    if (hw_.shared_cores && dev_.free >= end - bytes / rate) dev_.free += bytes / cpu_rate;
    return end;
  }
  void update(StepState& st, std::int64_t s, double ready, StepPrediction& p);
  void read(StepState& st, std::int64_t s, double ready, StepPrediction& p);
  double load_inputs(const Op& op, int t, std::int64_t g, bool count, bool& ready_gated, StepPrediction& p);
  double op_duration(const Op& op) const;
  void run_op(StepState& st, const Pos& pos, std::int64_t g, StepPrediction& p);
  void gradients_out(StepState& st, const Pos& pos, const Op& op, double end, std::size_t gslot, StepPrediction& p);

  const ModelConfig& model_;
  const EnginePlan& plan_;
  const HardwareProfile& hw_;
  const OpTimes& ops_;
  const Schedule sched_;
  const StageCosts c_;
  const double boundary_bytes_;
  const int ahead_;
  const bool clip_;
  Resource dev_, link_in_, link_out_, host_, nvme_;  // host: the collector's accumulation and the optimizer
  CpuShare shared_;                                  // hw.shared_cores: the host's work pauses compute
  std::vector<Slot> wslots_;
  std::vector<double> gslots_;
  std::vector<double> updated_;  // version ready (end of the stage's update)
  std::vector<double> compute_start_, compute_end_;
  double last_load_start_ = 0.0;
};

void StepSimulator::update(StepState& st, std::int64_t s, double ready, StepPrediction& p) {
  const auto si = static_cast<std::size_t>(s);
  const bool count = st.count;
  st.acquired.push_back(std::max(host_.free, ready));
  const double r = std::max(ready, st.read_done[si]);
  double start = std::max(host_.free, r);
  if (count) p.wait_nvme_s += std::max(0.0, st.read_done[si] - std::max(host_.free, ready));
  if (st.t > 0 && c_.decode(s) > 0) {  // step 0: fresh moments, nothing to decode
    start = host_run(start, c_.decode(s), count);
    if (count) p.optimizer_s += c_.decode(s), p.codec_s += c_.decode(s);
  }
  const double end = host_run(start, c_.optimize(s), count);
  if (count) p.optimizer_s += c_.optimize(s);
  updated_[si] = end;
  st.opt_end = std::max(st.opt_end, end);
  const double encoded = c_.encode(s) > 0 ? host_run(end, c_.encode(s), count) : end;
  if (count) p.optimizer_s += c_.encode(s), p.codec_s += c_.encode(s);
  if (c_.tier) {
    const double end_write = nvme_.run(encoded, c_.write(s), count);
    tier_cpu(end_write - c_.write(s), c_.write_cpu(s), c_.write(s));
    if (count) p.nvme_s += c_.write(s), p.tier_cpu_s += c_.write_cpu(s);
  }
}

// A read starts when the optimizer's acquire of the stage `ahead` before it opens the window (the store
// reads ahead of its last acquire only), and the disk is free.
void StepSimulator::read(StepState& st, std::int64_t s, double ready, StepPrediction& p) {
  if (!c_.reads || st.t == 0) return;  // step 0: fresh moments, nothing stored yet
  const double end_read = nvme_.run(ready, c_.read(s), st.count);
  st.read_done[static_cast<std::size_t>(s)] = end_read;
  tier_cpu(end_read - std::min(c_.read_cpu(s), c_.read(s)), c_.read_cpu(s), c_.read(s));
  if (st.count) p.nvme_s += c_.read(s), p.tier_cpu_s += c_.read_cpu(s);
}

// Loads, in op order, up to prefetch_depth + 1 ops ahead of compute; returns when the inputs are there.
// ready_gated: the last input waited for a stage's update (the optimizer), not the link.
double StepSimulator::load_inputs(const Op& op, int t, std::int64_t g, bool count, bool& ready_gated,
                                  StepPrediction& p) {
  double ready = 0.0;
  const double window =
      g - plan_.prefetch_depth - 1 >= 0 ? compute_start_[static_cast<std::size_t>(g - plan_.prefetch_depth - 1)] : 0.0;
  for (int k = 0; k < op.loads; ++k) {
    if (op.load_kind[k] == LoadKind::boundary) {
      const double start = std::max({link_in_.free, window, last_load_start_});
      last_load_start_ = start;
      ready = std::max(ready, copy(link_in_, start, boundary_bytes_, c_.h2d, hw_.link_h2d, count));
      if (count) p.h2d_s += boundary_bytes_ / c_.h2d;
      continue;
    }
    const std::int64_t s = op.load_stage[k];
    const std::int64_t version = t;
    Slot* slot = nullptr;
    for (auto& w : wslots_)
      if (w.stage == s && w.version == version) slot = &w;
    if (slot != nullptr) {  // still resident: no copy
      ready = std::max(ready, slot->last);
      slot->free = 1e300;  // held until this op ends
      continue;
    }
    slot = &*std::min_element(wslots_.begin(), wslots_.end(),
                              [](const Slot& a, const Slot& b) { return a.free < b.free; });
    const double version_ready = t > 0 ? updated_[static_cast<std::size_t>(s)] : 0.0;
    const double others = std::max({c_.mapped ? 0.0 : link_in_.free, slot->free, window, last_load_start_});
    const double start = std::max(others, version_ready);
    last_load_start_ = start;
    const double end =
        c_.mapped ? start : copy(link_in_, start, c_.floats[s] * c_.wbytes_per, c_.h2d, hw_.link_h2d, count);
    if (end >= ready) ready_gated = version_ready > others;
    if (count && !c_.mapped) p.h2d_s += c_.load(s);
    slot->stage = s;
    slot->version = version;
    slot->last = end;
    slot->free = 1e300;  // held until this op ends
    ready = std::max(ready, end);
  }
  return ready;
}

double StepSimulator::op_duration(const Op& op) const {
  switch (op.kind) {
    case OpKind::embed_forward:
      return ops_.embed_forward;
    case OpKind::layer_forward:
      return ops_.layer_forward;
    case OpKind::head:
    case OpKind::head_loss:
      return ops_.head;
    case OpKind::layer_backward:
      return op.stage > model_.num_hidden_layers - plan_.kept_layers ? ops_.layer_backward_kept : ops_.layer_backward;
    case OpKind::embed_backward:
      return ops_.embed_backward;
  }
  return 0.0;
}

// Compute: its inputs, and a gradient staging slot for an op that produces gradients.
void StepSimulator::run_op(StepState& st, const Pos& pos, std::int64_t g, StepPrediction& p) {
  const Op& op = sched_.op(pos);
  const bool count = st.count;
  bool ready_gated = false;
  const double ready = load_inputs(op, st.t, g, count, ready_gated, p);
  const bool grads = makes_gradients(op.kind);
  double need = ready;
  std::size_t gslot = 0;
  if (grads) {
    gslot = static_cast<std::size_t>(std::min_element(gslots_.begin(), gslots_.end()) - gslots_.begin());
    need = std::max(need, gslots_[gslot]);
  }
  const double dur = op_duration(op);
  const double start = std::max(dev_.free, need);
  if (count && start > dev_.free) {
    const double idle = start - dev_.free;
    if (grads && gslots_[gslot] >= ready)
      p.wait_grad_slot_s += idle;
    else if (ready_gated)
      p.wait_optimizer_s += idle;
    else
      p.wait_link_s += idle;
  }
  compute_start_.push_back(start);
  const double end = hw_.shared_cores ? shared_.finish(start, dur) : start + dur;
  dev_.free = end;
  if (count) dev_.busy += dur;
  compute_end_.push_back(end);
  if (count) p.compute_s += dur;
  // Slots used by this op are free again when it ends.
  for (int k = 0; k < op.loads; ++k)
    if (op.load_kind[k] == LoadKind::weights)
      for (auto& w : wslots_)
        if (w.stage == op.load_stage[k] && w.version == st.t) w.free = end;
  if (plan_.boundaries == BoundaryPlacement::host_ring && op.kind == OpKind::layer_forward &&
      op.stage < model_.num_hidden_layers) {
    copy(link_out_, end, boundary_bytes_, c_.d2h, hw_.link_d2h, count);
    if (count) p.d2h_s += boundary_bytes_ / c_.d2h;
  }
  if (grads) gradients_out(st, pos, op, end, gslot, p);
}

// A gradient copied out, accumulated, and the stage's update once its last gradient is in (no clipping).
void StepSimulator::gradients_out(StepState& st, const Pos& pos, const Op& op, double end, std::size_t gslot,
                                  StepPrediction& p) {
  const bool count = st.count;
  const std::int64_t s = op.stage;
  const auto si = static_cast<std::size_t>(s);
  const double copied = c_.mapped ? end : copy(link_out_, end, c_.floats[s] * 4.0, c_.d2h, hw_.link_d2h, count);
  const double acc = host_run(copied, c_.accumulate(s, pos.micro_batch), count);
  if (count) p.d2h_s += c_.mapped ? 0.0 : c_.out(s), p.accumulate_s += c_.accumulate(s, pos.micro_batch);
  gslots_[gslot] = acc;
  st.stage_done[si] = std::max(st.stage_done[si], acc);
  if (--st.remaining[si] != 0 || clip_) return;
  // Read when the acquire `ahead` stages earlier in this step's order opened the window (the first ones:
  // at the previous step's last acquires, long done).
  const std::size_t k = st.order.size();
  const auto ahead = static_cast<std::size_t>(ahead_);
  st.order.push_back(s);
  read(st, s, k >= ahead ? st.acquired[k - ahead] : 0.0, p);
  update(st, s, acc, p);
  if (c_.stage_grads && c_.M == 1) gslots_[gslot] = updated_[si];  // the slot held until then
}

double StepSimulator::step(int t, bool count, StepPrediction& p) {
  const std::int64_t S = plan_.stages;
  const std::int64_t len = sched_.length();
  StepState st;
  st.t = t;
  st.count = count;
  st.stage_done.assign(static_cast<std::size_t>(S), 0.0);
  st.remaining.assign(static_cast<std::size_t>(S), 0);
  st.read_done.assign(static_cast<std::size_t>(S), 0.0);
  for (std::int64_t i = 0; i < len; ++i) {
    const auto& op = sched_.op(sched_.at(t, i));
    if (makes_gradients(op.kind)) ++st.remaining[static_cast<std::size_t>(op.stage)];
  }
  // Reads ahead for this step's updates (every stage was written in the previous step).
  if (clip_)
    for (std::int64_t s = 0; s < S; ++s) st.order.push_back(s);
  if (clip_)
    for (int k = 0; k < ahead_ && k < S; ++k) read(st, k, 0.0, p);
  for (std::int64_t i = 0; i < len; ++i) run_op(st, sched_.at(t, i), static_cast<std::int64_t>(t) * len + i, p);
  if (clip_) {
    double norms = 0.0;  // every stage's sum of squares first
    for (double d : st.stage_done) norms = std::max(norms, d);
    const auto ahead = static_cast<std::size_t>(ahead_);
    for (std::size_t k = 0; k < st.order.size(); ++k) {
      if (k + ahead < st.order.size()) read(st, st.order[k + ahead], std::max(host_.free, norms), p);
      update(st, st.order[k], norms, p);
    }
  }
  return std::max(compute_end_.back(), st.opt_end);
}

}  // namespace

StepPrediction predict_step(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan,
                            const HardwareProfile& hw, const OpTimes& ops, const PlanExtras& /*extras*/, int steps) {
  steps = std::max(2, steps);
  // Stage gradients (train.gradient_buffer=stage): every pass is a schedule micro-batch (with clipping
  // the first only sums squares; the second replays the head and the backward), and each stage is
  // updated from its slot as its last pass completes.
  StepSimulator sim(cfg, model, plan, hw, ops);
  StepPrediction p;
  std::vector<double> step_end(static_cast<std::size_t>(steps), 0.0);
  for (int t = 0; t < steps; ++t) step_end[static_cast<std::size_t>(t)] = sim.step(t, t == steps - 1, p);
  p.steady_s = step_end[static_cast<std::size_t>(steps - 1)] - step_end[static_cast<std::size_t>(steps - 2)];
  p.step_s = (step_end[static_cast<std::size_t>(steps - 1)] - step_end[0]) / static_cast<double>(steps - 1);
  p.tokens = static_cast<double>(plan.batch * plan.seq * plan.micro_batches) *
             static_cast<double>(std::max<std::int64_t>(1, cfg.device.gpus));
  p.model_flops = model_flops_per_step(model, p.tokens, static_cast<double>(plan.seq));
  p.shared_cores = hw.shared_cores;
  return p;
}

std::string describe_step(const StepPrediction& p, const OpTimes& ops) {
  std::ostringstream out;
  char b[2048];
  std::snprintf(b, sizeof b,
                "predicted step: %.4f s (%.0f tokens/s, %.1f TFLOP/s model FLOPs)\n"
                "  op times: layer forward %.4f s, layer backward %.4f s, head %.4f s, embedding %.4f + %.4f s\n"
                "            (%s)\n"
                "  busy per step: compute %.4f s | link in %.4f s, out %.4f s | optimizer %.4f s (moment codec "
                "%.4f s), gradient accumulation %.4f s | NVMe %.4f s (the tier's CPU work: %.4f s)\n"
                "  compute waited: link %.4f s, a stage's update (optimizer) %.4f s, gradient slots %.4f s; the "
                "optimizer waited for NVMe %.4f s\n",
                p.step_s, p.tokens / p.step_s, p.tflops(), ops.layer_forward, ops.layer_backward, ops.head,
                ops.embed_forward, ops.embed_backward, ops.source.c_str(), p.compute_s, p.h2d_s, p.d2h_s, p.optimizer_s,
                p.codec_s, p.accumulate_s, p.nvme_s, p.tier_cpu_s, p.wait_link_s, p.wait_optimizer_s,
                p.wait_grad_slot_s, p.wait_nvme_s);
  out << b;
  if (ops.attention_forward > 0) {
    std::snprintf(b, sizeof b,
                  "  attention (causal, flash-style; the backward recomputes the probabilities): %.4f s of the layer "
                  "forward, %.4f s of its backward (%.0f%% of a layer's time), at the layers' rate: an assumption "
                  "(the CUDA attention kernel runs fp32 on CUDA cores; its GPU rate is not measured)\n",
                  ops.attention_forward, ops.attention_backward,
                  100.0 * (ops.attention_forward + ops.attention_backward) / (ops.layer_forward + ops.layer_backward));
    out << b;
  }
  if (p.tier_cpu_s > 0)
    out << (p.shared_cores
                ? "  the tier's CPU work (checksums, system calls) runs on compute's cores: it pauses compute\n"
                : "  the tier's CPU work (checksums, system calls) runs on host cores beside the device\n");
  return out.str();
}

TransferCover transfer_cover(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan,
                             const HardwareProfile& hw, const OpTimes& ops) {
  TransferCover t;
  const double element = cfg.precision() == Precision::bf16 ? 2.0 : 4.0;
  std::size_t largest = 0;  // Qwen3-MoE's dense layers are smaller: the link binds on an expert layer
  for (std::int64_t l = 0; l < model.num_hidden_layers; ++l)
    largest = std::max(largest, layer_layout(model, l).total_floats);
  t.layer_bytes = static_cast<double>(largest) * element;
  t.layer_link_s = hw.link_h2d > 0 ? t.layer_bytes / hw.link_h2d : 0.0;
  t.tokens_now = static_cast<double>(plan.batch * plan.seq);
  t.forward_s_per_token = t.tokens_now > 0 ? ops.layer_forward / t.tokens_now : 0.0;
  t.tokens_needed = t.forward_s_per_token > 0 ? t.layer_link_s / t.forward_s_per_token : 0.0;
  return t;
}

std::string describe_transfer_cover(const TransferCover& t, const ModelConfig& model) {
  char b[1024];
  int n = 0;
  std::int64_t moe_layer = 0, moe_layers = 0;
  for (std::int64_t l = model.num_hidden_layers - 1; l >= 0; --l)
    if (model.layer_is_moe(l)) moe_layer = l, ++moe_layers;
  if (moe_layers < model.num_hidden_layers && moe_layers > 0)
    n = std::snprintf(b, sizeof b, "dense layers: %lld of %lld (mlp_only_layers, decoder_sparse_step)\n",
                      static_cast<long long>(model.num_hidden_layers - moe_layers),
                      static_cast<long long>(model.num_hidden_layers));
  if (model.is_moe())
    n += std::snprintf(
        b + n, sizeof b - static_cast<std::size_t>(n),
        "experts: an expert layer streams all %lld experts (%.3fB parameters a layer) and a token computes "
        "with %lld of them (%.3fB active a layer; %.3fB of the model's %.3fB parameters)\n",
        static_cast<long long>(model.num_experts),
        static_cast<double>(layer_layout(model, moe_layer).param_count()) / 1e9,
        static_cast<long long>(model.num_experts_per_tok),
        static_cast<double>(layer_active_param_count(model, moe_layer)) / 1e9,
        static_cast<double>(active_param_count(model)) / 1e9, static_cast<double>(total_param_count(model)) / 1e9);
  std::snprintf(b + n, sizeof b - static_cast<std::size_t>(n),
                "link cover: a layer's %s streams in %.4f s; its forward computes %.3g s a token, so %.0f tokens per "
                "micro-batch hide the transfer (this plan has %.0f: %s)\n",
                gib(t.layer_bytes).c_str(), t.layer_link_s, t.forward_s_per_token, t.tokens_needed, t.tokens_now,
                t.tokens_now >= t.tokens_needed ? "hidden" : "the link binds the forward");
  return b;
}

}  // namespace mt::plan
