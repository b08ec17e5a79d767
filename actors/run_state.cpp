#include "actors/run_state.hpp"

#include <cstring>
#include <stdexcept>

#include "actors/engine.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/ops_bf16.hpp"
#include "storage/checkpoint/checkpoint_reader.hpp"
#include "storage/hf/hf_config.hpp"
#include "storage/hf/hf_model.hpp"

namespace mt::actors {

nlohmann::json train_config_json(const TrainConfig& c) {
  const auto& t = c.train;
  const auto& m = c.model;
  const auto& d = c.data;
  const auto& v = c.device;
  const auto& th = c.threads;
  const auto& l = c.log;
  return {
      {"train",
       {{"output_dir", t.output_dir},
        {"per_device_train_batch_size", t.per_device_train_batch_size},
        {"gradient_accumulation_steps", t.gradient_accumulation_steps},
        {"max_steps", t.max_steps},
        {"learning_rate", t.learning_rate},
        {"lr_scheduler_type", t.lr_scheduler_type},
        {"warmup_steps", t.warmup_steps},
        {"min_lr_ratio", t.min_lr_ratio},
        {"weight_decay", t.weight_decay},
        {"adam_beta1", t.adam_beta1},
        {"adam_beta2", t.adam_beta2},
        {"adam_epsilon", t.adam_epsilon},
        {"max_grad_norm", t.max_grad_norm},
        {"bf16", t.bf16},
        {"seed", t.seed},
        {"optimizer_compression", t.optimizer_compression},
        {"offload_dir", t.offload_dir},
        {"offload_staging_stages", t.offload_staging_stages},
        {"offload_io_threads", t.offload_io_threads},
        {"offload_params", t.offload_params},
        {"save_steps", t.save_steps},
        {"save_total_limit", t.save_total_limit},
        {"resume_from_checkpoint", t.resume_from_checkpoint},
        {"resume_fallback", t.resume_fallback},
        {"save_minutes", t.save_minutes},
        {"save_snapshot_mib", t.save_snapshot_mib},
        {"stop_after_steps", t.stop_after_steps},
        {"eval_steps", t.eval_steps},
        {"eval_max_batches", t.eval_max_batches},
        {"export_hf_dir", t.export_hf_dir}}},
      {"model",
       {{"config_file", m.config_file},
        {"model_name_or_path", m.model_name_or_path},
        {"arch", m.arch},
        {"hidden_size", m.hidden_size},
        {"layers", m.layers},
        {"heads", m.heads},
        {"kv_heads", m.kv_heads},
        {"head_dim", m.head_dim},
        {"intermediate_size", m.intermediate_size},
        {"vocab_size", m.vocab_size},
        {"max_position_embeddings", m.max_position_embeddings},
        {"rope_theta", m.rope_theta},
        {"norm_eps", m.norm_eps},
        {"tie_word_embeddings", m.tie_word_embeddings},
        {"initializer_range", m.initializer_range}}},
      {"data",
       {{"train_files", d.train_files},
        {"validation_files", d.validation_files},
        {"tokenizer_file", d.tokenizer_file},
        {"seq_length", d.seq_length},
        {"packing", d.packing}}},
      {"device",
       {{"backend", v.backend},
        {"max_vram_gb", v.max_vram_gb},
        {"weight_slots", v.weight_slots},
        {"grad_slots", v.grad_slots},
        {"keep_intermediates", v.keep_intermediates},
        {"prefetch_depth", v.prefetch_depth},
        {"schedule", v.schedule},
        {"gpus", v.gpus},
        {"seq_tile", v.seq_tile},
        {"attention_kv", v.attention_kv}}},
      {"threads",
       {{"total", th.total},
        {"blas", th.blas},
        {"optimizer", th.optimizer},
        {"copy", th.copy},
        {"scheduler", th.scheduler},
        {"adapt_to_load", th.adapt_to_load}}},
      {"log", {{"train_jsonl", l.train_jsonl}, {"events_jsonl", l.events_jsonl}, {"logging_steps", l.logging_steps}}},
  };
}

nlohmann::json evaluations_json(const std::vector<EvalRecord>& evals) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& e : evals)
    a.push_back({{"step", e.step},
                 {"loss", e.loss},
                 {"perplexity", e.perplexity},
                 {"tokens", e.tokens},
                 {"batches", e.batches},
                 {"seconds", e.seconds}});
  return a;
}

std::vector<EvalRecord> evaluations_from_json(const nlohmann::json& j) {
  std::vector<EvalRecord> out;
  if (!j.is_array()) return out;
  for (const auto& e : j) {
    EvalRecord r;
    r.step = e.at("step").get<std::int64_t>();
    r.loss = e.at("loss").get<double>();
    r.perplexity = e.at("perplexity").get<double>();
    r.tokens = e.at("tokens").get<std::int64_t>();
    r.batches = e.at("batches").get<std::int64_t>();
    r.seconds = e.at("seconds").get<double>();
    out.push_back(r);
  }
  return out;
}

