// Overlap of the streaming engine: with the copy engine limited so that streaming the weights takes
// about as long as computing with them (total transfer ~= total compute per step), the pipelined
// schedule's step time against max(total compute, total transfer), side by side with a non-overlapped
// schedule (each stage streamed only when compute asks for it) in the same run. Also: how much of the
// optimizer's time is hidden behind the next step's forward.
//   tools/bench/run overlap [STEPS] [LAYERS] [K]      (default 6 steps, 8 layers, K = 4 plus a sweep:
//   K = 2 and 6, the sequential and layer-major micro-batch orders, boundaries offloaded to the host, and the demo
//   model's own configuration with 1 gradient slot and with auto slots)
// Metric overlap_step_ratio = step time / max(total compute, total transfer) (target <= 1.15), with
// compute from the same run; overlap_step_ratio_vs_compute_alone takes compute from the non-overlapped
// run instead (no copy contends with it there);
// link_bytes_bf16_over_fp32 = host-to-device bytes per step with train.bf16 over fp32 (target <= 0.55).
// For the demo's own configuration (one micro-batch a step) also the physical bound of that
// configuration (overlap_demo*_physical_bound_ratio: the forward streams every stage after its update,
// the backward begins when the forward ends) and the step against it (overlap_demo*_step_vs_physical_bound).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "actors/engine.hpp"
#include "actors/roles.hpp"
#include "kernels/param_layout.hpp"
#include "tools/bench/bench_report.hpp"
#include "tools/bench/demo_model.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;

