// The node's run controller: what the pipeline reports goes here (Peers::node). It assembles the
// per-step progress record from the actors' reports, honours the stop flag (SIGINT/SIGTERM: finish the
// step in progress, then stop), turns checkpoint requests (SIGUSR1, the train.save_minutes timer, the
// monitor) into CheckpointRequests, asks the checkpointer for the final checkpoint once every step is
// done, reports each CheckpointDone / CheckpointFailed, collects an evaluation pass's losses, carries
// out the monitor's control requests (on its tick) and runs the progress watchdog. Restarts are the
// supervisor's (supervisor.cpp): requests that must survive one (the stop step, a pause, a checkpoint
// request, a restart of a named actor) go through it.
// Modes are behaviours: `running` until the run ends, then `ended` (the supervisor stops every actor
// and finally this one; nothing is acted on meanwhile). A pause is a flag, not a mode: compute decides
// where it holds, and every message is handled the same while paused.
#include <algorithm>
#include <cmath>
#include <optional>

#include "actors/actors.hpp"
#include "actors/monitor_publish.hpp"
#include "device/cpu/core_share.hpp"

namespace mt::actors {
namespace {

struct StepReports {
  bool compute = false, optimizer = false;
  int computes_done = 0;  // devices whose compute finished the step
  ComputeStepDone c;
  OptimizerStepDone o;
  double offload_s = 0.0;
  double reduce_s = 0.0, reduce_tail_s = 0.0;
};

struct run_controller_state {
  Context* ctx = nullptr;
  EngineResult* result = nullptr;  // everything but restarts and restart_log (the supervisor's)
  monitor::Monitor* mon = nullptr;
  supervisor_actor supervisor;
  PeerHandles h;  // the supervisor's last Peers
  // --- progress records ---------------------------------------------------------------------------
  std::int64_t end_step = 0;
  std::int64_t next_report = 0;  // the next step whose progress record is due
  std::map<std::int64_t, StepReports> reports;
  Clock::time_point last_done;
  std::int64_t restarts = 0;  // the supervisor's count (RestartStatus)
  // The handler that ended the run finishes with the `ended` behaviour already set; this stops the
  // rest of that handler from acting (become() only changes the handlers of later messages).
  bool ended = false;
  // --- stop ---------------------------------------------------------------------------------------
  bool stop_requested = false;                         // StopAt asked of every compute
  bool control_stop = false;                           // POST /control/stop
  std::vector<monitor::ControlRequest> stop_controls;  // reported at StopAt (took_effect) and the end
  // --- checkpoints --------------------------------------------------------------------------------
  Clock::time_point last_checkpoint;       // for train.save_minutes
  std::optional<std::int64_t> final_step;  // the end-of-run checkpoint asked for (the version it holds)
  std::vector<monitor::ControlRequest> checkpoint_controls;  // until the optimizer takes the request
  std::map<std::int64_t, std::vector<monitor::ControlRequest>> durable_controls;  // checkpoint step -> waiting
  std::string budget_error;           // the restart budget ran out: the run's error once the final checkpoint is done
  Clock::time_point budget_deadline;  // ... and the final checkpoint is given up when no consistent step by then
  // --- evaluation: each micro-batch's loss (compute's LossReports; a re-sent one overwrites) ------
  std::map<std::int64_t, std::pair<double, std::int64_t>> eval_losses;
  // --- pause --------------------------------------------------------------------------------------
  std::vector<monitor::ControlRequest> pause_controls;  // until compute holds
  bool pause_requested = false;                         // a PauseRequest is in force (no wake since)
  std::uint64_t pause_id = 0;                           // its number
  std::int64_t held_at = -1;                            // the step a compute holds before for it (-1: none yet)
  bool paused = false;                                  // held, and every step before it reported
  Clock::time_point paused_since;
  double paused_s = 0.0;
  // --- restarts as the supervisor reports them; the watchdog --------------------------------------
  std::optional<Clock::time_point> restart_began;
  double restart_s = 0.0;
  Clock::time_point last_progress;
  std::string last_compute_unit;  // the watchdog: compute's last finished op (an op is progress too)
  int watchdog_level = 0;
  // --- cores other processes take (threads.adapt_to_load) -----------------------------------------
  std::unique_ptr<CoreShareMeter> core_meter;
  std::optional<ThreadsForShare> core_threads;
  double others_cores = 0.0;
  static constexpr const char* name = "node";
};

using self_ptr = node_actor::stateful_pointer<run_controller_state>;

int device_count(const run_controller_state& st) { return st.ctx->devices; }

node_actor::behavior_type ended(self_ptr self);

// The run is over: report the control requests that can no longer take effect and the stop requests'
// outcome, then ask the supervisor to stop every actor (this one last).
void end_run(self_ptr self) {
  auto& st = self->state;
  if (st.ended) return;
  st.ended = true;
  st.mon->board().update([&](monitor::RunFigures& f) { f.state = monitor::RunState::stopping; });
  auto refuse = [&](const monitor::ControlRequest& c) {
    st.mon->control_progress(c, "failed", {{"error", "the run ended first"}});
  };
  for (const auto& c : st.checkpoint_controls) refuse(c);
  for (const auto& kv : st.durable_controls)
    for (const auto& c : kv.second) refuse(c);
  for (const auto& c : st.pause_controls) refuse(c);
  st.checkpoint_controls.clear();
  st.durable_controls.clear();
  st.pause_controls.clear();
  for (const auto& c : st.stop_controls) {
    nlohmann::json extra{{"step", st.next_report}};
    const auto& cps = st.result->checkpoints;
    if (!cps.empty() && cps.back().ok && cps.back().step == st.next_report)
      extra.update({{"path", cps.back().path}, {"bytes", cps.back().bytes}, {"seconds", cps.back().seconds}});
    st.mon->control_progress(c, st.result->error.empty() ? "durable" : "failed", extra);
  }
  st.stop_controls.clear();
  self->send(st.supervisor, shutdown_atom::value);
  self->become(ended(self));
}

void fail(self_ptr self, const std::string& what) {
  if (self->state.result->error.empty()) self->state.result->error = what;
  self->state.mon->board().update([&](monitor::RunFigures& f) { f.last_error = self->state.result->error; });
  end_run(self);
}

// The final checkpoint is done: end the run (with the restart budget's error, when that ended it).
void final_done(self_ptr self) {
  if (!self->state.budget_error.empty())
    fail(self, self->state.budget_error);
  else
    end_run(self);
}

// Every step is done: write the final checkpoint (when checkpointing and this run did a step), then
// end once it is published or failed.
void finish(self_ptr self) {
  auto& st = self->state;
  if (st.ended || st.final_step) return;
  const Context* ctx = st.ctx;
  // An evaluation pass holds the weights of version first_step; a training run those of end_step.
  // A run stopped by the stop flag always writes its final checkpoint.
  const bool eval = ctx->sched.is_forward_only();
  const bool stop_flag = (ctx->job->stop != nullptr && ctx->job->stop->load()) || st.control_stop;
  const bool wanted = ctx->job->checkpoint.at_end || st.result->stopped_early || stop_flag;
  if (ctx->checkpointing && wanted && (eval || st.end_step > ctx->first_step) && st.result->error.empty()) {
    st.final_step = eval ? ctx->first_step : st.end_step;
    self->send(st.h.checkpointer, CheckpointNow{*st.final_step});
    return;
  }
  end_run(self);
}

void on_checkpoint(self_ptr self, const CheckpointEvent& ev) {
  auto& st = self->state;
  const bool final_one = st.final_step && ev.step == *st.final_step;
  // The final CheckpointNow of a checkpoint already published (the planned last step) is answered
  // with its CheckpointDone again: report each checkpoint once.
  bool repeat = false;
  for (const auto& c : st.result->checkpoints)
    repeat = repeat || (c.ok && ev.ok && c.step == ev.step && c.path == ev.path);
  if (repeat) {
    if (final_one) final_done(self);
    return;
  }
  st.result->checkpoints.push_back(ev);
  st.last_checkpoint = Clock::now();
  if (ev.ok) {
    st.mon->board().update([&](monitor::RunFigures& f) {
      ++f.checkpoints;
      f.checkpoint_bytes += ev.bytes;
      f.checkpoint_seconds += ev.seconds;
      f.last_checkpoint = monitor::CheckpointFigures{ev.step, ev.path, ev.bytes, ev.seconds};
    });
    st.mon->events().append("checkpoint_saved", {{"step", ev.step},
                                                 {"path", ev.path},
                                                 {"bytes", ev.bytes},
                                                 {"seconds", ev.seconds},
                                                 {"cpu_seconds", ev.cpu_seconds}});
  } else {
    st.mon->events().append("checkpoint_failed", {{"step", ev.step}, {"error", ev.error}});
  }
  auto waiting = st.durable_controls.find(ev.step);
  if (waiting != st.durable_controls.end()) {
    for (const auto& c : waiting->second)
      if (ev.ok)
        st.mon->control_progress(c, "durable",
                                 {{"step", ev.step}, {"path", ev.path}, {"bytes", ev.bytes}, {"seconds", ev.seconds}});
      else
        st.mon->control_progress(c, "failed", {{"step", ev.step}, {"error", ev.error}});
    st.durable_controls.erase(waiting);
  }
  if (st.ctx->job->on_checkpoint) {
    try {
      st.ctx->job->on_checkpoint(ev);
    } catch (const std::exception& e) {
      fail(self, std::string("checkpoint report failed: ") + e.what());
      return;
    }
  }
  if (final_one) final_done(self);
}

// An evaluation pass is done when compute has run its one step: the losses are all in.
void finish_evaluation(self_ptr self) {
  auto& st = self->state;
  EvalRecord rec;
  rec.step = st.ctx->first_step;
  double sum = 0.0;
  for (const auto& kv : st.eval_losses) {
    sum += kv.second.first;
    rec.tokens += kv.second.second;
  }
  rec.batches = static_cast<std::int64_t>(st.eval_losses.size());
  rec.loss = rec.tokens > 0 ? sum / static_cast<double>(rec.tokens) : 0.0;
  rec.perplexity = std::exp(rec.loss);
  rec.seconds = seconds_between(st.last_done, Clock::now());
  st.result->evaluations.push_back(rec);
  st.ctx->job->evaluations.push_back(rec);  // before the end-of-run checkpoint: its run state holds it
  if (st.ctx->job->on_eval) {
    try {
      st.ctx->job->on_eval(rec);
    } catch (const std::exception& e) {
      fail(self, std::string("evaluation report failed: ") + e.what());
      return;
    }
  }
  st.reports.clear();
  st.next_report = st.end_step;
  finish(self);
}

// threads.adapt_to_load: after each step, the cores other processes took since the last window
// (device/cpu/core_share.hpp); two windows in a row that leave fewer (or again more) cores change the
// host threads compute and the optimizer use from their next unit of work on, said once per change on
// the progress line, in the events log and in /status.
void adapt_threads(self_ptr self, StepRecord& rec) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  const int planned = std::max(ctx->plan.threads.blas, ctx->optimizer_threads);
  rec.compute_threads = ctx->granted(ctx->plan.threads.blas);
  rec.others_cores = st.others_cores;
  if (!ctx->cfg->threads.adapt_to_load) return;
  if (!st.core_meter) {
    st.core_meter = std::make_unique<CoreShareMeter>();
    st.core_threads.emplace(planned);
    return;
  }
  const std::optional<CoreShare> share = st.core_meter->sample();
  if (!share) return;
  st.others_cores = rec.others_cores = share->others_cores;
  const int before = st.core_threads->current();
  const int now = st.core_threads->update(*share);
  st.mon->board().update([&](monitor::RunFigures& f) {
    f.cores = share->cores;
    f.host_threads = now;
    f.others_cores = share->others_cores;
    f.steal_cores = share->steal_cores;
    f.losing_cores = now < planned;
  });
  if (now == before) return;
  ctx->threads_granted.store(now >= planned ? 0 : now, std::memory_order_relaxed);
  char note[256];
  if (now < before)
    std::snprintf(
        note, sizeof note,
        "other processes are taking %.1f of this run's %d cores (steal %.1f): %d host thread(s) instead of %d "
        "until they free them (threads.adapt_to_load)",
        share->others_cores, share->cores, share->steal_cores, now, planned);
  else
    std::snprintf(note, sizeof note, "cores free again (others take %.1f of %d): %d host thread(s)",
                  share->others_cores, share->cores, now);
  rec.cores_note = note;
  st.mon->events().append("cores", {{"step", rec.step},
                                    {"host_threads", now},
                                    {"planned_threads", planned},
                                    {"cores", share->cores},
                                    {"others_cores", share->others_cores},
                                    {"steal_cores", share->steal_cores}});
}

void emit_ready_steps(self_ptr self) {
  auto& st = self->state;
  if (st.ctx->sched.is_forward_only()) {
    auto it = st.reports.find(st.next_report);
    if (it != st.reports.end() && it->second.compute) finish_evaluation(self);
    return;
  }
  const std::int64_t first = st.next_report;
  while (true) {
    auto it = st.reports.find(st.next_report);
    if (it == st.reports.end() || !it->second.compute || !it->second.optimizer) break;
    const StepReports& r = it->second;
    const auto now = Clock::now();
    StepRecord rec;
    rec.step = r.o.step + 1;
    rec.loss = r.o.loss;
    rec.lr = r.o.lr;
    rec.grad_norm = r.o.grad_norm;
    rec.clip = r.o.clip;
    rec.tokens = r.o.counted;
    rec.step_s = seconds_between(st.last_done, now);
    const std::int64_t tokens_seen = st.ctx->plan.batch * st.ctx->plan.seq * st.ctx->plan.micro_batches;
    rec.tokens_per_s = rec.step_s > 0 ? static_cast<double>(tokens_seen) / rec.step_s : 0.0;
    rec.wait_weights_s = r.c.wait_weights_s;
    rec.compute_s = r.c.compute_s;
    rec.offload_s = r.offload_s;
    rec.reduce_s = r.reduce_s;
    rec.reduce_tail_s = r.reduce_tail_s;
    rec.optimizer_s = r.o.optimizer_s;
    rec.checkpoint_wait_s = r.o.checkpoint_wait_s;
    rec.restarts = st.restarts;
    adapt_threads(self, rec);
    st.last_done = now;
    st.last_progress = now;
    st.watchdog_level = 0;
    st.result->steps.push_back(rec);
    publish_step(*st.ctx, rec);
    if (st.ctx->job->on_step) {
      try {
        st.ctx->job->on_step(rec);
      } catch (const std::exception& e) {
        fail(self, std::string("progress output failed: ") + e.what());
      }
    }
    st.reports.erase(it);
    ++st.next_report;
  }
  if (st.next_report != first) self->send(st.supervisor, Progress{st.next_report, st.end_step});
  if (st.next_report >= st.end_step) finish(self);
}

// After the restart budget ran out: once the tiles hold one version (no step half applied; the
// optimizer finishes a step it has begun), write the final checkpoint of it, then stop with the error.
// Called on each tick until then; gives up on the checkpoint after 10 s.
void budget_final_checkpoint(self_ptr self) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  if (st.budget_error.empty() || st.final_step || st.ended) return;
  std::uint64_t lo = ~std::uint64_t{0}, hi = 0;
  for (std::int64_t s = 0; s < ctx->stages(); ++s) {
    lo = std::min(lo, ctx->host->tile(s).version());
    hi = std::max(hi, ctx->host->tile(s).version());
  }
  const auto v = static_cast<std::int64_t>(lo);
  // With the host state sharded a checkpoint needs every rank's part, and this rank is ending alone.
  const bool checkpointing = ctx->checkpointing && ctx->shard_world == nullptr;
  if (checkpointing && lo == hi && v > ctx->first_step) {
    st.end_step = v;
    st.final_step = v;
    self->send(st.supervisor, Progress{st.next_report, v});  // a Resume after this one ends at v too
    ctx->gate.open(v, ctx->stages());  // the optimizer may not move a stage past v before it is written
    self->send(st.h.checkpointer, CheckpointNow{v});
    return;
  }
  if (checkpointing && lo != hi && Clock::now() < st.budget_deadline) return;  // a step is being applied
  fail(self, st.budget_error + (checkpointing ? " (no final checkpoint: the tiles did not reach one version; "
                                                "the last published checkpoint is the one to resume from)"
                                              : ""));
}

