// The node: the supervisor of one training run. Spawns the five pipeline actors (each detached: its
// own thread), monitors them, and restarts any that crashes:
//   1. respawn the crashed role; bump the epoch;
//   2. reset barrier: every pipeline actor drops its in-flight work, adopts the new epoch and acks
//      (an actor acks only between handlers, and the prefetcher and compute ack only once the copy
//      engine has finished what they queued, so after the barrier nothing from the old epoch runs);
//   3. Peers + Resume to all, then re-issue the in-flight work from the ledger: staged gradients not
//      yet accumulated (to the collector), the losses and complete stages of the optimizer's step (to
//      the optimizer). Compute and the prefetcher continue from compute's ledger position.
// It also assembles the per-step progress record from the actors' reports, honours the stop flag
// (SIGINT/SIGTERM: finish the step in progress, then stop), turns checkpoint requests (SIGUSR1, the
// train.save_minutes timer) into the flag the optimizer takes, spawns the checkpointer (not restarted:
// it reports failures itself), asks it for the final checkpoint once every step is done, reports each
// CheckpointDone / CheckpointFailed, and shuts everything down at the end.
#include <algorithm>
#include <array>
#include <cmath>
#include <set>

#include "actors/actors.hpp"

namespace mt::actors {

struct NodeRun {
  Context* ctx = nullptr;
  EngineResult* result = nullptr;
};

namespace {

struct StepReports {
  bool compute = false, optimizer = false;
  ComputeStepDone c;
  OptimizerStepDone o;
  double offload_s = 0.0;
};

struct node_state {
  Context* ctx = nullptr;
  EngineResult* result = nullptr;
  std::uint64_t epoch = 0;
  PeerHandles h;
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
  static constexpr const char* name = "node";
};

using self_ptr = node_actor::stateful_pointer<node_state>;

Peers make_peers(self_ptr self) {
  auto& h = self->state.h;
  Peers p;
  p.loader = caf::actor_cast<caf::strong_actor_ptr>(h.loader);
  p.prefetcher = caf::actor_cast<caf::strong_actor_ptr>(h.prefetcher);
  p.compute = caf::actor_cast<caf::strong_actor_ptr>(h.compute);
  p.collector = caf::actor_cast<caf::strong_actor_ptr>(h.collector);
  p.optimizer = caf::actor_cast<caf::strong_actor_ptr>(h.optimizer);
  p.node = caf::actor_cast<caf::strong_actor_ptr>(self);
  p.checkpointer = caf::actor_cast<caf::strong_actor_ptr>(h.checkpointer);
  return p;
}

void spawn_role(self_ptr self, Role r) {
  auto& st = self->state;
  auto& sys = self->system();
  switch (r) {
    case Role::loader:
      st.h.loader = spawn_loader(sys, st.ctx, st.epoch);
      self->monitor(st.h.loader);
      break;
    case Role::prefetcher:
      st.h.prefetcher = spawn_prefetcher(sys, st.ctx, st.epoch);
      self->monitor(st.h.prefetcher);
      break;
    case Role::compute:
      st.h.compute = spawn_compute(sys, st.ctx, st.epoch);
      self->monitor(st.h.compute);
      break;
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
  // Read the ledger first, then send: once the collector has its Resume and re-issued work it writes
  // the ledger again, so nothing may be read from it after the first send.
  const std::int64_t opt_step = optimizer_step(ctx);
  const Resume r{st.epoch, led.compute_pos, opt_step, st.end_step};
  // Staged gradients the collector has not (or not known to have) taken, in schedule order.
  std::vector<LayerGrads> staged;
  for (int k = 0; k < static_cast<int>(led.staging.size()); ++k) {
    const auto& e = led.staging[static_cast<std::size_t>(k)];
    if (e.state == StagingEntry::State::full)
      staged.push_back(
          LayerGrads{st.epoch, WorkId{e.step, e.micro_batch, e.stage, static_cast<std::int32_t>(Phase::backward)}, k});
  }
  std::sort(staged.begin(), staged.end(), [](const LayerGrads& a, const LayerGrads& b) {
    if (a.work.step != b.work.step) return a.work.step < b.work.step;
    if (a.work.micro_batch != b.work.micro_batch) return a.work.micro_batch < b.work.micro_batch;
    return a.work.stage > b.work.stage;
  });
  // The optimizer's step: its micro-batch losses and every stage whose gradients are complete.
  std::vector<LossReport> losses;
  for (const auto& kv : led.losses)
    if (kv.first >= opt_step)
      for (std::size_t mb = 0; mb < kv.second.size(); ++mb)
        losses.push_back(LossReport{st.epoch, kv.first, static_cast<std::int64_t>(mb), kv.second[mb].loss_sum,
                                    kv.second[mb].counted});
  std::vector<LayerGradsComplete> complete;
  for (std::int64_t s = 0; s < ctx->stages(); ++s) {
    const std::size_t si = static_cast<std::size_t>(s);
    if (led.accum_step[si] == opt_step && led.accum_count[si] == ctx->micro_batches())
      complete.push_back(LayerGradsComplete{st.epoch, opt_step, s, led.sumsq[si]});
  }

  const Peers peers = make_peers(self);
  self->send(st.h.loader, peers);
  self->send(st.h.prefetcher, peers);
  self->send(st.h.compute, peers);
  self->send(st.h.collector, peers);
  self->send(st.h.optimizer, peers);
  self->send(st.h.checkpointer, peers);
  self->send(st.h.loader, r);
  self->send(st.h.collector, r);
  self->send(st.h.optimizer, r);
  for (const auto& g : staged) self->send(st.h.collector, g);
  for (const auto& l : losses) self->send(st.h.optimizer, l);
  for (const auto& c : complete) self->send(st.h.optimizer, c);
  // Compute and the prefetcher last: they start the flow again.
  self->send(st.h.compute, r);
  self->send(st.h.prefetcher, r);
}

void shutdown(self_ptr self) {
  auto& st = self->state;
  if (st.shutting_down) return;
  st.shutting_down = true;
  st.ctx->gate.release_all();  // an optimizer waiting on a checkpoint must not block the exit
  self->send_exit(st.h.checkpointer, caf::exit_reason::user_shutdown);
  if (st.alive.empty()) {
    self->quit();
    return;
  }
  self->send_exit(st.h.loader, caf::exit_reason::user_shutdown);
  self->send_exit(st.h.prefetcher, caf::exit_reason::user_shutdown);
  self->send_exit(st.h.compute, caf::exit_reason::user_shutdown);
  self->send_exit(st.h.collector, caf::exit_reason::user_shutdown);
  self->send_exit(st.h.optimizer, caf::exit_reason::user_shutdown);
}

void fail(self_ptr self, const std::string& what) {
  if (self->state.result->error.empty()) self->state.result->error = what;
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
  const bool stop_flag = ctx->job->stop != nullptr && ctx->job->stop->load();
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
    if (st.final_requested && ev.step == st.final_step) shutdown(self);
    return;
  }
  st.result->checkpoints.push_back(ev);
  st.last_checkpoint = Clock::now();
  if (st.ctx->job->on_checkpoint) {
    try {
      st.ctx->job->on_checkpoint(ev);
    } catch (const std::exception& e) {
      fail(self, std::string("checkpoint report failed: ") + e.what());
      return;
    }
  }
  if (st.final_requested && ev.step == st.final_step) shutdown(self);
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
    st.result->steps.push_back(rec);
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

void on_crash(self_ptr self, Role role, const caf::error& reason) {
  auto& st = self->state;
  auto* res = st.result;
  const std::string why = self->system().render(reason);
  ++res->restarts;
  res->restart_log.push_back(std::string(role_name(role)) + " crashed (" + why + "), restarted");
  // A deterministic failure (bad data, a bug) recurs at once after a restart: give up when crashes
  // repeat without a step finishing in between.
  if (++st.crashes_since_progress > 3) {
    fail(self, std::string(role_name(role)) + " keeps crashing without progress: " + why);
    return;
  }
  ++st.epoch;
  spawn_role(self, role);
  const std::uint64_t e = st.epoch;
  st.acks_pending = kRoleCount;
  auto ack = [=](ack_atom) {
    if (self->state.epoch == e && --self->state.acks_pending == 0 && !self->state.shutting_down) resume_all(self);
  };
  auto err = [=](caf::error&) { /* the target died; its down message starts a newer barrier */ };
  self->request(st.h.loader, caf::infinite, reset_atom::value, e).then(ack, err);
  self->request(st.h.prefetcher, caf::infinite, reset_atom::value, e).then(ack, err);
  self->request(st.h.compute, caf::infinite, reset_atom::value, e).then(ack, err);
  self->request(st.h.collector, caf::infinite, reset_atom::value, e).then(ack, err);
  self->request(st.h.optimizer, caf::infinite, reset_atom::value, e).then(ack, err);
}

void poll_stop(self_ptr self) {
  auto& st = self->state;
  if (st.shutting_down) return;
  // Checkpoint requests (SIGUSR1) and the timer: the optimizer takes the flag at its next step.
  if (st.ctx->checkpointing) {
    std::atomic<bool>* req = st.ctx->job->checkpoint.request;
    if (req && req->exchange(false)) st.ctx->checkpoint_request.store(true);
    const double minutes = st.ctx->job->checkpoint.save_minutes;
    if (minutes > 0 && seconds_between(st.last_checkpoint, Clock::now()) >= minutes * 60.0) {
      st.ctx->checkpoint_request.store(true);
      st.last_checkpoint = Clock::now();
    }
  }
  const std::atomic<bool>* flag = st.ctx->job->stop;
  if (flag && flag->load() && !st.stop_requested) {
    st.stop_requested = true;
    self->request(st.h.compute, caf::infinite, StopAt{st.next_report})
        .then(
            [=](const StopAt& r) {
              auto& s = self->state;
              s.end_step = std::min(s.end_step, r.end_step);
              s.result->stopped_early = s.end_step < s.ctx->end_step;
              self->send(s.h.prefetcher, StopAt{s.end_step});
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
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    s.alive.erase(dm.source);
    if (s.shutting_down) {
      if (s.alive.empty()) self->quit();
      return;
    }
    if (dm.source == s.h.checkpointer.address()) {
      fail(self, "the checkpointer stopped: " + self->system().render(dm.reason));
      return;
    }
    const std::array<std::pair<Role, caf::actor_addr>, kRoleCount> roles{{
        {Role::loader, s.h.loader.address()},
        {Role::prefetcher, s.h.prefetcher.address()},
        {Role::compute, s.h.compute.address()},
        {Role::collector, s.h.collector.address()},
        {Role::optimizer, s.h.optimizer.address()},
    }};
    for (const auto& r : roles)
      if (r.second == dm.source) {
        on_crash(self, r.first, dm.reason);
        return;
      }
  });
  for (int r = 0; r < kRoleCount; ++r) spawn_role(self, static_cast<Role>(r));
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
        auto& r = self->state.reports[m.step];
        r.compute = true;
        r.c = m;
        emit_ready_steps(self);
      },
      [=](const CollectorStepDone& m) { self->state.reports[m.step].offload_s = m.offload_s; },
      [=](const OptimizerStepDone& m) {
        auto& r = self->state.reports[m.step];
        r.optimizer = true;
        r.o = m;
        emit_ready_steps(self);
      },
      [=](tick_atom) { poll_stop(self); },
      [=](const CheckpointDone& m) {
        on_checkpoint(self, CheckpointEvent{m.step, true, m.path, "", m.seconds, m.bytes});
      },
      [=](const CheckpointFailed& m) {
        on_checkpoint(self, CheckpointEvent{m.step, false, "", m.error, 0.0, 0});
      },
  };
}

node_actor spawn_node(caf::actor_system& sys, Context* ctx, EngineResult* result) {
  return sys.spawn(node_fn, NodeRun{ctx, result});
}

}  // namespace mt::actors