namespace {

struct Measured {
  double step_s = 0, compute_s = 0, transfer_s = 0, h2d_bytes = 0, wait_s = 0;
  double forward_s = 0;  // of compute_s: the stages' forwards (the rest: the head and the backward)
  double opt_s = 0, opt_hidden_s = 0;
  double min_compute_s = 0;  // the least compute of one measured step (calibration under noise)
  EngineResult result;
};

constexpr double kFastLinkGbps = 1e4;  // GB/s per direction: copies at memcpy speed, counted

TrainConfig bench_config(std::int64_t layers, std::int64_t steps) {
  TrainConfig c;
  c.model.arch = "llama";
  c.model.hidden_size = 256;
  c.model.layers = layers;
  c.model.heads = 4;
  c.model.kv_heads = 4;
  c.model.intermediate_size = 704;
  c.model.vocab_size = 512;
  c.model.max_position_embeddings = 256;
  c.train.per_device_train_batch_size = 2;
  c.train.gradient_accumulation_steps = 4;
  c.train.max_steps = steps;
  c.train.learning_rate = 1e-3;
  c.train.max_grad_norm = 1.0;
  c.train.weight_decay = 0.1;
  c.data.seq_length = 64;
  c.device.max_vram_gb = 256 / 1024.0;
  c.device.keep_intermediates = "boundary";  // recompute in backward: the imbalance the order has to hide
  c.monitor.enabled = false;                 // no endpoint in this measurement
  c.device.weight_slots = 4;
  c.device.grad_slots = 2;
  // A link, so that weights are copied (without one the CPU backend maps the host tiles and streams
  // nothing): this fast it paces nothing; the measurements below lower it.
  c.device.copy_bandwidth_gbps = kFastLinkGbps;
  c.threads.total = 2;
  c.threads.blas = 1;
  c.threads.optimizer = 1;
  c.threads.copy = 2;
  c.threads.scheduler = 1;
  return c;
}

std::vector<data::Batch> bench_batches(const TrainConfig& c, int count) {
  std::vector<data::Batch> out;
  std::uint64_t x = 12345;
  for (int i = 0; i < count; ++i) {
    data::Batch b;
    const std::size_t n = static_cast<std::size_t>(c.train.per_device_train_batch_size * c.data.seq_length);
    for (std::size_t k = 0; k < n; ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      b.inputs.push_back(static_cast<std::int32_t>((x >> 33) % static_cast<std::uint64_t>(c.model.vocab_size)));
      b.targets.push_back(static_cast<std::int32_t>((x >> 17) % static_cast<std::uint64_t>(c.model.vocab_size)));
    }
    out.push_back(std::move(b));
  }
  return out;
}

// Length of the intersection of [a0, a1] with the union of `ivs` (sorted, disjoint after merging).
double overlap_with(double a0, double a1, const std::vector<std::pair<double, double>>& ivs) {
  double t = 0;
  for (const auto& iv : ivs) t += std::max(0.0, std::min(a1, iv.second) - std::max(a0, iv.first));
  return t;
}

Measured run(const TrainConfig& cfg, const std::vector<data::Batch>& batches, bool serial) {
  const ModelConfig model = cfg.model_config_from_keys();
  HostModel host(model, host_tile_options(cfg));
  init_host_model(host, 7);
  VectorBatchSource source(batches);
  EngineJob job;
  job.cfg = cfg;
  job.model = model;
  job.data = &source;
  job.host = &host;
  job.record_intervals = true;
  job.serial_schedule = serial;
  Measured m;
  m.result = run_engine(std::move(job));
  if (!m.result.error.empty()) {
    std::fprintf(stderr, "bench_overlap: engine failed: %s\n", m.result.error.c_str());
    std::exit(1);
  }
  const auto& steps = m.result.steps;
  const std::int64_t n = static_cast<std::int64_t>(steps.size());
  const std::int64_t first = n > 2 ? 1 : 0;  // skip the first step (warm-up: nothing to overlap with)
  double step_s = 0, wait = 0;
  for (std::int64_t s = first; s < n; ++s) {
    step_s += steps[static_cast<std::size_t>(s)].step_s;
    wait += steps[static_cast<std::size_t>(s)].wait_weights_s;
  }
  const double counted = static_cast<double>(n - first);
  m.step_s = step_s / counted;
  m.wait_s = wait / counted;
  // Compute and transfer busy time per step, from the recorded intervals of the measured steps.
  // The next step's forward activity (compute or streaming) an optimizer interval can hide behind.
  std::vector<std::vector<std::pair<double, double>>> busy_by_step(static_cast<std::size_t>(n) + 1);
  double compute = 0, transfer = 0;
  double forward = 0;
  for (const auto& iv : m.result.intervals) {
    if (iv.step < first || iv.step >= n) continue;
    if (iv.role == Role::compute) compute += iv.t1 - iv.t0;
    if (iv.role == Role::compute && iv.phase == static_cast<int>(Phase::forward)) forward += iv.t1 - iv.t0;
    if (iv.role == Role::prefetcher) transfer += iv.t1 - iv.t0;
  }
  m.forward_s = forward / counted;
  for (const auto& iv : m.result.intervals)
    if ((iv.role == Role::compute || iv.role == Role::prefetcher) && iv.step >= 0 && iv.step <= n)
      busy_by_step[static_cast<std::size_t>(iv.step)].push_back({iv.t0, iv.t1});
  for (auto& v : busy_by_step) {  // merge into disjoint intervals
    std::sort(v.begin(), v.end());
    std::vector<std::pair<double, double>> merged;
    for (const auto& iv : v)
      if (!merged.empty() && iv.first <= merged.back().second)
        merged.back().second = std::max(merged.back().second, iv.second);
      else
        merged.push_back(iv);
    v = std::move(merged);
  }
  double opt = 0, hidden = 0;
  for (const auto& iv : m.result.intervals) {
    if (iv.role != Role::optimizer || iv.step < first || iv.step + 1 >= n) continue;
    opt += iv.t1 - iv.t0;
    hidden += overlap_with(iv.t0, iv.t1, busy_by_step[static_cast<std::size_t>(iv.step + 1)]);
  }
  m.compute_s = compute / counted;
  std::vector<double> per_step(static_cast<std::size_t>(n), 0.0);
  for (const auto& iv : m.result.intervals)
    if (iv.role == Role::compute && iv.step >= 0 && iv.step < n)
      per_step[static_cast<std::size_t>(iv.step)] += iv.t1 - iv.t0;
  m.min_compute_s = *std::min_element(per_step.begin() + first, per_step.end());
  m.transfer_s = transfer / counted;
  m.h2d_bytes = static_cast<double>(m.result.link.of(LinkDirection::host_to_device).bytes) / static_cast<double>(n);
  m.opt_s = opt;
  m.opt_hidden_s = hidden;
  return m;
}

}  // namespace

