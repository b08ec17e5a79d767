// The planner at long context: the published point (a Llama-2-7B shape at 512k tokens on a GH200, bf16)
// fits in sequence tiles, the device rows explain the arena, a length that cannot fit even in tiles is
// refused naming a key (the device's, or with keys and values mapped in host RAM the sequence length),
// and the step model's time grows quadratically in the sequence once attention dominates. Datasheet
// profiles (config/hardware.ini, built in); nothing runs.
#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/stage_api.hpp"
#include "plan/hardware.hpp"
#include "plan/resource_plan.hpp"
#include "plan/step_model.hpp"

using namespace mt;

namespace {

// Llama-2-7B's config.json: d 4096, 32 layers, 32 heads (MHA), MLP 11008, vocab 32000; one sequence.
TrainConfig llama7b(std::int64_t seq) {
  TrainConfig c;
  c.model.arch = "llama";
  c.model.hidden_size = 4096;
  c.model.layers = 32;
  c.model.heads = 32;
  c.model.kv_heads = 32;
  c.model.intermediate_size = 11008;
  c.model.vocab_size = 32000;
  c.model.max_position_embeddings = seq;
  c.data.seq_length = seq;
  c.train.per_device_train_batch_size = 1;
  c.train.gradient_accumulation_steps = 1;
  c.train.bf16 = true;
  c.train.max_grad_norm = 1.0;
  c.device.keep_intermediates = "auto";
  return c;
}

plan::HardwareProfile profile(const std::string& key) { return plan::load_hardware_profile(key, ""); }

// As `megatrain plan --plan.hardware=KEY` plans it: the GPU across its link, 90% of its memory the budget.
// shares_host_memory: a device that shares host memory instead (the engine's boundary_mapped).
plan::ResourcePlan plan_on(TrainConfig& cfg, const plan::HardwareProfile& hw, bool shares_host_memory) {
  plan::plan_as_gpu(cfg, hw);
  if (shares_host_memory) cfg.device.copy_bandwidth_gbps = 0;
  cfg.device.max_vram_gb = 0.9 * hw.device_memory_bytes / 1073741824.0;
  plan::PlanExtras x;
  x.device_is_gpu = true;
  return plan::plan_resources(cfg, cfg.model_config_from_keys(), x, hw.host_ram_bytes, "profile", hw.disk_bytes,
                              "profile", hw.device_memory_bytes);
}

double tier_total(const plan::ResourcePlan& p, const std::string& tier) {
  double t = 0;
  for (const auto& b : p.bytes)
    if (b.tier == tier) t += b.bytes;
  return t;
}

const plan::Misfit* misfit_of(const plan::ResourcePlan& p, const std::string& tier) {
  for (const auto& m : p.misfits)
    if (m.tier == tier) return &m;
  return nullptr;
}

// The predicted step of `cfg` with the plan the engine makes for it (a budget large enough for every length
// asked, so only the sequence changes between calls: boundaries on the host, tiles of `tile` tokens).
plan::StepPrediction step_at(std::int64_t seq, std::int64_t tile) {
  TrainConfig cfg = llama7b(seq);
  const plan::HardwareProfile hw = profile("h200");
  plan::plan_as_gpu(cfg, hw);
  cfg.device.max_vram_gb = 4096;
  cfg.device.keep_intermediates = "boundary_host";
  cfg.device.seq_tile = tile;
  cfg.device.weight_slots = 2;
  cfg.device.grad_slots = 2;
  const ModelConfig model = cfg.model_config_from_keys();
  const plan::EnginePlan ep = plan::plan_engine(cfg, model);
  const plan::OpTimes ops = plan::op_times_from_flops(cfg, model, ep, hw);
  return plan::predict_step(cfg, model, ep, hw, ops);
}

}  // namespace