nlohmann::json make_run_state(const TrainConfig& cfg, const nlohmann::json& data_cursor, std::int64_t step,
                              std::int64_t micro_batches, const HostModel& host, const nlohmann::json& evaluations) {
  const std::uint64_t g = static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(micro_batches);
  nlohmann::json versions = nlohmann::json::array();
  // The version of the state saved, which is `step` for every stage (the checkpointer writes stage s only
  // at that version), not the live tiles': during training the optimizer may already have moved some on.
  for (std::int64_t s = 0; s < host.num_stages(); ++s) versions.push_back(step);
  nlohmann::json run{
      {"format", "megatrain-run-state"},
      {"format_version", 1},
      {"step", step},
      {"optimizer_step", step},
      {"lr_schedule",
       {{"type", cfg.train.lr_scheduler_type},
        {"learning_rate", cfg.train.learning_rate},
        {"warmup_steps", cfg.train.warmup_steps},
        {"max_steps", cfg.train.max_steps},
        {"min_lr_ratio", cfg.train.min_lr_ratio},
        {"next_lr", cfg.learning_rate_at(step)}}},
      {"data", {{"micro_batches_per_step", micro_batches}, {"global_batch_index", g}, {"cursor", data_cursor}}},
      {"rng",
       {{"seed", cfg.train.seed},
        {"note", "random numbers are drawn only at initialisation (no dropout); data order = f(seed, cursor)"}}},
      {"tile_versions", versions},
      {"train_config", train_config_json(cfg)},
      {"model_name_or_path", cfg.model.model_name_or_path},
      {"evaluations", evaluations},
  };
  // The fp32 products' libraries and the path the bf16 products ran on (fixed for the process by now)
  // and the attention's products: a resume keeps them, and so its bits.
  if (cfg.device.backend == "cpu") {
    nlohmann::json fp32 = nlohmann::json::object();
    const cpu::Fp32GemmChoice c = cpu::fp32_gemm_choice();
    for (int i = 0; i < cpu::kLinearProducts; ++i)
      fp32[cpu::linear_product_name(static_cast<cpu::LinearProduct>(i))] = cpu::fp32_gemm_name(c.lib[i]);
    for (const auto& sh : c.shapes)  // the layer shapes whose library differs (plan/kernel_choice.cpp reads them)
      fp32["shapes"].push_back({{"product", cpu::linear_product_name(sh.product)},
                                {"in", sh.in},
                                {"out", sh.out},
                                {"lib", cpu::fp32_gemm_name(sh.lib)}});
    run["kernel_choices"] = {{"fp32_gemm", fp32}};
    if (cfg.precision() == Precision::bf16)
      run["kernel_choices"].update({{"bf16_gemm", cpu::bf16_gemm_name(cpu::bf16_gemm_path())},
                                    {"bf16_attention", cpu::attn_products_name(cpu::bf16_attention_products())}});
  }
  return run;
}

std::filesystem::path resume_path(const TrainConfig& cfg, const std::filesystem::path& root) {
  const std::string& r = cfg.train.resume_from_checkpoint;
  return r == "latest" ? root : std::filesystem::path(r);
}

namespace {

// Training keys whose change makes the continued run differ from the uninterrupted one.
std::vector<std::string> changed_keys(const nlohmann::json& saved, const nlohmann::json& now) {
  std::vector<std::string> out;
  static const char* const keys[][2] = {{"train", "per_device_train_batch_size"},
                                        {"train", "gradient_accumulation_steps"},
                                        {"train", "max_steps"},
                                        {"train", "learning_rate"},
                                        {"train", "lr_scheduler_type"},
                                        {"train", "warmup_steps"},
                                        {"train", "min_lr_ratio"},
                                        {"train", "weight_decay"},
                                        {"train", "adam_beta1"},
                                        {"train", "adam_beta2"},
                                        {"train", "adam_epsilon"},
                                        {"train", "max_grad_norm"},
                                        {"train", "bf16"},
                                        {"train", "seed"},
                                        {"data", "train_files"},
                                        {"data", "seq_length"},
                                        {"data", "packing"}};
  for (const auto& k : keys) {
    if (!saved.contains(k[0]) || !saved[k[0]].contains(k[1])) continue;
    const auto& a = saved[k[0]][k[1]];
    const auto& b = now.at(k[0]).at(k[1]);
    if (a != b)
      out.push_back(std::string(k[0]) + "." + k[1] + " is " + b.dump() + ", the checkpoint's run had " + a.dump() +
                    " (the continued run will differ from an uninterrupted one)");
  }
  return out;
}

}  // namespace