// Asks the optimizer, through the supervisor, for a checkpoint at its next decision (CheckpointTaken
// answers which one).
void request_checkpoint(self_ptr self) { self->send(self->state.supervisor, CheckpointRequest{}); }

// Asks every compute, through the supervisor, to hold before its next step (PauseHeld answers where).
void request_pause(self_ptr self) {
  auto& st = self->state;
  if (st.pause_requested) return;
  st.pause_requested = true;
  ++st.pause_id;
  st.held_at = -1;
  self->send(st.supervisor, PauseRequest{st.pause_id});
}

// Lifts the pause request (held or not): every compute continues. False when none was in force.
bool lift_pause(self_ptr self) {
  auto& st = self->state;
  if (!st.pause_requested) return false;
  st.pause_requested = false;
  st.held_at = -1;
  self->send(st.supervisor, wake_atom::value);
  return true;
}

// A control request from the monitor (POST /control/...), carried out between the controller's messages.
void handle_control(self_ptr self, const monitor::ControlRequest& c) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  monitor::Monitor& mon = *st.mon;
  auto failed = [&](const std::string& why) { mon.control_progress(c, "failed", {{"error", why}}); };
  if (st.ended || (st.stop_requested && c.action != "stop")) {
    failed("the run is stopping");
    return;
  }
  if (c.action == "checkpoint") {
    if (!ctx->checkpointing) {
      failed("checkpoints are off (no train.output_dir)");
    } else if (st.paused && ctx->shard_world != nullptr) {
      failed(
          "with the host state sharded (cluster.shard_state) every rank takes part in a checkpoint, "
          "decided between steps: lift the pause and ask again");
    } else if (st.paused) {
      // Every stage holds the paused step's version and nothing updates them: write it now (the gate
      // keeps the optimizer off each stage until it is written, should the run resume first).
      const std::int64_t v = st.next_report;
      ctx->gate.open(v, ctx->stages());
      self->send(st.h.checkpointer, CheckpointNow{v});
      mon.control_progress(c, "took_effect", {{"step", v}});
      st.durable_controls[v].push_back(c);
    } else {
      request_checkpoint(self);
      st.checkpoint_controls.push_back(c);
    }
  } else if (c.action == "pause") {
    if (st.paused) {
      mon.control_progress(c, "took_effect", {{"step", st.next_report}, {"note", "already paused"}});
    } else {
      request_pause(self);
      st.pause_controls.push_back(c);
    }
  } else if (c.action == "resume") {
    if (!st.paused && !st.pause_requested) {
      mon.control_progress(c, "took_effect", {{"step", st.next_report}, {"note", "not paused"}});
      return;
    }
    for (const auto& p : st.pause_controls)
      mon.control_progress(p, "failed", {{"error", "resumed before it took effect"}});
    st.pause_controls.clear();
    if (st.paused) {
      st.paused = false;
      st.paused_s += seconds_between(st.paused_since, Clock::now());
      mon.board().update([&](monitor::RunFigures& f) { f.state = monitor::RunState::running; });
      mon.events().append("resumed", {{"step", st.next_report}});
    }
    st.last_progress = Clock::now();
    lift_pause(self);
    mon.control_progress(c, "took_effect", {{"step", st.next_report}});
  } else if (c.action == "stop") {
    st.control_stop = true;
    st.result->stop_requested = true;  // run_engine runs no further segment
    st.stop_controls.push_back(c);
    if (st.pause_requested || st.paused) {
      if (st.paused) st.paused_s += seconds_between(st.paused_since, Clock::now());
      st.paused = false;
      for (const auto& p : st.pause_controls) mon.control_progress(p, "failed", {{"error", "stopped"}});
      st.pause_controls.clear();
      lift_pause(self);
    }
  } else if (c.action == "restart" || c.action == "fault") {
    // The supervisor does it (and puts a restart back on the board while a barrier is in progress).
    self->send(st.supervisor, RestartControl{c, parse_role(c.actor)});
  } else {
    failed("unknown action");
  }
}

