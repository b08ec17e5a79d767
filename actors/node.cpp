// The node: the supervisor of one training run. Spawns the five pipeline actors (each detached: its
// own thread), monitors them, and restarts any that crashes:
//   1. respawn the crashed role; bump the epoch;
//   2. reset barrier: every pipeline actor drops its in-flight work, adopts the new epoch and acks
//      (an actor acks only between handlers, and the prefetcher and compute ack only once the copy
//      engine has finished what they queued, so after the barrier nothing from the old epoch runs);
//   3. Peers + Resume to all, then re-issue the in-flight work from the ledger: staged gradients not
//      yet accumulated (to the collector), the losses and complete stages of the optimizer's step (to
//      the optimizer). Compute and the prefetcher continue from compute's ledger position.
// Several devices (device.gpus = N): a prefetcher and a compute actor per device (each with its
// device's context); a crash of either restarts that one actor through the same barrier, over every
// device's actors; each device resumes from its own ledger position.
// It also assembles the per-step progress record from the actors' reports, honours the stop flag
// (SIGINT/SIGTERM: finish the step in progress, then stop), turns checkpoint requests (SIGUSR1, the
// train.save_minutes timer) into the flag the optimizer takes, spawns the checkpointer (not restarted:
// it reports failures itself), asks it for the final checkpoint once every step is done, reports each
// CheckpointDone / CheckpointFailed, and shuts everything down at the end.
#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <optional>
#include <set>

#include "actors/actors.hpp"
#include "actors/monitor_publish.hpp"

