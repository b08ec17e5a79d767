#include "actors/monitor_publish.hpp"

#include <chrono>

namespace mt::actors {

void publish_pipeline_start(Context& ctx) {
  monitor::StatusBoard& board = ctx.monitor->board();
  for (int a = 0; a < monitor::kActorCount; ++a)
    for (int d = 0; d < ctx.devices; ++d)
      board.probe(static_cast<monitor::ActorId>(a), d).set_state(monitor::ActorState::running);
}

std::string model_description(const TrainConfig& cfg, const ModelConfig& model) {
  if (!cfg.model.model_name_or_path.empty()) return cfg.model.model_name_or_path;
  if (!cfg.model.config_file.empty()) return cfg.model.config_file;
  return std::string(arch_name(model.arch)) + " (hidden " + std::to_string(model.hidden_size) + ", from [model] keys)";
}

nlohmann::json step_record_json(const StepRecord& r) {
  nlohmann::json j = {{"step", r.step},
                      {"loss", r.loss},
                      {"lr", r.lr},
                      {"grad_norm", r.grad_norm},
                      {"clip", r.clip},
                      {"tokens", r.tokens},
                      {"tokens_per_s", r.tokens_per_s},
                      {"step_s", r.step_s},
                      {"wait_weights_s", r.wait_weights_s},
                      {"compute_s", r.compute_s},
                      {"offload_s", r.offload_s},
                      {"optimizer_s", r.optimizer_s},
                      {"checkpoint_wait_s", r.checkpoint_wait_s},
                      {"restarts", r.restarts},
                      {"compute_threads", r.compute_threads},
                      {"others_cores", r.others_cores}};
  if (r.reduce_s > 0) {  // several ranks: the reduction's time, and what the backward did not hide
    j["reduce_s"] = r.reduce_s;
    j["reduce_tail_s"] = r.reduce_tail_s;
  }
  return j;
}

void publish_step(Context& ctx, const StepRecord& r) {
  monitor::Monitor& mon = *ctx.monitor;
  const LinkStats link = ctx.backend->link_stats();
  const std::uint64_t h2d = link.of(LinkDirection::host_to_device).bytes;
  const std::uint64_t d2h = link.of(LinkDirection::device_to_host).bytes;
  const double now = monitor::unix_seconds();
  const double params = static_cast<double>(mon.board().run_info().params);
  mon.board().update([&](monitor::RunFigures& f) {
    if (r.step_s > 0) {
      f.h2d_bytes_per_s = static_cast<double>(h2d - std::min(h2d, f.h2d_at_last_step)) / r.step_s;
      f.d2h_bytes_per_s = static_cast<double>(d2h - std::min(d2h, f.d2h_at_last_step)) / r.step_s;
    }
    f.h2d_at_last_step = h2d;
    f.d2h_at_last_step = d2h;
    f.step = r.step;
    f.tokens += r.tokens;
    f.loss = r.loss;
    f.lr = r.lr;
    f.grad_norm = r.grad_norm;
    f.tokens_per_s = r.tokens_per_s;
    f.model_flops_per_s = 6.0 * params * r.tokens_per_s;
    f.last_step_unix = now;
    f.h2d_bytes = h2d;
    f.d2h_bytes = d2h;
    f.checkpoint_wait_s += r.checkpoint_wait_s;
  });
  nlohmann::json rec = step_record_json(r);
  rec["t"] = now;
  rec["h2d_bytes"] = h2d;
  rec["d2h_bytes"] = d2h;
  mon.events().append("step", rec);
  mon.board().add_history(std::move(rec));
}

void publish_live(Context& ctx, double paused_s, double restart_s) {
  const LinkStats link = ctx.backend->link_stats();
  const ArenaUsage arena = ctx.arena->usage();
  // Each pipeline segment (training between evaluations) has its own clock and controller; the run's
  // figures span them all.
  const std::int64_t segment = ctx.t0.time_since_epoch().count();
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  ctx.monitor->board().update([&](monitor::RunFigures& f) {
    f.h2d_bytes = std::max<std::uint64_t>(f.h2d_bytes, link.of(LinkDirection::host_to_device).bytes);
    f.d2h_bytes = std::max<std::uint64_t>(f.d2h_bytes, link.of(LinkDirection::device_to_host).bytes);
    f.arena_in_use = arena.in_use_bytes;
    f.arena_peak = arena.peak_bytes;
    f.arena_budget = arena.budget_bytes;
    if (f.segment_started != segment) {
      if (f.run_started == 0) f.run_started = segment;
      f.segment_started = segment;
      f.paused_before_s = f.paused_s;
      f.restart_before_s = f.restart_s;
    }
    f.wall_s = std::chrono::duration<double>(now - std::chrono::steady_clock::duration(f.run_started)).count();
    f.paused_s = f.paused_before_s + paused_s;
    f.restart_s = f.restart_before_s + restart_s;
  });
  // Several ranks: this rank's own entry of "ranks" live (what it waits for now), between gathers.
  if (ctx.world != nullptr && ctx.ranks > 1) {
    const auto t = ctx.world->last_transfer();
    ctx.monitor->board().set_rank_live(ctx.world->rank(), t ? transfer_json(*t) : nlohmann::json(nullptr));
  }
}

nlohmann::json transfer_json(const cluster::TransferView& t) {
  return {{"channel", cluster::channel_name(t.channel)},
          {"peer", t.peer},
          {"what", t.what},
          {"sending", t.sending},
          {"done", t.done},
          {"seconds", t.seconds}};
}

nlohmann::json actors_json(const monitor::StatusBoard& board) { return board.status_json()["actors"]; }

}  // namespace mt::actors