// The progress watchdog: no step (nor compute op) finished for watchdog_warn_s -> a warning event; watchdog_dump_s ->
// every actor's state into the events; watchdog_restart_s -> restart the actor longest in a handler
// (compute when none is: then messages are lost, and the barrier re-issues the work).
void watchdog(self_ptr self) {
  auto& st = self->state;
  const MonitorSection& m = st.ctx->cfg->monitor;
  const auto now = Clock::now();
  if (st.paused || st.ended || st.restart_began || st.next_report >= st.end_step) {
    st.last_progress = now;
    st.watchdog_level = 0;
    return;
  }
  // A finished compute op is progress too: at long context one step is minutes of ops.
  const std::string unit = st.mon->board().probe(actor_id(Role::compute)).view(monitor::steady_ns()).last_unit;
  if (unit != st.last_compute_unit) {
    st.last_compute_unit = unit;
    st.last_progress = now;
    st.watchdog_level = 0;
    return;
  }
  const double stalled = seconds_between(st.last_progress, now);
  auto due = [&](double threshold, int level) {
    return threshold > 0 && stalled >= threshold && st.watchdog_level < level;
  };
  if (!due(m.watchdog_warn_s, 1) && !due(m.watchdog_dump_s, 2) && !due(m.watchdog_restart_s, 3)) return;
  // The pipeline actor in a handler the longest.
  const std::int64_t t = monitor::steady_ns();
  Role stuck = Role::compute;
  monitor::ActorProbe::View worst;
  for (int r = 0; r < kRoleCount; ++r) {
    const auto v = st.mon->board().probe(actor_id(static_cast<Role>(r))).view(t);
    if (v.in_handler_s > worst.in_handler_s) {
      worst = v;
      stuck = static_cast<Role>(r);
    }
  }
  nlohmann::json ev{{"actor", role_name(stuck)},    {"handler", worst.handler}, {"in_handler_s", worst.in_handler_s},
                    {"last_unit", worst.last_unit}, {"stalled_s", stalled},     {"step", st.next_report}};
  if (due(m.watchdog_warn_s, 1)) {
    st.watchdog_level = 1;
    ev["level"] = "warning";
    st.mon->events().append("watchdog", ev);
    std::fprintf(stderr, "megatrain: watchdog: no step or compute op finished for %.0f s (%s in %s for %.0f s)\n",
                 stalled, role_name(stuck), worst.handler.c_str(), worst.in_handler_s);
  }
  if (due(m.watchdog_dump_s, 2)) {
    st.watchdog_level = 2;
    ev["level"] = "dump";
    ev["actors"] = actors_json(st.mon->board());
    st.mon->events().append("watchdog", ev);
    ev.erase("actors");
  }
  if (due(m.watchdog_restart_s, 3)) {
    st.watchdog_level = 3;
    ev["level"] = "restart";
    st.mon->events().append("watchdog", ev);
    self->send(st.supervisor,
               WatchdogRestart{stuck, "watchdog: no step for " + std::to_string(static_cast<long long>(stalled)) +
                                          " s, in " + worst.handler + " for " +
                                          std::to_string(static_cast<long long>(worst.in_handler_s)) + " s"});
  }
}

