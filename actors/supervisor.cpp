// The node's supervisor: spawns the run controller (run_controller.cpp), the five pipeline actors (each
// detached: its own thread) and the checkpointer, monitors them, and restarts any pipeline actor that
// crashes:
//   1. respawn the crashed role (after its backoff); bump the epoch;
//   2. reset barrier: every pipeline actor drops its in-flight work, adopts the new epoch and acks
//      (an actor acks only between handlers, and the prefetcher and compute ack only once the copy
//      engine has finished what they queued, so after the barrier nothing from the old epoch runs);
//   3. Peers + Resume to all, then re-issue the in-flight work from the ledger: staged gradients not
//      yet accumulated (to the collector), the losses and complete stages of the optimizer's step (to
//      the optimizer). Compute and the prefetcher continue from compute's ledger position.
// Several devices (device.gpus = N): a prefetcher and a compute actor per device (each with its
// device's context); a crash of either restarts that one actor through the same barrier, over every
// device's actors; each device resumes from its own ledger position.
// The restart policy (restart.max_restarts within restart.window_s, exponential backoff, repeated
// crashes without progress) is applied here; the run controller hears of restarts (RestartStatus) and
// carries out the final checkpoint when the budget ran out (BudgetExhausted).
// Requests that must survive a restart pass through here: the stop step (StopAt), a pause
// (PauseRequest / wake) and a checkpoint request (CheckpointRequest until CheckpointTaken); a
// respawned actor gets them again before its Resume.
// Modes are behaviours: `supervising` until the run ends, then `shutting_down` (every pipeline actor,
// the checkpointer and finally the controller are told to exit; the supervisor quits when all are down).
#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <optional>
#include <set>

#include "actors/actors.hpp"