namespace mt::actors {

struct NodeRun {
  Context* ctx = nullptr;
  EngineResult* result = nullptr;
};

namespace {

struct StepReports {
  bool compute = false, optimizer = false;
  int computes_done = 0;  // devices whose compute finished the step
  ComputeStepDone c;
  OptimizerStepDone o;
  double offload_s = 0.0;
};

struct node_state {
  Context* ctx = nullptr;
  EngineResult* result = nullptr;
  std::uint64_t epoch = 0;
  PeerHandles h;                              // h.compute and h.prefetcher: device 0's
  std::vector<compute_actor> computes;        // per device ([0] == h.compute)
  std::vector<prefetcher_actor> prefetchers;  // per device ([0] == h.prefetcher)
  std::int64_t end_step = 0;
  std::int64_t next_report = 0;  // the next step whose progress record is due
  std::map<std::int64_t, StepReports> reports;
  Clock::time_point last_done;
  bool stop_requested = false;
  bool shutting_down = false;
  std::set<caf::actor_addr> alive;  // children not yet down
  int crashes_since_progress = 0;
  int acks_pending = 0;
  bool final_requested = false;       // the end-of-run checkpoint was asked for; shut down when it ends
  Clock::time_point last_checkpoint;  // for train.save_minutes
  std::int64_t final_step = 0;        // the version the end-of-run checkpoint holds
  // An evaluation pass: each micro-batch's loss (compute's LossReports; a re-sent one overwrites).
  std::map<std::int64_t, std::pair<double, std::int64_t>> eval_losses;
  // --- the monitor: control requests in progress, pause, restart policy, watchdog ------------------
  monitor::Monitor* mon = nullptr;
  bool control_stop = false;                                 // POST /control/stop
  std::vector<monitor::ControlRequest> stop_controls;        // reported at StopAt (took_effect) and the end
  std::vector<monitor::ControlRequest> checkpoint_controls;  // until the optimizer takes the request
  std::map<std::int64_t, std::vector<monitor::ControlRequest>> durable_controls;  // checkpoint step -> waiting
  std::vector<monitor::ControlRequest> pause_controls;                            // until compute holds
  bool checkpoint_asked = false;  // a CheckpointRequest went to the optimizer; no CheckpointTaken yet
  bool pause_requested = false;   // a PauseRequest went to every compute; no wake since
  std::uint64_t pause_id = 0;     // the PauseRequest in force (numbered)
  std::int64_t held_at = -1;      // the step a compute holds before for pause_id (-1: none yet)
  bool paused = false;
  Clock::time_point paused_since;
  double paused_s = 0.0;
  std::map<int, monitor::ControlRequest> restart_controls;  // role -> on-demand restart, until its down message
  std::map<int, monitor::ControlRequest> fault_controls;    // role -> injected fault, until it fires
  std::map<int, std::string> watchdog_restarts;             // role -> why the watchdog restarts it
  // Roles respawned since the last Resume, reported (actor_restarted, control took_effect) once resumed.
  struct Restarted {
    Role role;
    int device;
    std::optional<monitor::ControlRequest> ctl;
  };
  std::vector<Restarted> restarted;
  int respawns_pending = 0;  // roles waiting out their backoff
  std::optional<Clock::time_point> restart_began;
  double restart_s = 0.0;
  std::map<int, std::deque<Clock::time_point>> failures;  // per role, within restart.window_s
  std::string budget_error;           // the restart budget ran out: the run's error once the final checkpoint is done
  Clock::time_point budget_deadline;  // ... and the final checkpoint is given up when no consistent step by then
  Clock::time_point last_progress;
  int watchdog_level = 0;
  static constexpr const char* name = "node";
};

using self_ptr = node_actor::stateful_pointer<node_state>;

int device_count(const node_state& st) { return st.ctx->devices; }

// The actor's name in logs, events and the monitor: "compute[1]" for device 1's (device 0's: "compute").
std::string actor_label(Role role, int device) {
  return device > 0 ? std::string(role_name(role)) + "[" + std::to_string(device) + "]" : role_name(role);
}

// The Peers of device d's compute and prefetcher (device 0's for the other roles).
Peers make_peers(self_ptr self, int d = 0) {
  auto& st = self->state;
  auto& h = st.h;
  Peers p;
  p.loader = caf::actor_cast<caf::strong_actor_ptr>(h.loader);
  p.prefetcher = caf::actor_cast<caf::strong_actor_ptr>(st.prefetchers[static_cast<std::size_t>(d)]);
  p.compute = caf::actor_cast<caf::strong_actor_ptr>(st.computes[static_cast<std::size_t>(d)]);
  for (const auto& c : st.computes) p.computes.push_back(caf::actor_cast<caf::strong_actor_ptr>(c));
  for (const auto& c : st.prefetchers) p.prefetchers.push_back(caf::actor_cast<caf::strong_actor_ptr>(c));
  p.collector = caf::actor_cast<caf::strong_actor_ptr>(h.collector);
  p.optimizer = caf::actor_cast<caf::strong_actor_ptr>(h.optimizer);
  p.node = caf::actor_cast<caf::strong_actor_ptr>(self);
  p.checkpointer = caf::actor_cast<caf::strong_actor_ptr>(h.checkpointer);
  return p;
}

void spawn_role(self_ptr self, Role r, int d = 0) {
  auto& st = self->state;
  auto& sys = self->system();
  const std::size_t di = static_cast<std::size_t>(d);
  switch (r) {
    case Role::loader:
      st.h.loader = spawn_loader(sys, st.ctx, st.epoch);
      self->monitor(st.h.loader);
      break;
    case Role::prefetcher:
      st.prefetchers[di] = spawn_prefetcher(sys, st.ctx->device_context(d), st.epoch);
      self->monitor(st.prefetchers[di]);
      st.h.prefetcher = st.prefetchers[0];
      st.alive.insert(st.prefetchers[di].address());
      return;
    case Role::compute:
      st.computes[di] = spawn_compute(sys, st.ctx->device_context(d), st.epoch);
      self->monitor(st.computes[di]);
      st.h.compute = st.computes[0];
      st.alive.insert(st.computes[di].address());
      return;
    case Role::collector:
      st.h.collector = spawn_collector(sys, st.ctx, st.epoch);
      self->monitor(st.h.collector);
      break;
    case Role::optimizer:
      st.h.optimizer = spawn_optimizer(sys, st.ctx, st.epoch);
      self->monitor(st.h.optimizer);
      break;
  }
  const caf::actor_addr a[kRoleCount] = {st.h.loader.address(), st.h.prefetcher.address(), st.h.compute.address(),
                                         st.h.collector.address(), st.h.optimizer.address()};
  st.alive.insert(a[static_cast<int>(r)]);
}

caf::actor role_handle(const node_state& st, Role r, int d = 0) {
  const PeerHandles& h = st.h;
  switch (r) {
    case Role::loader:
      return caf::actor_cast<caf::actor>(h.loader);
    case Role::prefetcher:
      return caf::actor_cast<caf::actor>(st.prefetchers[static_cast<std::size_t>(d)]);
    case Role::compute:
      return caf::actor_cast<caf::actor>(st.computes[static_cast<std::size_t>(d)]);
    case Role::collector:
      return caf::actor_cast<caf::actor>(h.collector);
    case Role::optimizer:
      return caf::actor_cast<caf::actor>(h.optimizer);
  }
  return {};
}

std::int64_t optimizer_step(Context* ctx) {
  std::uint64_t v = ~std::uint64_t{0};
  for (std::int64_t s = 0; s < ctx->stages(); ++s) v = std::min(v, ctx->host->tile(s).version());
  return static_cast<std::int64_t>(v);
}

// Sends Peers and Resume to every actor, then re-issues the in-flight work recorded in the ledger.
// Called while every actor is quiescent (at start, or after the reset barrier).
void resume_all(self_ptr self) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  const RunLedger& led = ctx->ledger;
  const int N = device_count(st);
  // Read the ledger first, then send: once the collector has its Resume and re-issued work it writes
  // the ledger again, so nothing may be read from it after the first send.
  const std::int64_t opt_step = optimizer_step(ctx);
  const Resume r{st.epoch, led.compute_pos, opt_step, st.end_step};
  std::vector<Resume> device_resume;  // each device continues from its own compute position
  for (int d = 0; d < N; ++d)
    device_resume.push_back(Resume{st.epoch, ctx->device_context(d)->ledger.compute_pos, opt_step, st.end_step});
  // Staged gradients the collector has not (or not known to have) taken, in schedule order, and the
  // optimizer's step's micro-batch losses (global indices), from every device's ledger.
  std::vector<LayerGrads> staged;
  std::vector<LossReport> losses;
  for (int d = 0; d < N; ++d) {
    const RunLedger& dl = ctx->device_context(d)->ledger;
    for (int k = 0; k < static_cast<int>(dl.staging.size()); ++k) {
      const auto& e = dl.staging[static_cast<std::size_t>(k)];
      if (e.state == StagingEntry::State::full)
        staged.push_back(LayerGrads{
            st.epoch, WorkId{e.step, e.micro_batch, e.stage, static_cast<std::int32_t>(Phase::backward)}, k, d});
    }
    for (const auto& kv : dl.losses)
      if (kv.first >= opt_step)
        for (std::size_t mb = 0; mb < kv.second.size(); ++mb)
          losses.push_back(LossReport{st.epoch, kv.first, static_cast<std::int64_t>(mb) * N + d, kv.second[mb].loss_sum,
                                      kv.second[mb].counted});
  }
  std::sort(staged.begin(), staged.end(), [](const LayerGrads& a, const LayerGrads& b) {
    if (a.work.step != b.work.step) return a.work.step < b.work.step;
    if (a.work.micro_batch != b.work.micro_batch) return a.work.micro_batch < b.work.micro_batch;
    if (a.work.stage != b.work.stage) return a.work.stage > b.work.stage;
    return a.device < b.device;
  });
  std::vector<LayerGradsComplete> complete;
  for (std::int64_t s = 0; s < ctx->stages(); ++s) {
    const std::size_t si = static_cast<std::size_t>(s);
    if (led.accum_step[si] == opt_step && led.accum_count[si] == ctx->sched.micro_batches())
      complete.push_back(LayerGradsComplete{st.epoch, opt_step, s, led.sumsq[si]});
  }