ResumePoint load_checkpoint(const std::filesystem::path& path, bool fallback_previous_good, const TrainConfig& cfg,
                            const ModelConfig& model, HostModel& host, BatchSource* data) {
  const auto reader = ckpt::CheckpointReader::open(
      path, fallback_previous_good ? ckpt::Fallback::previous_good : ckpt::Fallback::none, ckpt::Verify::full);
  const nlohmann::json want = hf::config_to_json(model);
  const nlohmann::json have = hf::config_to_json(reader.model_config());
  if (want != have)
    throw std::runtime_error("checkpoint " + reader.dir().string() + " holds another model: its config is " +
                             have.dump() + ", this run's model is " + want.dump());
  const bool moments = reader.has_state("exp_avg") && reader.has_state("exp_avg_sq");
  ResumePoint rp;
  rp.dir = reader.dir();
  rp.step = moments ? reader.step() : 0;  // an imported (params-only) checkpoint starts a new run
  rp.skipped = reader.skipped();
  rp.run_state = reader.manifest().contains("run") ? reader.run_state() : nlohmann::json::object();
  for (std::int64_t s = 0; s < host.num_stages(); ++s) {
    HostTile& t = host.tile(s);
    if (t.version() > static_cast<std::uint64_t>(rp.step))
      throw std::logic_error("load_checkpoint: the host model is not freshly initialised");
    if (moments && !host.owns(s)) {  // a stage another rank owns (cluster.shard_state): its masters only
      host.set_masters(s, [&](float* masters) { reader.read_stage(s, masters); });  // (bf16: rounded)
    } else if (moments) {
      if (t.has_grad()) std::memset(t.grad(), 0, t.region_bytes());
      // The tile's regions, or a staged stage written back (not read first: every value is replaced).
      StateLease state(host, s, MomentLease::Use::overwrite);
      reader.read_stage(s, state.master(), state.m(), state.v());
      state.mark_modified();  // split masters: split into the tile now (a v no update makes is refused)
    } else {
      host.set_masters(s, [&](float* masters) { reader.read_stage(s, masters); });
    }
    t.publish_version(static_cast<std::uint64_t>(rp.step));
  }
  if (rp.run_state.contains("train_config"))
    rp.notes = changed_keys(rp.run_state["train_config"], train_config_json(cfg));
  if (data != nullptr && rp.step > 0) {
    const std::uint64_t g =
        static_cast<std::uint64_t>(rp.step) * static_cast<std::uint64_t>(cfg.train.gradient_accumulation_steps);
    nlohmann::json cursor = nullptr;
    if (rp.run_state.contains("data")) {
      const auto& d = rp.run_state["data"];
      if (d.value("global_batch_index", g) == g && d.contains("cursor")) cursor = d["cursor"];
    }
    data->restore(g, cursor);
  }
  return rp;
}

nlohmann::json load_hf_weights(const std::filesystem::path& dir, HostModel& host) {
  hf::HfModelReader reader(dir);
  ModelConfig theirs = reader.config();  // the load-balancing loss is a training switch, not the model's shape
  theirs.output_router_logits = host.config().output_router_logits;
  theirs.router_aux_loss_coef = host.config().router_aux_loss_coef;
  if (hf::config_to_json(theirs) != hf::config_to_json(host.config()))
    throw std::runtime_error("model " + dir.string() + ": config.json does not match the host model");
  for (std::int64_t s = 0; s < host.num_stages(); ++s) {
    host.set_masters(s, [&](float* masters) { reader.read_stage(s, masters); });
  }
  return reader.config_json();
}

void export_hf(const std::filesystem::path& dir, const HostModel& host, const std::string& base_config_json,
               const FetchMasters& fetch) {
  hf::HfExportOptions o;
  nlohmann::json base;
  if (!base_config_json.empty()) {
    base = nlohmann::json::parse(base_config_json);
    o.base_config = &base;
  }
  // The masters of one stage at a time: the tile's, or a copy out of the store (train.offload_params).
  std::vector<float> staged;
  std::int64_t staged_stage = -1;
  hf::write_hf_model(
      dir, host.config(),
      [&](std::int64_t s) -> const float* {
        if (host.masters_in_tiles() && host.holds_masters(s)) return host.tile(s).params();
        if (s != staged_stage) {
          if (host.holds_masters(s)) {
            host.read_masters(s, [&](const float* m) { staged.assign(m, m + host.tile(s).floats()); });
          } else {
            if (!fetch) throw std::logic_error("export_hf: stage " + std::to_string(s) + "'s masters are elsewhere");
            staged.resize(host.tile(s).floats());
            fetch(s, staged.data());
          }
          staged_stage = s;
        }
        return staged.data();
      },
      o);
}

}  // namespace mt::actors