// NOLINTNEXTLINE(bugprone-exception-escape): a benchmark; an error ends it via std::terminate, which names it
int main(int argc, char** argv) {
  const std::int64_t steps = argc > 1 ? std::atoll(argv[1]) : 6;
  const std::int64_t layers = argc > 2 ? std::atoll(argv[2]) : 8;
  TrainConfig cfg = bench_config(layers, steps);
  if (argc > 3) cfg.device.weight_slots = std::atoll(argv[3]);
  const auto batches = bench_batches(cfg, 16);

  // 1. Calibrate: compute time per step with copies at memcpy speed.
  const Measured cal = run(cfg, batches, false);
  const double bw = cal.h2d_bytes / cal.min_compute_s;
  std::printf(
      "overlap: llama %lld layers d=%lld, %lld x %lld x %lld tokens/step, K=%lld; calibration: compute %.3f s/step, "
      "%.1f MB streamed/step -> link limited to %.3f GB/s (transfer ~= compute)\n",
      static_cast<long long>(layers), static_cast<long long>(cfg.model.hidden_size),
      static_cast<long long>(cfg.train.gradient_accumulation_steps),
      static_cast<long long>(cfg.train.per_device_train_batch_size), static_cast<long long>(cfg.data.seq_length),
      static_cast<long long>(cfg.device.weight_slots), cal.min_compute_s, cal.h2d_bytes / 1e6, bw / 1e9);
  cfg.device.copy_bandwidth_gbps = bw / 1e9;

  // 2. Pipelined and 3. non-overlapped, same link limit.
  const Measured pipe = run(cfg, batches, false);
  const Measured serial = run(cfg, batches, true);
  auto bound = [&](const Measured& m) { return std::max(m.compute_s, m.h2d_bytes / bw); };
  const double ratio = pipe.step_s / bound(pipe);
  const double ratio_serial = serial.step_s / bound(serial);
  std::printf(
      "  pipelined:      step %.3f s, compute %.3f s, transfer %.3f s (link busy %.3f s), waiting for weights %.3f s "
      "-> %.3f x max(compute, transfer)\n",
      pipe.step_s, pipe.compute_s, pipe.h2d_bytes / bw, pipe.transfer_s, pipe.wait_s, ratio);
  std::printf(
      "  non-overlapped: step %.3f s, compute %.3f s, transfer %.3f s, waiting for weights %.3f s "
      "-> %.3f x max(compute, transfer)\n",
      serial.step_s, serial.compute_s, serial.h2d_bytes / bw, serial.wait_s, ratio_serial);
  const double hidden = pipe.opt_s > 0 ? pipe.opt_hidden_s / pipe.opt_s : 0.0;
  std::printf(
      "  optimizer: %.3f s over the measured steps, %.0f%% of it hidden behind the next step's forward "
      "(its compute or weight streaming)\n",
      pipe.opt_s, 100 * hidden);

  // The bound above takes compute time from the same run, where contention with the copies inflates
  // it; against compute measured alone (the non-overlapped run: no copy runs while compute does).
  const double alone = std::max(serial.compute_s, pipe.h2d_bytes / bw);
  std::printf("  pipelined against max(compute alone %.3f s, transfer %.3f s): %.3f x\n", serial.compute_s,
              pipe.h2d_bytes / bw, pipe.step_s / alone);

  mt::bench::Report report("overlap");
  report.add({"overlap_step_ratio", ratio, "x", 0, 1.15, "lower"});
  report.add({"overlap_step_ratio_vs_compute_alone", pipe.step_s / alone, "x", 0, 1.15, "lower"});
  // The same link limit with fewer and more weight slots: how the ratio depends on prefetch depth.
  if (argc <= 3) {
    auto variant = [&](const TrainConfig& c, const std::string& what, const std::string& metric) {
      const Measured m = run(c, batches, false);
      const double r = m.step_s / bound(m);
      std::printf(
          "  pipelined, %s: step %.3f s, compute %.3f s, transfer %.3f s, waiting for weights %.3f s -> %.3f x\n",
          what.c_str(), m.step_s, m.compute_s, m.h2d_bytes / bw, m.wait_s, r);
      report.add({metric, r, "x", 0, 1.15, "lower"});
    };
    for (std::int64_t k : {std::int64_t{2}, std::int64_t{6}}) {
      TrainConfig c = cfg;
      c.device.weight_slots = k;
      variant(c, "K=" + std::to_string(k), "overlap_step_ratio_k" + std::to_string(k));
    }
    // The micro-batches one after another: each forward link-bound, each backward compute-bound.
    TrainConfig seq = cfg;
    seq.device.schedule = "sequential";
    variant(seq, "sequential micro-batches", "overlap_step_ratio_sequential");
    // Layer-major: each layer's backward over every micro-batch back to back, its weights streamed
    // once per backward (the other micro-batches find the slot resident): fewer bytes on the link,
    // every micro-batch's boundaries alive at once. Its step against the interleaved one, same link.
    TrainConfig major = cfg;
    major.device.schedule = "layer_major";
    {
      const Measured m = run(major, batches, false);
      std::printf(
          "  pipelined, layer-major micro-batches: step %.3f s, compute %.3f s, %.1f MB streamed/step (interleaved "
          "%.1f MB), waiting for weights %.3f s -> %.3f x max(compute, transfer), %.3f x the interleaved step\n",
          m.step_s, m.compute_s, m.h2d_bytes / 1e6, pipe.h2d_bytes / 1e6, m.wait_s, m.step_s / bound(m),
          m.step_s / pipe.step_s);
      report.add({"overlap_step_ratio_layer_major", m.step_s / bound(m), "x", 0, 1.15, "lower"});
      report.add({"layer_major_vs_interleaved_step", m.step_s, "s", pipe.step_s, 0, "lower"});
      report.add({"layer_major_vs_interleaved_link_bytes", m.h2d_bytes, "bytes/step", pipe.h2d_bytes, 0, "lower"});
    }
    // Boundaries offloaded to the host: their copies share the link (out in forward, back in backward).
    TrainConfig host = cfg;
    host.device.keep_intermediates = "boundary_host";
    variant(host, "boundaries on the host", "overlap_step_ratio_boundary_host");
  }
  // The main job's own configuration (config/demo.ini: one micro-batch per step, so no interleaving),
  // the link limited so that transfer takes about as long as compute: with the slots it had before
  // device.*_slots = auto (2 weight, 1 gradient: the gradient offload sits on the critical path) and
  // with auto slots, each against max(compute measured alone, transfer).
  if (argc <= 3) {
    TrainConfig demo = mt::bench::demo_train_config(steps);
    demo.device.weight_slots = 2;
    demo.device.grad_slots = 1;
    demo.device.copy_bandwidth_gbps = kFastLinkGbps;
    const auto demo_batches = mt::bench::random_batches(demo, 8, 0xD3u);
    const Measured dcal = run(demo, demo_batches, false);
    const double dbw = dcal.h2d_bytes / dcal.min_compute_s;
    demo.device.copy_bandwidth_gbps = dbw / 1e9;
    std::printf("  demo model (config/demo.ini shapes, 1 micro-batch), link limited to %.3f GB/s:\n", dbw / 1e9);
    // What streams in the forward: every stage once (each changed in the last step's update).
    const ModelConfig demo_model = demo.model_config_from_keys();
    double forward_bytes = 0;
    for (std::int64_t s = 0; s < num_stages(demo_model); ++s)
      forward_bytes += static_cast<double>(stage_layout(demo_model, s).total_floats * sizeof(float));
    for (const bool auto_slots : {false, true}) {
      TrainConfig d = demo;
      if (auto_slots) d.device.weight_slots = d.device.grad_slots = 0;
      const Measured dp = run(d, demo_batches, false);
      const Measured ds = run(d, demo_batches, true);
      const double demo_bound = std::max(ds.compute_s, dp.h2d_bytes / dbw);
      // The physical bound of one micro-batch a step over this link: the forward streams every stage
      // after its update (none can be streamed earlier: stage 0's update ends the last step's backward,
      // and with clipping every stage's waits for the whole backward), so it takes at least its bytes'
      // time or its compute, whichever is longer; the backward begins once the forward ends (one
      // micro-batch: the head needs the last boundary) and takes at least its own compute or the time of
      // what it streams; and with clipping no stage is updated before every gradient is in, the last one
      // being stage 0's, made by the backward's last op: its copy out of the device lies between the two.
      // step >= max(forward compute, forward bytes / link) + max(backward compute, backward bytes / link)
      // + stage 0's gradient bytes / link, compute measured alone (the non-overlapped run).
      const double backward_bytes = std::max(0.0, dp.h2d_bytes - forward_bytes);
      const double last_gradient =
          demo.train.max_grad_norm > 0
              ? static_cast<double>(stage_layout(demo_model, 0).total_floats * sizeof(float)) / dbw
              : 0.0;
      const double physical = std::max(ds.forward_s, forward_bytes / dbw) +
                              std::max(ds.compute_s - ds.forward_s, backward_bytes / dbw) + last_gradient;
      std::printf(
          "    %s: step %.3f s, compute alone %.3f s (forward %.3f s), transfer %.3f s (forward %.3f s), waiting for "
          "weights %.3f s -> %.3f x; the physical bound of this configuration %.3f s = %.3f x, the step %.3f x it\n",
          auto_slots ? "auto slots" : "2 weight + 1 gradient slot", dp.step_s, ds.compute_s, ds.forward_s,
          dp.h2d_bytes / dbw, forward_bytes / dbw, dp.wait_s, dp.step_s / demo_bound, physical, physical / demo_bound,
          dp.step_s / physical);
      const std::string name = auto_slots ? "overlap_demo_auto_slots" : "overlap_demo";
      report.add({name + "_step_ratio", dp.step_s / demo_bound, "x", 0, 1.15, "lower"});
      report.add({name + "_physical_bound_ratio", physical / demo_bound, "x", 0, 0, "lower"});
      report.add({name + "_step_vs_physical_bound", dp.step_s, "s", physical, 0, "lower"});
    }
  }
  // bf16 compute: the prefetcher streams the 2-byte compute copies. Host-to-device bytes per step
  // against the fp32 calibration run (a link at memcpy speed, same schedule); boundary copies are fp32
  // either way.
  TrainConfig bf16 = cfg;
  bf16.train.bf16 = true;
  bf16.device.copy_bandwidth_gbps = kFastLinkGbps;
  const Measured half = run(bf16, batches, false);
  const double bytes_ratio = half.h2d_bytes / cal.h2d_bytes;
  std::printf("  bf16 compute: %.1f MB streamed to the device per step against %.1f MB in fp32 -> %.3f\n",
              half.h2d_bytes / 1e6, cal.h2d_bytes / 1e6, bytes_ratio);
  report.add({"link_bytes_bf16_over_fp32", half.h2d_bytes, "bytes/step", cal.h2d_bytes, 0.55, "lower"});
  report.add({"serial_step_ratio", ratio_serial, "x", 0, 0, "lower"});
  report.add({"optimizer_hidden_fraction", hidden, "fraction", 0, 0, "higher"});
  report.add({"pipelined_step_s", pipe.step_s, "s", serial.step_s, 0, "lower"});
  report.print();
  return 0;
}