TEST_CASE("7B at 512k tokens on a GH200 (bf16) fits in sequence tiles with its boundaries mapped", "[plan]") {
  const std::int64_t T = 524288;
  TrainConfig cfg = llama7b(T);
  const plan::HardwareProfile hw = profile("gh200");
  const plan::ResourcePlan p = plan_on(cfg, hw, true);
  INFO(plan::describe_resources(p));
  REQUIRE(p.fits());
  REQUIRE(p.engine);
  const plan::EnginePlan& e = *p.engine;
  CHECK(e.seq_tile > 0);
  CHECK(e.seq_tile < T);
  CHECK((e.seq_tile & (e.seq_tile - 1)) == 0);  // auto picks a power of two
  CHECK(p.device_bytes <= static_cast<double>(cfg.device_budget_bytes()));
  CHECK(p.device_bytes <= hw.device_memory_bytes);
  CHECK(p.host_peak_rss_bytes <= hw.host_ram_bytes);
  // The device rows are the arena, region by region, and beside it the CUDA ops' scratch and the
  // backend's reserve; the workspace holds the sequence's K, V, dK, dV.
  CHECK(p.device_side_bytes > 0);
  CHECK(tier_total(p, "device") == p.device_bytes + p.device_side_bytes);
  CHECK(p.device_bytes + p.device_side_bytes <= hw.device_memory_bytes);
  const ModelConfig model = cfg.model_config_from_keys();
  bool workspace_row = false;
  for (const auto& b : p.bytes)
    if (b.tier == "device" && b.what.rfind("workspace", 0) == 0) {
      workspace_row = true;
      CHECK(b.bytes >= 4.0 * static_cast<double>(T * model.kv_dim()) * 4.0);
      CHECK(b.what.find("sequence tiles of " + std::to_string(e.seq_tile)) != std::string::npos);
    }
  CHECK(workspace_row);
  CHECK(plan::describe_resources(p).find("sequence: tiles of " + std::to_string(e.seq_tile)) != std::string::npos);
  // And a step time: finite, attention most of it.
  const plan::OpTimes ops = plan::op_times_from_flops(cfg, model, e, hw);
  const plan::StepPrediction sp = plan::predict_step(cfg, model, e, hw, ops);
  CHECK(sp.step_s > 0);
  CHECK(sp.tokens == Approx(static_cast<double>(T)));
  CHECK(ops.attention_forward + ops.attention_backward > 0.5 * (ops.layer_forward + ops.layer_backward));
}

TEST_CASE("across a link the plan fits exactly when its least plan fits, and names the key otherwise", "[plan]") {
  for (const char* key : {"gh200", "h200"}) {
    TrainConfig cfg = llama7b(524288);
    const plan::HardwareProfile hw = profile(key);
    const plan::ResourcePlan p = plan_on(cfg, hw, false);
    const auto least = plan::least_device_plan(cfg, cfg.model_config_from_keys());
    REQUIRE(least);
    INFO(key << ": least " << plan::gib(static_cast<double>(least->arena.total_bytes)) << "\n"
             << plan::describe_resources(p));
    CHECK(least->seq_tile == plan::kMinAutoSeqTile);
    const bool least_fits = static_cast<double>(least->arena.total_bytes) <= cfg.device_budget_bytes();
    const plan::Misfit* m = misfit_of(p, "device");
    CHECK((m == nullptr) == least_fits);
    if (m != nullptr) {
      CHECK(m->key == "device.max_vram_gb");
      CHECK(m->need == static_cast<double>(least->arena.total_bytes));
      CHECK(m->message.find("the least this run takes is") != std::string::npos);
    } else {
      REQUIRE(p.engine);
      CHECK(p.engine->seq_tile > 0);
      CHECK(p.device_bytes <= static_cast<double>(cfg.device_budget_bytes()));
    }
  }
}