// The tick's monitor work: live figures, control requests, the pause's progress, the watchdog.
void monitor_tick(self_ptr self) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  monitor::Monitor& mon = *st.mon;
  const double paused_now = st.paused ? seconds_between(st.paused_since, Clock::now()) : 0.0;
  const double restarting_now = st.restart_began ? seconds_between(*st.restart_began, Clock::now()) : 0.0;
  publish_live(*ctx, st.paused_s + paused_now, st.restart_s + restarting_now);
  for (const auto& c : mon.board().take_controls()) {
    try {
      handle_control(self, c);
    } catch (const std::exception& e) {
      mon.control_progress(c, "failed", {{"error", e.what()}});
    }
  }
  budget_final_checkpoint(self);
  if (st.ended) return;
  // Pause: compute holds before step held_at and every step before it is reported.
  const std::int64_t held = st.held_at;
  if (!st.paused && st.pause_requested && held >= 0 && st.next_report >= held) {
    st.paused = true;
    st.paused_since = Clock::now();
    mon.board().update([&](monitor::RunFigures& f) { f.state = monitor::RunState::paused; });
    mon.events().append("paused", {{"step", st.next_report}});
    for (const auto& c : st.pause_controls) mon.control_progress(c, "took_effect", {{"step", st.next_report}});
    st.pause_controls.clear();
  }
  watchdog(self);
}