  const Peers peers = make_peers(self);
  self->send(st.h.loader, peers);
  for (int d = 0; d < N; ++d) {
    const Peers dp = make_peers(self, d);
    self->send(st.prefetchers[static_cast<std::size_t>(d)], dp);
    self->send(st.computes[static_cast<std::size_t>(d)], dp);
  }
  self->send(st.h.collector, peers);
  self->send(st.h.optimizer, peers);
  self->send(st.h.checkpointer, peers);
  self->send(st.h.loader, r);
  self->send(st.h.collector, r);
  // A request not taken yet (the optimizer may be a respawned one): before the work that lets it decide.
  if (st.checkpoint_asked) self->send(st.h.optimizer, CheckpointRequest{});
  self->send(st.h.optimizer, r);
  for (const auto& g : staged) self->send(st.h.collector, g);
  for (const auto& l : losses) self->send(st.h.optimizer, l);
  for (const auto& c : complete) self->send(st.h.optimizer, c);
  // Compute and the prefetcher last: they start the flow again. A pause in force reaches a respawned
  // compute before its Resume, so it holds where the old one did.
  for (int d = 0; d < N; ++d) {
    if (st.pause_requested) self->send(st.computes[static_cast<std::size_t>(d)], PauseRequest{st.pause_id});
    self->send(st.computes[static_cast<std::size_t>(d)], device_resume[static_cast<std::size_t>(d)]);
    self->send(st.prefetchers[static_cast<std::size_t>(d)], device_resume[static_cast<std::size_t>(d)]);
  }
  // Restarts are done: report them.
  const auto now = Clock::now();
  if (st.restart_began) {
    st.restart_s += seconds_between(*st.restart_began, now);
    st.restart_began.reset();
  }
  st.last_progress = now;
  st.watchdog_level = 0;
  for (auto& [role, device, ctl] : st.restarted) {
    auto& probe = st.mon->board().probe(actor_id(role), device);
    probe.set_state(monitor::ActorState::running);
    st.mon->events().append("actor_restarted", {{"actor", actor_label(role, device)},
                                                {"restarts", probe.view(monitor::steady_ns()).restarts},
                                                {"step", st.next_report},
                                                {"requested_by", ctl ? ctl->id : ""}});
    if (ctl) st.mon->control_progress(*ctl, "took_effect", {{"step", st.next_report}});
  }
  st.restarted.clear();
}

void shutdown(self_ptr self) {
  auto& st = self->state;
  if (st.shutting_down) return;
  st.shutting_down = true;
  st.mon->board().update([&](monitor::RunFigures& f) { f.state = monitor::RunState::stopping; });
  // Control requests that can no longer take effect.
  auto refuse = [&](const monitor::ControlRequest& c) {
    st.mon->control_progress(c, "failed", {{"error", "the run ended first"}});
  };
  for (const auto& c : st.checkpoint_controls) refuse(c);
  for (const auto& kv : st.durable_controls)
    for (const auto& c : kv.second) refuse(c);
  for (const auto& c : st.pause_controls) refuse(c);
  for (const auto& kv : st.restart_controls) refuse(kv.second);
  for (const auto& kv : st.fault_controls) refuse(kv.second);
  st.checkpoint_controls.clear();
  st.durable_controls.clear();
  st.pause_controls.clear();
  st.restart_controls.clear();
  st.fault_controls.clear();
  for (const auto& c : st.stop_controls) {
    nlohmann::json extra{{"step", st.next_report}};
    const auto& cps = st.result->checkpoints;
    if (!cps.empty() && cps.back().ok && cps.back().step == st.next_report)
      extra.update({{"path", cps.back().path}, {"bytes", cps.back().bytes}, {"seconds", cps.back().seconds}});
    st.mon->control_progress(c, st.result->error.empty() ? "durable" : "failed", extra);
  }
  st.stop_controls.clear();
  st.ctx->gate.release_all();  // an optimizer waiting on a checkpoint must not block the exit
  self->send_exit(st.h.checkpointer, caf::exit_reason::user_shutdown);
  if (st.alive.empty()) {
    self->quit();
    return;
  }
  self->send_exit(st.h.loader, caf::exit_reason::user_shutdown);
  for (const auto& p : st.prefetchers) self->send_exit(p, caf::exit_reason::user_shutdown);
  for (const auto& c : st.computes) self->send_exit(c, caf::exit_reason::user_shutdown);
  self->send_exit(st.h.collector, caf::exit_reason::user_shutdown);
  self->send_exit(st.h.optimizer, caf::exit_reason::user_shutdown);
}

void fail(self_ptr self, const std::string& what) {
  if (self->state.result->error.empty()) self->state.result->error = what;
  self->state.mon->board().update([&](monitor::RunFigures& f) { f.last_error = self->state.result->error; });
  shutdown(self);
}

// The final checkpoint is done: shut down (with the restart budget's error, when that ended the run).
void final_done(self_ptr self) {
  if (!self->state.budget_error.empty())
    fail(self, self->state.budget_error);
  else
    shutdown(self);
}

// Every step is done: write the final checkpoint (when checkpointing and this run did a step), then
// shut down once it is published or failed.
void finish(self_ptr self) {
  auto& st = self->state;
  if (st.shutting_down || st.final_requested) return;
  const Context* ctx = st.ctx;
  // An evaluation pass holds the weights of version first_step; a training run those of end_step.
  // A run stopped by the stop flag always writes its final checkpoint.
  const bool eval = ctx->sched.is_forward_only();
  st.final_step = eval ? ctx->first_step : st.end_step;
  const bool stop_flag = (ctx->job->stop != nullptr && ctx->job->stop->load()) || st.control_stop;
  const bool wanted = ctx->job->checkpoint.at_end || st.result->stopped_early || stop_flag;
  if (ctx->checkpointing && wanted && (eval || st.end_step > ctx->first_step) && st.result->error.empty()) {
    st.final_requested = true;
    self->send(st.h.checkpointer, CheckpointNow{st.final_step});
    return;
  }
  shutdown(self);
}

void on_checkpoint(self_ptr self, const CheckpointEvent& ev) {
  auto& st = self->state;
  // The final CheckpointNow of a checkpoint already published (the planned last step) is answered
  // with its CheckpointDone again: report each checkpoint once.
  bool repeat = false;
  for (const auto& c : st.result->checkpoints)
    repeat = repeat || (c.ok && ev.ok && c.step == ev.step && c.path == ev.path);
  if (repeat) {
    if (st.final_requested && ev.step == st.final_step) final_done(self);
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
    st.mon->events().append("checkpoint_saved",
                            {{"step", ev.step}, {"path", ev.path}, {"bytes", ev.bytes}, {"seconds", ev.seconds}});
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
  if (st.final_requested && ev.step == st.final_step) final_done(self);
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

void emit_ready_steps(self_ptr self) {
  auto& st = self->state;
  if (st.ctx->sched.is_forward_only()) {
    auto it = st.reports.find(st.next_report);
    if (it != st.reports.end() && it->second.compute) finish_evaluation(self);
    return;
  }
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
    rec.optimizer_s = r.o.optimizer_s;
    rec.checkpoint_wait_s = r.o.checkpoint_wait_s;
    rec.restarts = st.result->restarts;
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
    st.crashes_since_progress = 0;
  }
  if (st.next_report >= st.end_step) finish(self);
}

// Respawns `role` (of device d), bumps the epoch and runs the reset barrier; Resume follows once every
// actor acked.
void respawn(self_ptr self, Role role, int d) {
  auto& st = self->state;
  if (st.shutting_down) return;
  ++st.epoch;
  spawn_role(self, role, d);
  const std::uint64_t e = st.epoch;
  st.acks_pending = kRoleCount + 2 * (device_count(st) - 1);
  auto ack = [=](ack_atom) {
    if (self->state.epoch == e && --self->state.acks_pending == 0 && !self->state.shutting_down &&
        self->state.respawns_pending == 0)
      resume_all(self);
  };
  auto err = [=](caf::error&) { /* the target died; its down message (or respawn) starts a newer barrier */ };
  self->request(st.h.loader, caf::infinite, reset_atom::value, e).then(ack, err);
  for (const auto& p : st.prefetchers) self->request(p, caf::infinite, reset_atom::value, e).then(ack, err);
  for (const auto& c : st.computes) self->request(c, caf::infinite, reset_atom::value, e).then(ack, err);
  self->request(st.h.collector, caf::infinite, reset_atom::value, e).then(ack, err);
  self->request(st.h.optimizer, caf::infinite, reset_atom::value, e).then(ack, err);
}

// After the restart budget ran out: once the tiles hold one version (no step half applied; the
// optimizer finishes a step it has begun), write the final checkpoint of it, then stop with the error.
// Called on each tick until then; gives up on the checkpoint after 10 s.
void budget_final_checkpoint(self_ptr self) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  if (st.budget_error.empty() || st.final_requested || st.shutting_down) return;
  std::uint64_t lo = ~std::uint64_t{0}, hi = 0;
  for (std::int64_t s = 0; s < ctx->stages(); ++s) {
    lo = std::min(lo, ctx->host->tile(s).version());
    hi = std::max(hi, ctx->host->tile(s).version());
  }
  const auto v = static_cast<std::int64_t>(lo);
  if (ctx->checkpointing && lo == hi && v > ctx->first_step) {
    st.final_requested = true;
    st.end_step = v;
    st.final_step = v;
    ctx->gate.open(v, ctx->stages());  // the optimizer may not move a stage past v before it is written
    self->send(st.h.checkpointer, CheckpointNow{v});
    return;
  }
  if (ctx->checkpointing && lo != hi && Clock::now() < st.budget_deadline) return;  // a step is being applied
  fail(self, st.budget_error + (ctx->checkpointing ? " (no final checkpoint: the tiles did not reach one version; "
                                                     "the last published checkpoint is the one to resume from)"
                                                   : ""));
}

// The restart budget of `role` ran out: final checkpoint (budget_final_checkpoint), then stop with an
// error naming the actor, its failures and the last one.
void budget_exhausted(self_ptr self, Role role, const std::string& why, std::size_t failures) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  const RestartSection& rs = ctx->cfg->restart;
  st.budget_error = std::string(role_name(role)) + " failed " + std::to_string(failures) + " times within " +
                    std::to_string(static_cast<long long>(rs.window_s)) +
                    " s (restart.max_restarts=" + std::to_string(ctx->cfg->max_restarts_of(role_name(role))) +
                    "); last failure: " + why;
  st.budget_deadline = Clock::now() + std::chrono::seconds(10);
  st.mon->board().update([&](monitor::RunFigures& f) { f.last_error = st.budget_error; });
  budget_final_checkpoint(self);
}