namespace mt::actors {
namespace {

struct supervisor_state {
  Context* ctx = nullptr;
  EngineResult* result = nullptr;  // restarts and restart_log (the controller fills the rest)
  monitor::Monitor* mon = nullptr;
  std::uint64_t epoch = 0;
  PeerHandles h;                              // h.compute and h.prefetcher: device 0's
  std::vector<compute_actor> computes;        // per device ([0] == h.compute)
  std::vector<prefetcher_actor> prefetchers;  // per device ([0] == h.prefetcher)
  node_actor controller;
  std::set<caf::actor_addr> alive;  // children not yet down
  // What the controller told: the run's end step and the next step due (events, the crash count).
  std::int64_t end_step = 0;
  std::int64_t next_report = 0;
  // Requests in force, sent again to a respawned actor before its Resume.
  std::uint64_t pause = 0;        // the PauseRequest in force (0: none)
  bool checkpoint_asked = false;  // a CheckpointRequest not taken yet
  // --- restarts -----------------------------------------------------------------------------------
  // The barrier's progress is a count (acks still due, roles waiting out their backoff), not a mode:
  // every message is handled the same during it except a restart request, which waits for its end.
  int acks_pending = 0;
  int respawns_pending = 0;
  int crashes_since_progress = 0;
  // Roles respawned since the last Resume, reported (actor_restarted, control took_effect) once resumed.
  struct Restarted {
    Role role;
    int device;
    std::optional<monitor::ControlRequest> ctl;
  };
  std::vector<Restarted> restarted;
  std::optional<Clock::time_point> restart_began;
  double restart_s = 0.0;
  std::map<int, std::deque<Clock::time_point>> failures;    // per role, within restart.window_s
  std::map<int, monitor::ControlRequest> restart_controls;  // role -> on-demand restart, until its down message
  std::map<int, monitor::ControlRequest> fault_controls;    // role -> injected fault, until it fires
  std::map<int, std::string> watchdog_restarts;             // role -> why the watchdog restarts it
  static constexpr const char* name = "supervisor";
};

using self_ptr = supervisor_actor::stateful_pointer<supervisor_state>;

int device_count(const supervisor_state& st) { return st.ctx->devices; }

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
  p.node = caf::actor_cast<caf::strong_actor_ptr>(st.controller);
  p.supervisor = caf::actor_cast<caf::strong_actor_ptr>(self);
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

caf::actor role_handle(const supervisor_state& st, Role r, int d = 0) {
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

// Tells the controller where restarts stand (the watchdog waits during one; the step records count them).
void report_restarts(self_ptr self) {
  auto& st = self->state;
  self->send(st.controller, RestartStatus{st.restart_began.has_value(), st.result->restarts, st.restart_s});
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
  device_resume.reserve(static_cast<std::size_t>(N));
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
    // The ledger keeps them by local micro-batch of data; the optimizer by the step's global index
    // (with several ranks this rank's are m * ranks + rank).
    const Context* dc = ctx->device_context(d);
    for (const auto& kv : dl.losses)
      if (kv.first >= opt_step)
        for (std::size_t mb = 0; mb < kv.second.size(); ++mb)
          losses.push_back(LossReport{st.epoch, kv.first, dc->global_micro_batch(static_cast<std::int64_t>(mb)),
                                      kv.second[mb].loss_sum, kv.second[mb].counted});
  }
  // In the order compute handed them over (the schedule's: layer-major a stage's micro-batches come
  // back to back), so the collector takes them, and with several ranks makes its transfers, in the
  // order every rank makes them.
  const Schedule& sched = ctx->sched;
  std::sort(staged.begin(), staged.end(), [&sched](const LayerGrads& a, const LayerGrads& b) {
    if (a.work.step != b.work.step) return a.work.step < b.work.step;
    const std::int64_t ia = sched.gradient_index(a.work.micro_batch, a.work.stage);
    const std::int64_t ib = sched.gradient_index(b.work.micro_batch, b.work.stage);
    if (ia != ib) return ia < ib;
    return a.device < b.device;
  });
  std::vector<LayerGradsComplete> complete;
  for (std::int64_t s = 0; s < ctx->stages(); ++s) {
    const std::size_t si = static_cast<std::size_t>(s);
    // A stage's sum of squares is known once its accumulator holds every micro-batch (stage gradients:
    // of the first pass). Stage gradients keep the gradient of the last pass: one micro-batch's comes
    // again with the re-issued slot; several micro-batches' (or several ranks') waits in its stage
    // accumulator, handed over here (unless the optimizer used and released it before the restart); a
    // stage another rank owns is complete there (this rank's optimizer receives its new weights).
    const std::int64_t M = ctx->data_micro_batches();
    if (led.accum_step[si] == opt_step && led.accum_count[si] >= M) {
      LayerGradsComplete c{st.epoch, opt_step, s, led.sumsq[si]};
      if (ctx->stage_accums != nullptr && led.accum_count[si] == ctx->passes * M) {
        c.accumulator = ctx->stage_accums->held_by(opt_step, s);
        c.owned_elsewhere = !ctx->host->owns(s);
      }
      complete.push_back(c);
    }
  }

  const Peers peers = make_peers(self);
  self->send(st.controller, peers);
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
    if (st.pause != 0) self->send(st.computes[static_cast<std::size_t>(d)], PauseRequest{st.pause});
    self->send(st.computes[static_cast<std::size_t>(d)], device_resume[static_cast<std::size_t>(d)]);
    self->send(st.prefetchers[static_cast<std::size_t>(d)], device_resume[static_cast<std::size_t>(d)]);
  }
  // Restarts are done: report them.
  if (st.restart_began) {
    st.restart_s += seconds_between(*st.restart_began, Clock::now());
    st.restart_began.reset();
  }
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
  report_restarts(self);
}

supervisor_actor::behavior_type shutting_down(self_ptr self);

// The run is over: tell every pipeline actor and the checkpointer to exit (the controller exits last,
// once it has reported the end: shutdown_atom), and quit once every child is down.
void shut_down(self_ptr self) {
  auto& st = self->state;
  ++st.epoch;  // acks of a barrier in progress no longer resume anything
  st.mon->board().update([&](monitor::RunFigures& f) { f.state = monitor::RunState::stopping; });
  for (const auto& kv : st.restart_controls)
    st.mon->control_progress(kv.second, "failed", {{"error", "the run ended first"}});
  for (const auto& kv : st.fault_controls)
    st.mon->control_progress(kv.second, "failed", {{"error", "the run ended first"}});
  st.restart_controls.clear();
  st.fault_controls.clear();
  st.ctx->gate.release_all();  // an optimizer waiting on a checkpoint must not block the exit
  self->send_exit(st.h.checkpointer, caf::exit_reason::user_shutdown);
  self->send_exit(st.h.loader, caf::exit_reason::user_shutdown);
  for (const auto& p : st.prefetchers) self->send_exit(p, caf::exit_reason::user_shutdown);
  for (const auto& c : st.computes) self->send_exit(c, caf::exit_reason::user_shutdown);
  self->send_exit(st.h.collector, caf::exit_reason::user_shutdown);
  self->send_exit(st.h.optimizer, caf::exit_reason::user_shutdown);
  self->become(shutting_down(self));
}

// A failure the run cannot go on from: stop the pipeline, and the controller reports the error and ends.
void fail(self_ptr self, const std::string& what) {
  shut_down(self);
  self->send(self->state.controller, RunFailed{what});
}

// Respawns `role` (of device d), bumps the epoch and runs the reset barrier; Resume follows once every
// actor acked.
void respawn(self_ptr self, Role role, int d) {
  auto& st = self->state;
  ++st.epoch;
  spawn_role(self, role, d);
  const std::uint64_t e = st.epoch;
  st.acks_pending = kRoleCount + 2 * (device_count(st) - 1);
  auto ack = [=](ack_atom) {
    if (self->state.epoch == e && --self->state.acks_pending == 0 && self->state.respawns_pending == 0)
      resume_all(self);
  };
  auto err = [=](caf::error&) { /* the target died; its down message (or respawn) starts a newer barrier */ };
  self->request(st.h.loader, caf::infinite, reset_atom::value, e).then(ack, err);
  for (const auto& p : st.prefetchers) self->request(p, caf::infinite, reset_atom::value, e).then(ack, err);
  for (const auto& c : st.computes) self->request(c, caf::infinite, reset_atom::value, e).then(ack, err);
  self->request(st.h.collector, caf::infinite, reset_atom::value, e).then(ack, err);
  self->request(st.h.optimizer, caf::infinite, reset_atom::value, e).then(ack, err);
}

void on_crash(self_ptr self, Role role, int device, const caf::error& reason) {
  auto& st = self->state;
  auto* res = st.result;
  const int r = static_cast<int>(role);
  const std::string why = self->system().render(reason);
  // Several ranks (mpirun): restarted here like any other; the other ranks wait in their next
  // collective with this rank. Each collective runs once: the collector's reductions are counted in
  // the ledger before re-issued work is taken again, and the step's gathered losses are kept there.
  // A rank that did not answer within cluster.collective_timeout_s (cluster::ClusterError) is not this
  // rank's to restart: the run ends, and with it the job.
  if (st.ctx->ranks > 1 && reason == caf::sec::request_timeout) {
    fail(self, actor_label(role, device) + " failed: " + why);
    return;
  }
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
      // The budget ran out: the role stays down; the controller writes a final checkpoint of the
      // tiles' version once they hold one, then ends the run with this error.
      const RestartSection& rs = st.ctx->cfg->restart;
      report_restarts(self);
      self->send(
          st.controller,
          BudgetExhausted{std::string(role_name(role)) + " failed " + std::to_string(failures) + " times within " +
                          std::to_string(static_cast<long long>(rs.window_s)) + " s (restart.max_restarts=" +
                          std::to_string(st.ctx->cfg->max_restarts_of(role_name(role))) + "); last failure: " + what});
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
  st.restarted.push_back(supervisor_state::Restarted{role, device, ctl});
  report_restarts(self);
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

bool restart_in_progress(const supervisor_state& st) {
  return st.acks_pending > 0 || st.respawns_pending > 0 || !st.restarted.empty();
}

// A down message while supervising: a pipeline actor crashed (restart it), or the checkpointer or the
// controller stopped (the run cannot go on).
void on_down(self_ptr self, const caf::down_msg& dm) {
  auto& s = self->state;
  s.alive.erase(dm.source);
  if (dm.source == s.h.checkpointer.address()) {
    s.mon->board().probe(monitor::ActorId::checkpointer).set_state(monitor::ActorState::stopped);
    fail(self, "the checkpointer stopped: " + self->system().render(dm.reason));
    return;
  }
  if (dm.source == s.controller.address()) {  // it is gone: its error is written here (no race left)
    if (s.result->error.empty()) s.result->error = "the run controller stopped: " + self->system().render(dm.reason);
    shut_down(self);
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
}

// A down message while shutting down: mark the actor stopped; quit after the last one.
void on_down_shutting(self_ptr self, const caf::down_msg& dm) {
  auto& s = self->state;
  s.alive.erase(dm.source);
  for (int r = 0; r < kRoleCount; ++r)
    if (dm.source == role_handle(s, static_cast<Role>(r)).address())
      s.mon->board().probe(actor_id(static_cast<Role>(r))).set_state(monitor::ActorState::stopped);
  for (int d = 1; d < device_count(s); ++d)
    for (Role r : {Role::prefetcher, Role::compute})
      if (dm.source == role_handle(s, r, d).address())
        s.mon->board().probe(actor_id(r), d).set_state(monitor::ActorState::stopped);
  if (dm.source == s.h.checkpointer.address())
    s.mon->board().probe(monitor::ActorId::checkpointer).set_state(monitor::ActorState::stopped);
  if (s.alive.empty()) self->quit();
}

supervisor_actor::behavior_type shutting_down(self_ptr self) {
  self->set_down_handler([=](caf::down_msg& dm) { on_down_shutting(self, dm); });
  if (self->state.alive.empty()) self->quit();
  return {
      [=](respawn_atom, std::int32_t, std::int32_t) {},
      [=](const Progress&) {},
      [=](const StopAt&) {},
      [=](const PauseRequest&) {},
      [=](wake_atom) {},
      [=](const CheckpointRequest&) {},
      [=](const CheckpointTaken&) {},
      [=](const RestartControl& m) {
        self->state.mon->control_progress(m.control, "failed", {{"error", "the run ended first"}});
      },
      [=](const WatchdogRestart&) {},
      // The controller has reported the end (the reply to RunFailed, or its own end): it may go now.
      [=](shutdown_atom) { self->send_exit(self->state.controller, caf::exit_reason::user_shutdown); },
  };
}

supervisor_actor::behavior_type supervising(self_ptr self) {
  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });
  return {
      // A role's backoff after a failure is over: respawn it and run the barrier.
      [=](respawn_atom, std::int32_t role, std::int32_t device) {
        --self->state.respawns_pending;
        respawn(self, static_cast<Role>(role), device);
      },
      [=](const Progress& m) {
        auto& st = self->state;
        if (m.next_report != st.next_report) st.crashes_since_progress = 0;
        st.next_report = m.next_report;
        st.end_step = std::min(st.end_step, m.end_step);
      },
      // The run's end step (a stop request): every device's compute and prefetcher stop there, and a
      // Resume names it from now on.
      [=](const StopAt& m) {
        auto& st = self->state;
        st.end_step = std::min(st.end_step, m.end_step);
        for (const auto& c : st.computes)
          self->request(c, caf::infinite, StopAt{st.end_step}).then([](const StopAt&) {}, [](caf::error&) {});
        for (const auto& p : st.prefetchers) self->send(p, StopAt{st.end_step});
      },
      [=](const PauseRequest& m) {
        self->state.pause = m.request;
        for (const auto& c : self->state.computes) self->send(c, m);
      },
      [=](wake_atom) {
        self->state.pause = 0;
        for (const auto& c : self->state.computes) self->send(c, wake_atom::value);
      },
      [=](const CheckpointRequest& m) {
        self->state.checkpoint_asked = true;
        self->send(self->state.h.optimizer, m);
      },
      // From the optimizer (before its ack of any later barrier, so a Resume never asks again).
      [=](const CheckpointTaken&) { self->state.checkpoint_asked = false; },
      // POST /control/restart or /control/fault (the controller parsed the actor).
      [=](const RestartControl& m) {
        auto& st = self->state;
        const int r = static_cast<int>(m.role);
        if (m.control.action == "fault") {
          st.fault_controls[r] = m.control;
          st.ctx->fault->on_demand[r].store(1);
          return;
        }
        // Not in the middle of a restart: the actor must be up and the barrier done (the controller
        // takes it again on a later tick).
        if (restart_in_progress(st) || st.restart_controls.count(r)) {
          st.mon->board().put_back_controls({m.control});
          return;
        }
        st.restart_controls[r] = m.control;
        self->send_exit(role_handle(st, m.role),
                        caf::make_error(caf::sec::runtime_error,
                                        "restart requested by " + m.control.id + " from " + m.control.peer));
      },
      [=](const WatchdogRestart& m) {
        auto& st = self->state;
        if (restart_in_progress(st)) return;  // the restart in progress resets the watchdog
        st.watchdog_restarts[static_cast<int>(m.role)] = m.why;
        self->send_exit(role_handle(st, m.role), caf::make_error(caf::sec::runtime_error, m.why));
      },
      [=](shutdown_atom) {
        shut_down(self);
        self->send_exit(self->state.controller, caf::exit_reason::user_shutdown);
      },
  };
}

supervisor_actor::behavior_type supervisor_fn(self_ptr self, Context* ctx, EngineResult* result) {
  auto& st = self->state;
  st.ctx = ctx;
  st.result = result;
  st.end_step = ctx->end_step;
  st.next_report = ctx->first_step;
  st.mon = ctx->monitor;
  st.mon->board().update([](monitor::RunFigures& f) { f.state = monitor::RunState::running; });
  st.computes.resize(static_cast<std::size_t>(ctx->devices));
  st.prefetchers.resize(static_cast<std::size_t>(ctx->devices));
  st.controller = spawn_run_controller(self->system(), ctx, result, self);
  self->monitor(st.controller);
  st.alive.insert(st.controller.address());
  for (int r = 0; r < kRoleCount; ++r) {
    const Role role = static_cast<Role>(r);
    const bool per_device = role == Role::compute || role == Role::prefetcher;
    for (int d = 0; d < (per_device ? ctx->devices : 1); ++d) spawn_role(self, role, d);
  }
  st.h.checkpointer = spawn_checkpointer(self->system(), ctx);
  self->monitor(st.h.checkpointer);
  st.alive.insert(st.h.checkpointer.address());
  if (st.next_report >= st.end_step)
    self->send(st.h.checkpointer, make_peers(self));  // nothing to run: the controller ends at once
  else
    resume_all(self);
  return supervising(self);
}

}  // namespace

supervisor_actor spawn_node(caf::actor_system& sys, Context* ctx, EngineResult* result) {
  return sys.spawn(supervisor_fn, ctx, result);
}

}  // namespace mt::actors