void poll_stop(self_ptr self) {
  auto& st = self->state;
  monitor_tick(self);
  if (st.ended) return;
  // Checkpoint requests (SIGUSR1) and the timer become a CheckpointRequest to the optimizer. A signal
  // handler cannot send a CAF message (not async-signal-safe): it sets the job's flag, polled here.
  if (st.ctx->checkpointing) {
    std::atomic<bool>* req = st.ctx->job->checkpoint.request;
    if (req && req->exchange(false)) request_checkpoint(self);
    const double minutes = st.ctx->job->checkpoint.save_minutes;
    if (minutes > 0 && seconds_between(st.last_checkpoint, Clock::now()) >= minutes * 60.0) {
      request_checkpoint(self);
      st.last_checkpoint = Clock::now();
    }
  }
  // The stop flag (SIGINT / SIGTERM, Python) likewise: polled here, then StopAt messages. Several
  // ranks agree on the step first (Context::agreed_end), then ask for exactly it.
  const std::atomic<bool>* flag = st.ctx->job->stop;
  const bool wanted = (flag && flag->load()) || st.control_stop;
  const bool several = st.ctx->ranks > 1;
  if (several && wanted) st.ctx->run->stop_wanted.store(true);
  const std::int64_t agreed = st.ctx->run->agreed_end.load();
  const bool go = several ? agreed < st.end_step : wanted;
  if (go && !st.stop_requested && !st.h.computes.empty()) {
    st.stop_requested = true;
    const std::int64_t ask = several ? agreed : st.next_report;
    // Every device's compute answers the end step it honours (never inside a step it has begun); the
    // run ends at the smallest: a device that had begun that step stops there too (its gradients of
    // it are never complete, so no update uses them). The supervisor lowers every device's end to it.
    const int N = static_cast<int>(st.h.computes.size());
    auto answers = std::make_shared<int>(0);
    auto lowest = std::make_shared<std::int64_t>(st.end_step);
    for (int d = 0; d < N; ++d)
      self->request(st.h.computes[static_cast<std::size_t>(d)], caf::infinite, StopAt{ask})
          .then(
              [=](const StopAt& r) {
                auto& s = self->state;
                *lowest = std::min(*lowest, r.end_step);
                if (++*answers < N || s.ended) return;
                s.end_step = std::min(s.end_step, *lowest);
                s.result->stopped_early = s.end_step < s.ctx->end_step;
                self->send(s.supervisor, StopAt{s.end_step});
                s.mon->board().update([&](monitor::RunFigures& f) { f.state = monitor::RunState::stopping; });
                s.mon->events().append("stopping", {{"step", s.end_step}});
                for (const auto& c : s.stop_controls) s.mon->control_progress(c, "took_effect", {{"step", s.end_step}});
                emit_ready_steps(self);
              },
              [=](caf::error&) { self->state.stop_requested = false; });
  }
  self->delayed_send(self, std::chrono::milliseconds(50), tick_atom::value);
}