void on_crash(self_ptr self, Role role, int device, const caf::error& reason) {
  auto& st = self->state;
  auto* res = st.result;
  const int r = static_cast<int>(role);
  const std::string why = self->system().render(reason);
  auto& probe = st.mon->board().probe(actor_id(role), device);
  probe.count_restart();
  probe.set_state(monitor::ActorState::restarting);
  std::optional<monitor::ControlRequest> ctl;
  const bool on_demand = st.restart_controls.count(r) != 0;  // POST /control/restart: not a failure
  if (on_demand) {
    ctl = st.restart_controls[r];
    st.restart_controls.erase(r);
  } else if (st.fault_controls.count(r)) {
    ctl = st.fault_controls[r];
    st.fault_controls.erase(r);
  }
  ++res->restarts;
  const std::string who = actor_label(role, device);
  res->restart_log.push_back(who + (on_demand ? " restarted on request (" : " crashed (") + why + "), restarted");
  const auto now = Clock::now();
  std::size_t failures = 0;
  if (!on_demand) {
    std::string what = why;
    auto wd = st.watchdog_restarts.find(r);
    if (wd != st.watchdog_restarts.end()) {
      what = wd->second;
      st.watchdog_restarts.erase(wd);
    }
    probe.set_last_failure(what);
    st.mon->events().append("actor_failed",
                            {{"actor", actor_label(role, device)}, {"error", what}, {"step", st.next_report}});
    // Restart policy: at most restart.max_restarts failures per actor within restart.window_s.
    auto& times = st.failures[r];
    times.push_back(now);
    while (!times.empty() && seconds_between(times.front(), now) > st.ctx->cfg->restart.window_s) times.pop_front();
    failures = times.size();
    if (static_cast<std::int64_t>(failures) > st.ctx->cfg->max_restarts_of(role_name(role))) {
      if (ctl) st.mon->control_progress(*ctl, "took_effect", {{"step", st.next_report}});
      budget_exhausted(self, role, what, failures);
      return;
    }
    // A deterministic failure (bad data, a bug) recurs at once after a restart: give up when crashes
    // repeat without a step finishing in between.
    if (++st.crashes_since_progress > 3) {
      fail(self, std::string(role_name(role)) + " keeps crashing without progress: " + what);
      return;
    }
  }
  if (!st.restart_began) st.restart_began = now;
  st.restarted.push_back(node_state::Restarted{role, device, ctl});
  const double backoff = on_demand || failures == 0
                             ? 0.0
                             : st.ctx->cfg->restart.backoff_s * std::ldexp(1.0, static_cast<int>(failures) - 1);
  if (backoff > 0) {
    ++st.respawns_pending;
    self->delayed_send(self, std::chrono::milliseconds(static_cast<long long>(backoff * 1000)), respawn_atom::value,
                       static_cast<std::int32_t>(r), static_cast<std::int32_t>(device));
    return;
  }
  respawn(self, role, device);
}