TEST_CASE("a length that cannot fit even in the smallest tiles is refused naming the key", "[plan]") {
  // 2M tokens: the sequence's keys, values and their gradients alone (4 x T x 4096 fp32 = 128 GiB) are
  // more than a GH200's memory. Across a link they stay on the device, whatever holds the boundaries.
  const plan::HardwareProfile hw = profile("gh200");
  {
    TrainConfig cfg = llama7b(2097152);
    const plan::ResourcePlan p = plan_on(cfg, hw, false);
    INFO(plan::describe_resources(p));
    CHECK_FALSE(p.fits());
    CHECK_FALSE(p.engine);
    const plan::Misfit* m = misfit_of(p, "device");
    REQUIRE(m != nullptr);
    CHECK(m->key == "device.max_vram_gb");
    CHECK(m->need > hw.device_memory_bytes);
    CHECK(m->message.find("data.seq_length") != std::string::npos);
    CHECK(m->message.find("device.seq_tile=" + std::to_string(plan::kMinAutoSeqTile)) != std::string::npos);
  }
  // On a device sharing host memory they are mapped in host RAM with the boundaries (device.attention_kv=
  // auto): the device fits, and host RAM (1 TiB of boundaries against 480 GB) is refused naming the
  // sequence length, with a length that fits.
  TrainConfig cfg = llama7b(2097152);
  const plan::ResourcePlan p = plan_on(cfg, hw, true);
  const std::string text = plan::describe_resources(p);
  INFO(text);
  CHECK_FALSE(p.fits());
  REQUIRE(p.engine);
  CHECK(p.engine->keys_values == plan::KeysValues::mapped);
  CHECK(misfit_of(p, "device") == nullptr);
  CHECK(text.find("attention's keys, values and their gradients") != std::string::npos);
  const plan::Misfit* m = misfit_of(p, "host RAM");
  REQUIRE(m != nullptr);
  CHECK(m->key == "data.seq_length");
  const std::string about = "data.seq_length of about ";
  const std::size_t at = m->message.find(about);
  REQUIRE(at != std::string::npos);
  const std::int64_t longest = std::stoll(m->message.substr(at + about.size()));
  CHECK(longest > 262144);
  CHECK(longest < 2097152);
  TrainConfig shorter = llama7b(longest / 1024 * 1024);
  const plan::ResourcePlan q = plan_on(shorter, hw, true);
  INFO(plan::describe_resources(q));
  CHECK(q.fits());
}

TEST_CASE("documents: attention FLOPs count the pairs inside documents, a window the fewer of the two",
          "[plan][documents]") {
  TrainConfig cfg = llama7b(4096);
  const ModelConfig model = cfg.model_config_from_keys();
  const std::int64_t T = 8192;
  const double docs = 16.0 * 512.0 * 513.0 / 2.0;  // documents of 512
  const plan::LayerFlops causal = plan::layer_flops(model, 2, T);
  const plan::LayerFlops packed = plan::layer_flops(model, 2, T, plan::kCudaAttentionBackwardProducts, docs);
  CHECK(packed.attention_forward / causal.attention_forward == Approx(docs / (T * (T + 1.0) / 2.0)));
  CHECK(packed.gemm_forward == causal.gemm_forward);
  cfg.model.arch = "mistral";  // every layer slides over 100 keys: fewer pairs than the documents'
  cfg.model.sliding_window = 100;
  const ModelConfig mistral = cfg.model_config_from_keys();
  const plan::LayerFlops windowed = plan::layer_flops(mistral, 2, T);
  CHECK(windowed.attention_forward < packed.attention_forward);
  CHECK(plan::layer_flops(mistral, 2, T, plan::kCudaAttentionBackwardProducts, docs).attention_forward ==
        Approx(windowed.attention_forward));
}

TEST_CASE("attention FLOPs count the causal pairs, and tiles change no FLOPs", "[plan]") {
  TrainConfig cfg = llama7b(4096);
  const ModelConfig model = cfg.model_config_from_keys();
  // An independent count: query row i meets keys 0..i; two products a pair, 2 x head_dim FLOPs each, per head.
  for (std::int64_t T : {1, 7, 64}) {
    double pairs = 0;
    for (std::int64_t i = 0; i < T; ++i) pairs += static_cast<double>(i + 1);
    const plan::LayerFlops f = plan::layer_flops(model, 3, T);
    CHECK(f.attention_forward == Approx(3.0 * pairs * 2.0 * 2.0 * static_cast<double>(model.q_dim())));
    CHECK(f.attention_backward ==
          Approx(f.attention_forward * plan::kCudaAttentionBackwardProducts / plan::kAttentionForwardProducts));
    CHECK(f.backward(true) == Approx(f.backward(false) + f.forward()));
  }
  // GEMMs linear in T, attention quadratic.
  const plan::LayerFlops a = plan::layer_flops(model, 1, 65536), b = plan::layer_flops(model, 1, 131072);
  CHECK(b.gemm_forward == Approx(2.0 * a.gemm_forward));
  CHECK(b.attention_forward / a.attention_forward == Approx(4.0).epsilon(1e-4));
  // The tiled backward recomputes the forward once, as the whole-sequence one: the same op times.
  const plan::StepPrediction whole = step_at(8192, 0), tiled = step_at(8192, 1024);
  CHECK(tiled.compute_s == Approx(whole.compute_s));
}