void record_collector(self_ptr self, const CollectorStepDone& m) {
  StepReports& r = self->state.reports[m.step];
  r.offload_s = m.offload_s;
  r.reduce_s = m.reduce_s;
  r.reduce_tail_s = m.reduce_tail_s;
}

void on_compute_done(self_ptr self, const ComputeStepDone& m) {
  const auto probe = probe_handler(self, monitor::ActorId::node, "ComputeStepDone");
  // Every device's compute reports the step; the record shows the slowest device's times.
  auto& r = self->state.reports[m.step];
  r.c.step = m.step;
  r.c.wait_weights_s = std::max(r.c.wait_weights_s, m.wait_weights_s);
  r.c.compute_s = std::max(r.c.compute_s, m.compute_s);
  r.compute = ++r.computes_done == device_count(self->state);
  emit_ready_steps(self);
}

void on_optimizer_done(self_ptr self, const OptimizerStepDone& m) {
  const auto probe = probe_handler(self, monitor::ActorId::node, "OptimizerStepDone");
  auto& r = self->state.reports[m.step];
  r.optimizer = true;
  r.o = m;
  emit_ready_steps(self);
}

// After the run ended: the supervisor is stopping every actor, this one last. Steps and checkpoints
// that still finish are recorded; nothing new is started (no tick, no control, no final checkpoint).
node_actor::behavior_type ended(self_ptr self) {
  return {
      [](const LossReport&) {},
      [](const LayerUpdated&) {},
      [=](const ComputeStepDone& m) { on_compute_done(self, m); },
      [=](const CollectorStepDone& m) { record_collector(self, m); },
      [=](const OptimizerStepDone& m) { on_optimizer_done(self, m); },
      [](tick_atom) {},
      [=](const CheckpointDone& m) {
        on_checkpoint(self, CheckpointEvent{m.step, true, m.path, "", m.seconds, m.bytes, m.cpu_seconds});
      },
      [=](const CheckpointFailed& m) {
        on_checkpoint(self, CheckpointEvent{m.step, false, "", m.error, 0.0, 0});
      },
      [](const PauseHeld&) {},
      [](const CheckpointTaken&) {},
      [](const Peers&) {},
      [](const RestartStatus&) {},
      [](const BudgetExhausted&) {},
      [](const RunFailed&) {},
  };
}