// Asks the optimizer for a checkpoint at its next decision (CheckpointTaken answers which one).
void request_checkpoint(self_ptr self) {
  self->state.checkpoint_asked = true;
  self->send(self->state.h.optimizer, CheckpointRequest{});
}

// Asks every compute to hold before its next step (PauseHeld answers where).
void request_pause(self_ptr self) {
  auto& st = self->state;
  if (st.pause_requested) return;
  st.pause_requested = true;
  ++st.pause_id;
  st.held_at = -1;
  for (const auto& cp : st.computes) self->send(cp, PauseRequest{st.pause_id});
}

// Lifts the pause request (held or not): every compute continues. False when none was in force.
bool lift_pause(self_ptr self) {
  auto& st = self->state;
  if (!st.pause_requested) return false;
  st.pause_requested = false;
  st.held_at = -1;
  for (const auto& cp : st.computes) self->send(cp, wake_atom::value);
  return true;
}

// A control request from the monitor (POST /control/...), carried out between the node's messages.
// Returns false to keep it for a later tick (a restart while a barrier is in progress).
bool handle_control(self_ptr self, const monitor::ControlRequest& c) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  monitor::Monitor& mon = *st.mon;
  auto failed = [&](const std::string& why) { mon.control_progress(c, "failed", {{"error", why}}); };
  if (st.shutting_down || (st.stop_requested && c.action != "stop")) {
    failed("the run is stopping");
    return true;
  }
  if (c.action == "checkpoint") {
    if (!ctx->checkpointing) {
      failed("checkpoints are off (no train.output_dir)");
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
      return true;
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
    const Role role = parse_role(c.actor);
    const int r = static_cast<int>(role);
    if (c.action == "fault") {
      st.fault_controls[r] = c;
      ctx->fault->on_demand[r].store(1);
      return true;
    }
    // Not in the middle of a restart: the actor must be up and the barrier done.
    if (st.acks_pending > 0 || st.respawns_pending > 0 || st.restart_controls.count(r) || !st.restarted.empty())
      return false;
    st.restart_controls[r] = c;
    self->send_exit(role_handle(st, role),
                    caf::make_error(caf::sec::runtime_error, "restart requested by " + c.id + " from " + c.peer));
  } else {
    failed("unknown action");
  }
  return true;
}

