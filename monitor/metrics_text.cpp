#include "monitor/metrics_text.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace mt::monitor {

namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;

void gauge(prometheus::Registry& r, const char* name, const char* help, double v) {
  BuildGauge().Name(name).Help(help).Register(r).Add({}).Set(v);
}

void counter(prometheus::Registry& r, const char* name, const char* help, double v) {
  BuildCounter().Name(name).Help(help).Register(r).Add({}).Increment(v);
}

}  // namespace

std::string metrics_text(const StatusBoard& board) {
  // A fresh registry per scrape, filled from one snapshot of the board: the board stays the only
  // state, and each scrape is consistent with itself.
  const RunInfo info = board.run_info();
  const RunFigures f = board.figures();
  prometheus::Registry r;
  gauge(r, "megatrain_step", "Optimizer steps done (tile versions)", static_cast<double>(f.step));
  gauge(r, "megatrain_max_steps", "Optimizer steps the run is configured for", static_cast<double>(info.max_steps));
  counter(r, "megatrain_tokens_total", "Tokens trained on by this process (counted targets)",
          static_cast<double>(f.tokens));
  gauge(r, "megatrain_loss", "Mean loss of the last step", f.loss);
  gauge(r, "megatrain_learning_rate", "Learning rate of the last step", f.lr);
  gauge(r, "megatrain_grad_norm", "Global gradient norm of the last step (before clipping)", f.grad_norm);
  gauge(r, "megatrain_tokens_per_second", "Tokens per second of the last step", f.tokens_per_s);
  gauge(r, "megatrain_model_flops_per_second", "Model FLOP/s of the last step (6 x parameters x tokens/s)",
        f.model_flops_per_s);
  auto& link = BuildCounter()
                   .Name("megatrain_link_bytes_total")
                   .Help("Bytes moved over the host-device link, per direction")
                   .Register(r);
  link.Add({{"direction", "h2d"}}).Increment(static_cast<double>(f.h2d_bytes));
  link.Add({{"direction", "d2h"}}).Increment(static_cast<double>(f.d2h_bytes));
  auto& busy = BuildCounter()
                   .Name("megatrain_actor_busy_seconds_total")
                   .Help("Seconds each actor spent inside message handlers")
                   .Register(r);
  auto& wait = BuildCounter()
                   .Name("megatrain_actor_wait_seconds_total")
                   .Help("Seconds each actor spent waiting on its mailbox between handlers")
                   .Register(r);
  auto& depth = BuildGauge()
                    .Name("megatrain_actor_mailbox_depth")
                    .Help("Messages waiting in each actor's mailbox when its last handler started")
                    .Register(r);
  auto& restarts = BuildCounter()
                       .Name("megatrain_actor_restarts_total")
                       .Help("Restarts of each actor (failures, watchdog and on-demand restarts)")
                       .Register(r);
  const std::int64_t now = steady_ns();
  for (const auto& [name, probe] : board.named_probes()) {
    const ActorProbe::View v = probe->view(now);
    const prometheus::Labels l{{"actor", name}};
    busy.Add(l).Increment(v.busy_s);
    wait.Add(l).Increment(v.wait_s);
    depth.Add(l).Set(static_cast<double>(v.mailbox));
    restarts.Add(l).Increment(static_cast<double>(v.restarts));
  }
  counter(r, "megatrain_checkpoints_total", "Checkpoints published by this process",
          static_cast<double>(f.checkpoints));
  counter(r, "megatrain_checkpoint_bytes_total", "Bytes of the checkpoints published by this process",
          static_cast<double>(f.checkpoint_bytes));
  counter(r, "megatrain_checkpoint_seconds_total", "Seconds from checkpoint request to publish, summed",
          f.checkpoint_seconds);
  gauge(r, "megatrain_arena_bytes_in_use", "Device arena bytes in use", static_cast<double>(f.arena_in_use));
  gauge(r, "megatrain_arena_peak_bytes", "Device arena peak bytes in use", static_cast<double>(f.arena_peak));
  gauge(r, "megatrain_host_resident_bytes", "Resident set size of the process",
        static_cast<double>(host_resident_bytes()));
  gauge(r, "megatrain_last_step_timestamp_seconds", "Unix time the last step finished (0 = none yet)",
        f.last_step_unix);
  gauge(r, "megatrain_goodput_ratio",
        "Share of wall time not spent paused, waiting for checkpoints or restarting actors", f.goodput());
  gauge(r, "megatrain_paused", "1 while the run is paused by a control request", f.state == RunState::paused ? 1 : 0);
  return prometheus::TextSerializer().Serialize(r.Collect());
}

}  // namespace mt::monitor