node_actor::behavior_type running(self_ptr self) {
  return {
      [=](const LossReport& m) {
        if (self->state.ctx->sched.is_forward_only()) self->state.eval_losses[m.micro_batch] = {m.loss_sum, m.counted};
      },
      [=](const LayerUpdated&) {},
      [=](const ComputeStepDone& m) { on_compute_done(self, m); },
      [=](const CollectorStepDone& m) { record_collector(self, m); },
      [=](const OptimizerStepDone& m) { on_optimizer_done(self, m); },
      [=](tick_atom) {
        const auto probe = probe_handler(self, monitor::ActorId::node, "tick");
        poll_stop(self);
      },
      [=](const CheckpointDone& m) {
        const auto probe = probe_handler(self, monitor::ActorId::node, "CheckpointDone");
        on_checkpoint(self, CheckpointEvent{m.step, true, m.path, "", m.seconds, m.bytes, m.cpu_seconds});
      },
      [=](const CheckpointFailed& m) {
        const auto probe = probe_handler(self, monitor::ActorId::node, "CheckpointFailed");
        on_checkpoint(self, CheckpointEvent{m.step, false, "", m.error, 0.0, 0});
      },
      // A compute holds for the pause request in force (monitor_tick reports the pause).
      [=](const PauseHeld& m) {
        auto& s = self->state;
        if (m.request == s.pause_id && s.pause_requested && s.held_at < 0) s.held_at = m.step;
      },
      // The optimizer took a checkpoint request as checkpoint m.step: the control requests waiting for
      // it took effect at that version, and are durable when its CheckpointDone arrives (which comes
      // after this: the optimizer sent this before its CheckpointNow).
      [=](const CheckpointTaken& m) {
        const auto probe = probe_handler(self, monitor::ActorId::node, "CheckpointTaken");
        auto& s = self->state;
        for (const auto& c : s.checkpoint_controls) {
          s.mon->control_progress(c, "took_effect", {{"step", m.step}});
          s.durable_controls[m.step].push_back(c);
        }
        s.checkpoint_controls.clear();
      },
      [=](const Peers& p) { self->state.h.set(p); },
      [=](const RestartStatus& m) {
        auto& s = self->state;
        s.restarts = m.restarts;
        s.restart_s = m.restart_s;
        if (m.restarting && !s.restart_began) s.restart_began = Clock::now();
        if (!m.restarting && s.restart_began) {  // resumed: the watchdog counts from now
          s.restart_began.reset();
          s.last_progress = Clock::now();
          s.watchdog_level = 0;
        }
      },
      [=](const BudgetExhausted& m) {
        auto& s = self->state;
        s.budget_error = m.error;
        s.budget_deadline = Clock::now() + std::chrono::seconds(10);
        s.mon->board().update([&](monitor::RunFigures& f) { f.last_error = s.budget_error; });
        budget_final_checkpoint(self);
      },
      [=](const RunFailed& m) { fail(self, m.error); },
  };
}

node_actor::behavior_type run_controller_fn(self_ptr self, Context* ctx, EngineResult* result,
                                            supervisor_actor supervisor) {
  auto& st = self->state;
  st.ctx = ctx;
  st.result = result;
  st.supervisor = std::move(supervisor);
  st.end_step = ctx->end_step;
  st.next_report = ctx->first_step;
  st.last_done = Clock::now();
  st.last_checkpoint = st.last_done;
  st.last_progress = st.last_done;
  st.mon = ctx->monitor;
  if (st.next_report >= st.end_step) {  // nothing to run: the supervisor stops every actor at once
    st.ended = true;
    st.mon->board().update([&](monitor::RunFigures& f) { f.state = monitor::RunState::stopping; });
    self->send(st.supervisor, shutdown_atom::value);
    return ended(self);
  }
  self->send(self, tick_atom::value);
  return running(self);
}

}  // namespace

node_actor spawn_run_controller(caf::actor_system& sys, Context* ctx, EngineResult* result,
                                supervisor_actor supervisor) {
  return sys.spawn(run_controller_fn, ctx, result, std::move(supervisor));
}

}  // namespace mt::actors