// The progress watchdog: no step finished for watchdog_warn_s -> a warning event; watchdog_dump_s ->
// every actor's state into the events; watchdog_restart_s -> restart the actor longest in a handler
// (compute when none is: then messages are lost, and the barrier re-issues the work).
void watchdog(self_ptr self) {
  auto& st = self->state;
  const MonitorSection& m = st.ctx->cfg->monitor;
  const auto now = Clock::now();
  if (st.paused || st.shutting_down || st.acks_pending > 0 || st.respawns_pending > 0 ||
      st.next_report >= st.end_step) {
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
    std::fprintf(stderr, "megatrain: watchdog: no step for %.0f s (%s in %s for %.0f s)\n", stalled, role_name(stuck),
                 worst.handler.c_str(), worst.in_handler_s);
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
    const int r = static_cast<int>(stuck);
    st.watchdog_restarts[r] = "watchdog: no step for " + std::to_string(static_cast<long long>(stalled)) + " s, in " +
                              worst.handler + " for " + std::to_string(static_cast<long long>(worst.in_handler_s)) +
                              " s";
    self->send_exit(role_handle(st, stuck), caf::make_error(caf::sec::runtime_error, st.watchdog_restarts[r]));
  }
}

// A requested checkpoint the optimizer took (CheckpointTaken): the control requests waiting for it
// took effect at that version, and are durable when its CheckpointDone arrives.
void take_checkpoint_request(self_ptr self, std::int64_t v) {
  auto& st = self->state;
  st.checkpoint_asked = false;
  for (const auto& c : st.checkpoint_controls) {
    st.mon->control_progress(c, "took_effect", {{"step", v}});
    st.durable_controls[v].push_back(c);
  }
  st.checkpoint_controls.clear();
}