TEST_CASE("at long context the predicted step grows about quadratically in the sequence", "[plan]") {
  // r(T) = step(2T) / step(T): above 2 once compute outweighs the per-step optimizer (at a few thousand
  // tokens the optimizer sets the step and r is near 1), towards 4 as attention takes over.
  double last = 0;
  for (std::int64_t T : {32768, 131072, 524288}) {
    const double r = step_at(2 * T, 1024).step_s / step_at(T, 1024).step_s;
    INFO("T=" << T << " r=" << r);
    CHECK(r > 2.0);
    CHECK(r <= 4.0 + 1e-6);
    CHECK(r > last);
    last = r;
  }
  CHECK(last > 3.8);  // at 512k -> 1M attention is over 95% of a layer's FLOPs
}

// `megatrain plan` on this machine at long context times the stages at two shorter lengths and fits
// a T + b T (T + 1) / 2: exact on such data, clamped where noise would make a term negative.
TEST_CASE("long sequences are timed at two shorter lengths and fitted, per token and per causal pair", "[plan]") {
  auto time_of = [](double a, double b, std::int64_t T) {
    return a * static_cast<double>(T) + b * static_cast<double>(T) * (static_cast<double>(T) + 1.0) / 2.0;
  };
  for (const auto& [a, b] : {std::pair{2e-5, 3e-9}, std::pair{1e-4, 0.0}, std::pair{0.0, 1e-8}}) {
    INFO("a " << a << " b " << b);
    const double t = plan::extrapolate_layer_time(time_of(a, b, 4096), 4096, time_of(a, b, 8192), 8192, 131072);
    CHECK(t == Approx(time_of(a, b, 131072)).epsilon(1e-9));
  }
  // Noise that would make the quadratic term negative: linear from the longer length.
  CHECK(plan::extrapolate_layer_time(1.0, 4096, 1.5, 8192, 32768) == Approx(1.5 * 4.0));
  // ... or the linear one: all of it quadratic from the longer length.
  const double p2 = 8192.0 * 8193.0 / 2.0, p = 32768.0 * 32769.0 / 2.0;
  CHECK(plan::extrapolate_layer_time(0.1, 4096, 1.0, 8192, 32768) == Approx(p / p2));

  // The engine's kernels on a small Llama at 1024 tokens, timed at 256 and 512 (kept tiny for CI).
  TrainConfig cfg;
  cfg.model.arch = "llama";
  cfg.model.hidden_size = 64;
  cfg.model.layers = 2;
  cfg.model.heads = 4;
  cfg.model.kv_heads = 4;
  cfg.model.intermediate_size = 128;
  cfg.model.vocab_size = 128;
  cfg.model.max_position_embeddings = 1024;
  cfg.data.seq_length = 1024;
  cfg.train.per_device_train_batch_size = 1;
  cfg.device.max_vram_gb = 64 / 1024.0;
  cfg.threads.total = 2;
  const ModelConfig model = cfg.model_config_from_keys();
  const plan::EnginePlan ep = plan::plan_engine(cfg, model);
  const plan::OpTimes fitted = plan::measure_op_times(cfg, model, ep, 512);
  CHECK(fitted.source.find("at 256 and 512 tokens a sequence") != std::string::npos);
  CHECK(fitted.source.find("extrapolated to 1024") != std::string::npos);
  for (double v : {fitted.layer_forward, fitted.layer_backward, fitted.layer_backward_kept, fitted.head})
    CHECK((v > 0 && std::isfinite(v)));
  const plan::OpTimes direct = plan::measure_op_times(cfg, model, ep, 1024);
  CHECK(direct.source.find("at this shape") != std::string::npos);
}