// The tick's monitor work: live figures, control requests, the pause and checkpoint requests'
// progress, the watchdog.
void monitor_tick(self_ptr self) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  monitor::Monitor& mon = *st.mon;
  const double paused_now = st.paused ? seconds_between(st.paused_since, Clock::now()) : 0.0;
  const double restarting_now = st.restart_began ? seconds_between(*st.restart_began, Clock::now()) : 0.0;
  publish_live(*ctx, st.paused_s + paused_now, st.restart_s + restarting_now);
  std::vector<monitor::ControlRequest> later;
  for (const auto& c : mon.board().take_controls()) {
    bool done = true;
    try {
      done = handle_control(self, c);
    } catch (const std::exception& e) {
      mon.control_progress(c, "failed", {{"error", e.what()}});
    }
    if (!done) later.push_back(c);
  }
  if (!later.empty()) mon.board().put_back_controls(std::move(later));
  budget_final_checkpoint(self);
  if (st.shutting_down) return;
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
  if (st.shutting_down) return;
  monitor_tick(self);
  if (st.shutting_down) return;
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
  // The stop flag (SIGINT / SIGTERM, Python) likewise: polled here, then StopAt messages.
  const std::atomic<bool>* flag = st.ctx->job->stop;
  if (((flag && flag->load()) || st.control_stop) && !st.stop_requested) {
    st.stop_requested = true;
    // Every device's compute answers the end step it honours (never inside a step it has begun); the
    // run ends at the smallest: a device that had begun that step stops there too (its gradients of
    // it are never complete, so no update uses them).
    const int N = device_count(st);
    auto answers = std::make_shared<int>(0);
    auto lowest = std::make_shared<std::int64_t>(st.end_step);
    for (int d = 0; d < N; ++d)
      self->request(st.computes[static_cast<std::size_t>(d)], caf::infinite, StopAt{st.next_report})
          .then(
              [=](const StopAt& r) {
                auto& s = self->state;
                *lowest = std::min(*lowest, r.end_step);
                if (++*answers < N) return;
                s.end_step = std::min(s.end_step, *lowest);
                s.result->stopped_early = s.end_step < s.ctx->end_step;
                for (const auto& c : s.computes)  // lowers every device's end to the run's
                  self->request(c, caf::infinite, StopAt{s.end_step}).then([](const StopAt&) {}, [](caf::error&) {});
                for (const auto& p : s.prefetchers) self->send(p, StopAt{s.end_step});
                s.mon->board().update([&](monitor::RunFigures& f) { f.state = monitor::RunState::stopping; });
                s.mon->events().append("stopping", {{"step", s.end_step}});
                for (const auto& c : s.stop_controls) s.mon->control_progress(c, "took_effect", {{"step", s.end_step}});
                emit_ready_steps(self);
              },
              [=](caf::error&) { self->state.stop_requested = false; });
  }
  self->delayed_send(self, std::chrono::milliseconds(50), tick_atom::value);
}

}  // namespace

node_actor::behavior_type node_fn(self_ptr self, NodeRun run) {
  auto& st = self->state;
  st.ctx = run.ctx;
  st.result = run.result;
  st.end_step = run.ctx->end_step;
  st.next_report = run.ctx->first_step;
  st.last_done = Clock::now();
  st.last_checkpoint = st.last_done;
  st.last_progress = st.last_done;
  st.mon = run.ctx->monitor;
  st.mon->board().update([](monitor::RunFigures& f) { f.state = monitor::RunState::running; });
  st.computes.resize(static_cast<std::size_t>(run.ctx->devices));
  st.prefetchers.resize(static_cast<std::size_t>(run.ctx->devices));
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    s.alive.erase(dm.source);
    for (int r = 0; r < kRoleCount; ++r)
      if (dm.source == role_handle(s, static_cast<Role>(r)).address() && s.shutting_down)
        s.mon->board().probe(actor_id(static_cast<Role>(r))).set_state(monitor::ActorState::stopped);
    for (int d = 1; d < device_count(s) && s.shutting_down; ++d)
      for (Role r : {Role::prefetcher, Role::compute})
        if (dm.source == role_handle(s, r, d).address())
          s.mon->board().probe(actor_id(r), d).set_state(monitor::ActorState::stopped);
    if (dm.source == s.h.checkpointer.address())
      s.mon->board().probe(monitor::ActorId::checkpointer).set_state(monitor::ActorState::stopped);
    if (s.shutting_down) {
      if (s.alive.empty()) self->quit();
      return;
    }
    if (dm.source == s.h.checkpointer.address()) {
      fail(self, "the checkpointer stopped: " + self->system().render(dm.reason));
      return;
    }
    const std::array<std::pair<Role, caf::actor_addr>, 3> roles{{
        {Role::loader, s.h.loader.address()},
        {Role::collector, s.h.collector.address()},
        {Role::optimizer, s.h.optimizer.address()},
    }};
    for (const auto& r : roles)
      if (r.second == dm.source) {
        on_crash(self, r.first, 0, dm.reason);
        return;
      }
    for (int d = 0; d < device_count(s); ++d) {
      if (dm.source == s.prefetchers[static_cast<std::size_t>(d)].address()) {
        on_crash(self, Role::prefetcher, d, dm.reason);
        return;
      }
      if (dm.source == s.computes[static_cast<std::size_t>(d)].address()) {
        on_crash(self, Role::compute, d, dm.reason);
        return;
      }
    }
  });
  for (int r = 0; r < kRoleCount; ++r) {
    const Role role = static_cast<Role>(r);
    const bool per_device = role == Role::compute || role == Role::prefetcher;
    for (int d = 0; d < (per_device ? st.ctx->devices : 1); ++d) spawn_role(self, role, d);
  }
  st.h.checkpointer = spawn_checkpointer(self->system(), st.ctx);
  self->monitor(st.h.checkpointer);
  st.alive.insert(st.h.checkpointer.address());
  if (st.next_report >= st.end_step) {
    self->send(st.h.checkpointer, make_peers(self));
    shutdown(self);
  } else {
    resume_all(self);
    self->send(self, tick_atom::value);
  }
  return {
      [=](const LossReport& m) {
        if (self->state.ctx->sched.is_forward_only()) self->state.eval_losses[m.micro_batch] = {m.loss_sum, m.counted};
      },
      [=](const LayerUpdated&) {},
      [=](const ComputeStepDone& m) {
        const auto probe = probe_handler(self, monitor::ActorId::node, "ComputeStepDone");
        // Every device's compute reports the step; the record shows the slowest device's times.
        auto& r = self->state.reports[m.step];
        r.c.step = m.step;
        r.c.wait_weights_s = std::max(r.c.wait_weights_s, m.wait_weights_s);
        r.c.compute_s = std::max(r.c.compute_s, m.compute_s);
        r.compute = ++r.computes_done == device_count(self->state);
        emit_ready_steps(self);
      },
      [=](const CollectorStepDone& m) { self->state.reports[m.step].offload_s = m.offload_s; },
      [=](const OptimizerStepDone& m) {
        const auto probe = probe_handler(self, monitor::ActorId::node, "OptimizerStepDone");
        auto& r = self->state.reports[m.step];
        r.optimizer = true;
        r.o = m;
        emit_ready_steps(self);
      },
      [=](tick_atom) {
        const auto probe = probe_handler(self, monitor::ActorId::node, "tick");
        poll_stop(self);
      },
      [=](const CheckpointDone& m) {
        const auto probe = probe_handler(self, monitor::ActorId::node, "CheckpointDone");
        on_checkpoint(self, CheckpointEvent{m.step, true, m.path, "", m.seconds, m.bytes});
      },
      [=](const CheckpointFailed& m) {
        const auto probe = probe_handler(self, monitor::ActorId::node, "CheckpointFailed");
        on_checkpoint(self, CheckpointEvent{m.step, false, "", m.error, 0.0, 0});
      },
      // A role's backoff after a failure is over: respawn it and run the barrier.
      [=](respawn_atom, std::int32_t role, std::int32_t device) {
        const auto probe = probe_handler(self, monitor::ActorId::node, "respawn");
        --self->state.respawns_pending;
        respawn(self, static_cast<Role>(role), device);
      },
      // A compute holds for the pause request in force (monitor_tick reports the pause).
      [=](const PauseHeld& m) {
        auto& s = self->state;
        if (m.request == s.pause_id && s.pause_requested && s.held_at < 0) s.held_at = m.step;
      },
      [=](const CheckpointTaken& m) {
        const auto probe = probe_handler(self, monitor::ActorId::node, "CheckpointTaken");
        take_checkpoint_request(self, m.step);
      },
  };
}

node_actor spawn_node(caf::actor_system& sys, Context* ctx, EngineResult* result) {
  return sys.spawn(node_fn, NodeRun{ctx, result});
}

}  // namespace mt::actors