TEST_CASE("on a GPU the plan counts the pinned host memory: tiles, host boundaries, landing buffers", "[plan]") {
  TrainConfig cfg = llama7b(32768);
  cfg.device.keep_intermediates = "boundary_host";
  const plan::HardwareProfile hw = profile("h200");
  const plan::ResourcePlan p = plan_on(cfg, hw, false);
  INFO(plan::describe_resources(p));
  REQUIRE(p.engine);
  const plan::EnginePlan& e = *p.engine;
  REQUIRE(e.host_boundary_bytes > 0);
  double tiles = 0, collector = 0;
  for (const auto& b : p.bytes) {
    if (b.tier == "host RAM" && b.what.rfind("host tiles", 0) == 0) tiles += b.bytes;
    if (b.tier == "host RAM" && b.what.find("collector's gradient buffer") != std::string::npos) collector += b.bytes;
  }
  CHECK(tiles > 0);
  CHECK(collector > 0);  // the one stage's buffer every gradient lands in over the link
  CHECK(p.pinned_bytes == tiles + static_cast<double>(e.host_boundary_bytes) + collector);
  CHECK(p.pinned_bytes <= p.host_bytes);
  CHECK(plan::describe_resources(p).find("pinned for the GPU's copies") != std::string::npos);
}

TEST_CASE("plan: placements are named values, and what leaves the device goes only to the mapped block", "[plan]") {
  // 2M tokens on a GH200 profile: keys and values mapped with the boundaries (as above).
  TrainConfig cfg = llama7b(2097152);
  const plan::ResourcePlan p = plan_on(cfg, profile("gh200"), true);
  REQUIRE(p.engine);
  const plan::EnginePlan& e = *p.engine;
  CHECK(e.boundaries == plan::BoundaryPlacement::mapped);
  CHECK(e.keys_values == plan::KeysValues::mapped);
  REQUIRE(e.seq_tile > 0);
  CHECK_NOTHROW(plan::check_placements(e));
  // The printed plan names them, beside the flags it always printed.
  const nlohmann::json s = plan::plan_summary(e);
  CHECK(s.at("boundaries") == "mapped");
  CHECK(s.at("keys_values") == "mapped");
  CHECK(s.at("sequence_mapped") == true);
  CHECK(s.at("attention_outputs") == plan::attention_outputs_name(e.attention));
  CHECK(s.at("attention_kept") == (e.attention == plan::AttentionOutputs::kept_mapped));
  CHECK(s.at("keep_intermediates") == "boundary_mapped");
  // A plan built by hand with keys and values mapped but the boundaries elsewhere, or in whole sequences,
  // or attention outputs kept without the mapped block, is refused.
  plan::EnginePlan bad = e;
  bad.boundaries = plan::BoundaryPlacement::host_ring;
  CHECK_THROWS_AS(plan::check_placements(bad), std::invalid_argument);
  bad = e;
  bad.seq_tile = 0;
  CHECK_THROWS_AS(plan::check_placements(bad), std::invalid_argument);
  bad = e;
  bad.keys_values = plan::KeysValues::device_workspace;
  bad.attention = plan::AttentionOutputs::kept_mapped;
  CHECK_NOTHROW(plan::check_placements(bad));
  bad.boundaries = plan::BoundaryPlacement::device;
  CHECK_THROWS_AS(plan::check_placements(bad), std::invalid_argument);
  bad = e;
  bad.keys_values = plan::KeysValues::device_workspace;
  bad.boundaries = plan::BoundaryPlacement::device;
  bad.seq_tile = 0;
  bad.kept_layers = 2;
  CHECK_NOTHROW(plan::check_placements(bad));
  bad.seq_tile = 512;
  CHECK_THROWS_AS(plan::check_placements(bad), std::invalid_argument);
}
