// Every message of the streaming engine, with the typed interface of each actor. Only actor sources
// include this header (it pulls in CAF).
//
// Dataflow of one step (actors/README.md, "Actors and dataflow"):
//   compute --BatchRequest--> loader --MicroBatch--> compute
//   prefetcher --(copy engine)--CopyDone--> prefetcher --WeightsReady--> compute --SlotFree--> prefetcher
//   boundaries on the host: compute --(copy engine)--BoundarySaved--> compute, prefetcher
//   compute --LayerGrads--> collector --GradSlotFree--> compute
//   optimizer --AccumulatorFree--> collector (stage gradients of several micro-batches, or of several ranks)
//   compute --LossReport--> optimizer, node
//   collector --LayerGradsComplete--> optimizer --LayerUpdated(version)--> prefetcher
//   compute/collector/optimizer --*StepDone--> node (timings; the node prints the progress line)
//   several ranks (mpirun): no new messages; the collector and the optimizer transfer over MPI from
//   their own threads (cluster/grad_reduce.hpp, actors/rank_losses.hpp)
// Checkpoints (checkpointer.cpp): optimizer --CheckpointNow(v)--> checkpointer (before the first
//   update towards version v), optimizer --LayerUpdated--> checkpointer (writes stage s at version v
//   at once), checkpointer --CheckpointDone / CheckpointFailed--> node; node --CheckpointNow--> checkpointer
//   for the final checkpoint after the last step.
// The node is two actors: the supervisor (supervisor.cpp: spawns, monitors, restarts) and the run
// controller (run_controller.cpp: progress, checkpoints, evaluation, control, watchdog); "node" below
// is the controller where the pipeline reports, the supervisor for control.
// Control (supervisor -> every pipeline actor): Peers (who is who), reset (a barrier: drop in-flight work
// and adopt a new epoch, reply ack), Resume (rebuild state from the ledger and go), StopAt.
//
// Restart semantics: every work message names its (step, micro-batch, stage, phase) and carries the
// epoch it was sent in; the node bumps the epoch when it restarts a crashed actor, and a receiver
// drops any work message from another epoch (it was re-issued in the new one).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/roles.hpp"
#include "actors/schedule.hpp"
#include "data/loader.hpp"
#include "monitor/status_board.hpp"

namespace mt::plan {

// The schedule's positions travel in messages (found by argument-dependent lookup, beside Pos).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Pos& x) {
  return f(caf::meta::type_name("Pos"), x.step, x.micro_batch, x.op, x.index);
}

}  // namespace mt::plan

namespace mt::actors {

// ---- atoms -------------------------------------------------------------------------------------
using reset_atom = caf::atom_constant<caf::atom("reset")>;  // supervisor -> actor: barrier request (new epoch)
using ack_atom = caf::atom_constant<caf::atom("ack")>;      // actor -> supervisor: reset done, nothing in flight
using tick_atom = caf::atom_constant<caf::atom("tick")>;    // run controller -> itself: poll flags, controls
using wake_atom = caf::atom_constant<caf::atom("wake")>;    // supervisor -> compute: the pause is lifted, continue
using respawn_atom =
    caf::atom_constant<caf::atom("respawn")>;  // supervisor -> itself: respawn (role, device) after its backoff
using shutdown_atom =
    caf::atom_constant<caf::atom("shutdown")>;  // run controller -> supervisor: the run is over, stop every actor

// ---- work identity -------------------------------------------------------------------------------
// Names a unit of work: (step, micro-batch, stage, phase). micro_batch is -1 for per-step work
// (optimizer), stage -1 for per-micro-batch work (data).
struct WorkId {
  std::int64_t step = 0;
  std::int64_t micro_batch = -1;
  std::int64_t stage = -1;
  std::int32_t phase = 0;  // static_cast<int32_t>(Phase)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkId& x) {
  return f(caf::meta::type_name("WorkId"), x.step, x.micro_batch, x.stage, x.phase);
}

// ---- control ---------------------------------------------------------------------------------------

// supervisor -> every pipeline actor and the run controller: the current handles of the others (sent at
// start and after each restart, since a restarted actor has a new handle). Receivers cast them to the
// typed handles. prefetcher and compute are the receiver's device's (device 0's for the other roles);
// computes and prefetchers list every device's (device.gpus), in device order. node: the node's run
// controller (every report goes there); supervisor: the node's supervisor.
struct Peers {
  caf::strong_actor_ptr loader, prefetcher, compute, collector, optimizer, node, supervisor, checkpointer;
  std::vector<caf::strong_actor_ptr> computes, prefetchers;
};

// node -> every pipeline actor, after the reset barrier (or at start): continue from the durable
// state. pos: compute's next op (from the ledger); opt_step: the step the optimizer is on (the
// smallest tile version); end_step: the step to stop before.
struct Resume {
  std::uint64_t epoch = 0;
  Pos pos;
  std::int64_t opt_step = 0;
  std::int64_t end_step = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Resume& x) {
  return f(caf::meta::type_name("Resume"), x.epoch, x.pos, x.opt_step, x.end_step);
}

// run controller -> compute (request; reply: the end step compute will honour, never inside a step it
// has begun), then -> supervisor (the run's end step, named in every later Resume) -> compute and
// prefetcher (plain): stop streaming and computing at end_step.
struct StopAt {
  std::int64_t end_step = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StopAt& x) {
  return f(caf::meta::type_name("StopAt"), x.end_step);
}

// ---- data --------------------------------------------------------------------------------------------

// compute -> loader: send micro-batch (step, micro_batch), micro_batch the step's global index
// (device d's local m is m * N + d) (work phase: data).
struct BatchRequest {
  std::uint64_t epoch = 0;
  std::int64_t step = 0;
  std::int64_t micro_batch = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, BatchRequest& x) {
  return f(caf::meta::type_name("BatchRequest"), x.epoch, x.step, x.micro_batch);
}

// loader -> compute (of the device that runs the micro-batch): the tokens and targets of micro-batch (step,
// micro_batch). Local only (a shared pointer to immutable host memory).
struct MicroBatch {
  std::uint64_t epoch = 0;
  std::int64_t step = 0;
  std::int64_t micro_batch = 0;
  std::shared_ptr<const data::Batch> batch;
};

// ---- weights -----------------------------------------------------------------------------------------

// prefetcher -> compute: load `load` (0 or 1) of the op at `pos` is in slot `slot`. A weights load:
// weight slot `slot` holds stage `stage`'s params at tile version `version`. A boundary load
// (boundaries on the host): activation slot `slot` holds boundary `stage` of the op's micro-batch,
// `version` = its stamp (global micro-batch index + 1) (work phase: prefetch).
struct WeightsReady {
  std::uint64_t epoch = 0;
  Pos pos;
  std::int32_t load = 0;
  std::int64_t stage = 0;
  std::int32_t slot = 0;
  std::uint64_t version = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WeightsReady& x) {
  return f(caf::meta::type_name("WeightsReady"), x.epoch, x.pos, x.load, x.stage, x.slot, x.version);
}

// copy engine (its worker thread, via anon_send) -> prefetcher: the copy of load `load` of the op at
// `pos` into its slot `slot` has landed (work phase: prefetch).
struct CopyDone {
  std::uint64_t epoch = 0;
  Pos pos;
  std::int32_t load = 0;
  std::int32_t slot = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CopyDone& x) {
  return f(caf::meta::type_name("CopyDone"), x.epoch, x.pos, x.load, x.slot);
}

// compute -> prefetcher: the op at `pos` is done with the slot `slot` of its load `load` (a weight
// slot or an activation slot, by the op's load kind); it may be refilled.
struct SlotFree {
  std::uint64_t epoch = 0;
  Pos pos;
  std::int32_t load = 0;
  std::int32_t slot = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SlotFree& x) {
  return f(caf::meta::type_name("SlotFree"), x.epoch, x.pos, x.load, x.slot);
}

// copy engine (its worker thread, via anon_send) -> compute and prefetcher: boundary `boundary` of
// micro-batch (step, micro_batch) has landed in host memory (boundaries on the host): compute may
// reuse the forward ring entry it came from, the prefetcher may stream it back for the backward.
struct BoundarySaved {
  std::uint64_t epoch = 0;
  std::int64_t step = 0;
  std::int64_t micro_batch = 0;
  std::int64_t boundary = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, BoundarySaved& x) {
  return f(caf::meta::type_name("BoundarySaved"), x.epoch, x.step, x.micro_batch, x.boundary);
}

// optimizer -> prefetcher (and node): stage `stage` now holds tile version `version` (= step + 1);
// the next step's loads of it may stream.
struct LayerUpdated {
  std::uint64_t epoch = 0;
  std::int64_t step = 0;
  std::int64_t stage = 0;
  std::uint64_t version = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LayerUpdated& x) {
  return f(caf::meta::type_name("LayerUpdated"), x.epoch, x.step, x.stage, x.version);
}

// ---- gradients ----------------------------------------------------------------------------------------

// compute -> collector: gradient staging slot `grad_slot` of device `device` holds work.stage's
// gradients of local micro-batch work.micro_batch (the round: global micro-batch round * N + device)
// of step work.step (phase backward / head). Once every device's slot of the round is in, the collector
// reduces them on the devices, copies the sum out once and accumulates it.
struct LayerGrads {
  std::uint64_t epoch = 0;
  WorkId work;
  std::int32_t grad_slot = 0;
  std::int32_t device = 0;
  std::int64_t handed_ns = 0;  // steady clock when compute handed the slot over (0: re-issued after a restart)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LayerGrads& x) {
  return f(caf::meta::type_name("LayerGrads"), x.epoch, x.work, x.grad_slot, x.device, x.handed_ns);
}

// collector -> compute (of `device`): staging slot `grad_slot` has been copied to the host (or summed
// into device 0's, which was); compute may reuse it.
struct GradSlotFree {
  std::uint64_t epoch = 0;
  WorkId work;
  std::int32_t grad_slot = 0;
  std::int32_t device = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GradSlotFree& x) {
  return f(caf::meta::type_name("GradSlotFree"), x.epoch, x.work, x.grad_slot, x.device);
}

// compute -> optimizer, node: the head of micro-batch (step, micro_batch) (global index) gave this loss sum over
// `counted` tokens (the optimizer needs the step's total count to normalise the gradient).
struct LossReport {
  std::uint64_t epoch = 0;
  std::int64_t step = 0;
  std::int64_t micro_batch = 0;
  double loss_sum = 0.0;
  std::int64_t counted = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LossReport& x) {
  return f(caf::meta::type_name("LossReport"), x.epoch, x.step, x.micro_batch, x.loss_sum, x.counted);
}

// collector -> optimizer: stage's gradient of `step` is complete; its sum of squares. grad_slot and
// accumulator -1: it is in the tile's accumulator (train.gradient_buffer=model), or it was not kept
// (stage, the first of two passes: the sum is all it brings). grad_slot >= 0 (stage, one micro-batch):
// it waits in that staging slot of device 0 (over a link, in Context::grad_landing[grad_slot]); the
// optimizer frees the slot after the update. accumulator >= 0 (stage, several micro-batches or ranks): it waits
// in that one of Context::stage_accums, which the optimizer releases after the update. The
// supervisor sends these too, to a respawned optimizer.
struct LayerGradsComplete {
  std::uint64_t epoch = 0;
  std::int64_t step = 0;
  std::int64_t stage = 0;
  double sumsq = 0.0;
  std::int32_t grad_slot = -1;
  std::int32_t accumulator = -1;
  // Stage gradients across sharded ranks: the stage's last pass is summed, by its owner, another rank;
  // this rank's optimizer receives the new weights in its turn (the stage holds no slot or accumulator here).
  bool owned_elsewhere = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LayerGradsComplete& x) {
  return f(caf::meta::type_name("LayerGradsComplete"), x.epoch, x.step, x.stage, x.sumsq, x.grad_slot, x.accumulator,
           x.owned_elsewhere);
}

// optimizer -> collector: a stage accumulator was released (Context::stage_accums); work waiting for
// one may go on.
struct AccumulatorFree {
  std::uint64_t epoch = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AccumulatorFree& x) {
  return f(caf::meta::type_name("AccumulatorFree"), x.epoch);
}

// ---- per-step reports to the node (timings for the progress line) ---------------------------------

// compute -> node: compute finished every op of `step`.
struct ComputeStepDone {
  std::int64_t step = 0;
  double wait_weights_s = 0.0;
  double compute_s = 0.0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ComputeStepDone& x) {
  return f(caf::meta::type_name("ComputeStepDone"), x.step, x.wait_weights_s, x.compute_s);
}

// collector -> node: every stage of `step` is accumulated.
struct CollectorStepDone {
  std::int64_t step = 0;
  double offload_s = 0.0;
  // Several ranks: the step's time in transfers with other ranks (reduce_s), and the part of it after
  // compute handed over the step's last gradient (reduce_tail_s: nothing of the backward left to hide it).
  double reduce_s = 0.0;
  double reduce_tail_s = 0.0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CollectorStepDone& x) {
  return f(caf::meta::type_name("CollectorStepDone"), x.step, x.offload_s, x.reduce_s, x.reduce_tail_s);
}

// optimizer -> node: every stage of `step` is updated (tile versions step + 1).
struct OptimizerStepDone {
  std::int64_t step = 0;
  double loss = 0.0, grad_norm = 0.0, clip = 1.0, lr = 0.0;
  std::int64_t counted = 0;
  double optimizer_s = 0.0;
  double checkpoint_wait_s = 0.0;  // the optimizer waited for the checkpointer (version gate)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, OptimizerStepDone& x) {
  return f(caf::meta::type_name("OptimizerStepDone"), x.step, x.loss, x.grad_norm, x.clip, x.lr, x.counted,
           x.optimizer_s, x.checkpoint_wait_s);
}

// ---- pause and checkpoint requests ------------------------------------------------------------------
// Requests the run controller turns into messages (a control request, SIGUSR1, the train.save_minutes
// timer), through the supervisor: the actor that acts on one keeps it in its state, and the supervisor
// sends it again before the Resume of a respawned one (which starts without it).

// run controller -> supervisor -> every compute: hold before the first op of the next step (until wake). `request`
// numbers the node's pause requests, so a late PauseHeld of an earlier one is told apart.
struct PauseRequest {
  std::uint64_t request = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PauseRequest& x) {
  return f(caf::meta::type_name("PauseRequest"), x.request);
}

// compute -> run controller: holding for pause `request` before step `step` (device `device`'s compute).
struct PauseHeld {
  std::uint64_t request = 0;
  std::int64_t step = 0;
  std::int32_t device = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PauseHeld& x) {
  return f(caf::meta::type_name("PauseHeld"), x.request, x.step, x.device);
}

// run controller -> supervisor -> optimizer: checkpoint at the next step boundary it can still gate (its next
// checkpoint decision, right before the first update of a step).
struct CheckpointRequest {};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckpointRequest&) {
  return f(caf::meta::type_name("CheckpointRequest"));
}

// optimizer -> run controller and supervisor: the request took effect as checkpoint `step` (sent before
// that checkpoint's CheckpointNow, so the controller has it before the checkpointer's CheckpointDone,
// and before the optimizer's ack of a later barrier, so the supervisor does not ask again).
struct CheckpointTaken {
  std::int64_t step = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckpointTaken& x) {
  return f(caf::meta::type_name("CheckpointTaken"), x.step);
}

// ---- between the node's two actors: the supervisor and the run controller ---------------------------

// run controller -> supervisor: the next step whose record is due (every step before it finished),
// and the run's end step as the controller knows it (lowered when the restart budget ran out). The
// supervisor names next_report in restart events and counts crashes without progress from it, and
// names the end step in every later Resume.
struct Progress {
  std::int64_t next_report = 0;
  std::int64_t end_step = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Progress& x) {
  return f(caf::meta::type_name("Progress"), x.next_report, x.end_step);
}

// supervisor -> run controller: where restarts stand. restarting: a barrier (or a backoff) is in
// progress (the watchdog waits); restarts: the run's count so far; restart_s: seconds lost to
// finished restarts.
struct RestartStatus {
  bool restarting = false;
  std::int64_t restarts = 0;
  double restart_s = 0.0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RestartStatus& x) {
  return f(caf::meta::type_name("RestartStatus"), x.restarting, x.restarts, x.restart_s);
}

// supervisor -> run controller: an actor's restart budget ran out (`error` says which and why): write
// the final checkpoint once the tiles hold one version, then end the run with the error.
struct BudgetExhausted {
  std::string error;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, BudgetExhausted& x) {
  return f(caf::meta::type_name("BudgetExhausted"), x.error);
}

// supervisor -> run controller: the run cannot go on (`error`); the supervisor is already stopping
// the pipeline, the controller reports the end and answers shutdown_atom.
struct RunFailed {
  std::string error;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RunFailed& x) {
  return f(caf::meta::type_name("RunFailed"), x.error);
}

// run controller -> supervisor: the monitor's POST /control/restart or /control/fault for `role`
// (device 0's). Local only.
struct RestartControl {
  monitor::ControlRequest control;
  Role role = Role::compute;
};

// run controller -> supervisor: the watchdog restarts `role` (device 0's); `why` becomes its failure.
struct WatchdogRestart {
  Role role = Role::compute;
  std::string why;
};

// ---- checkpoints ---------------------------------------------------------------------------------

// optimizer -> checkpointer: a checkpoint of tile version `step` (= steps done) is due; the optimizer
// has registered it in the checkpoint gate (context.hpp) before updating any stage past `step`, and
// will not update stage s past it until the checkpointer marked s written. node -> checkpointer: the
// final checkpoint after the last step (every tile already at `step`; nothing updates them any more).
// The checkpointer writes every stage already at version `step` at once and the others on their
// LayerUpdated. A CheckpointNow for a step in progress is a no-op; for the step last published it
// answers CheckpointDone again.
struct CheckpointNow {
  std::int64_t step = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckpointNow& x) {
  return f(caf::meta::type_name("CheckpointNow"), x.step);
}

// checkpointer -> node: checkpoint `step` is published at `path` (atomic rename, `latest` updated,
// retention applied). seconds: from CheckpointNow to publish; bytes: data bytes written; cpu_seconds:
// the checkpointer thread's CPU time meanwhile (checksums, copies, system calls: what it took from
// training on busy cores).
struct CheckpointDone {
  std::int64_t step = 0;
  std::string path;
  double seconds = 0.0;
  std::uint64_t bytes = 0;
  double cpu_seconds = 0.0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckpointDone& x) {
  return f(caf::meta::type_name("CheckpointDone"), x.step, x.path, x.seconds, x.bytes, x.cpu_seconds);
}

// checkpointer -> node: checkpoint `step` could not be written (disk full, I/O error: `error` names
// the file). Nothing was published, the previous checkpoints are intact, training goes on.
struct CheckpointFailed {
  std::int64_t step = 0;
  std::string error;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckpointFailed& x) {
  return f(caf::meta::type_name("CheckpointFailed"), x.step, x.error);
}

// ---- typed interfaces ------------------------------------------------------------------------------
// Every pipeline actor also takes the control messages: Peers, Resume, reset (-> ack).

using loader_actor = caf::typed_actor<caf::reacts_to<BatchRequest>, caf::reacts_to<Peers>, caf::reacts_to<Resume>,
                                      caf::replies_to<reset_atom, std::uint64_t>::with<ack_atom>>;

using prefetcher_actor =
    caf::typed_actor<caf::reacts_to<SlotFree>, caf::reacts_to<CopyDone>, caf::reacts_to<LayerUpdated>,
                     caf::reacts_to<BoundarySaved>, caf::reacts_to<StopAt>, caf::reacts_to<Peers>,
                     caf::reacts_to<Resume>, caf::replies_to<reset_atom, std::uint64_t>::with<ack_atom>>;

using compute_actor =
    caf::typed_actor<caf::reacts_to<WeightsReady>, caf::reacts_to<MicroBatch>, caf::reacts_to<GradSlotFree>,
                     caf::reacts_to<BoundarySaved>, caf::replies_to<StopAt>::with<StopAt>, caf::reacts_to<Peers>,
                     caf::reacts_to<Resume>, caf::replies_to<reset_atom, std::uint64_t>::with<ack_atom>,
                     caf::reacts_to<PauseRequest>, caf::reacts_to<wake_atom>>;

using collector_actor =
    caf::typed_actor<caf::reacts_to<LayerGrads>, caf::reacts_to<AccumulatorFree>, caf::reacts_to<Peers>,
                     caf::reacts_to<Resume>, caf::replies_to<reset_atom, std::uint64_t>::with<ack_atom>>;

using optimizer_actor =
    caf::typed_actor<caf::reacts_to<LossReport>, caf::reacts_to<LayerGradsComplete>, caf::reacts_to<Peers>,
                     caf::reacts_to<Resume>, caf::replies_to<reset_atom, std::uint64_t>::with<ack_atom>,
                     caf::reacts_to<CheckpointRequest>>;

// The checkpointer is not a restartable pipeline role: it catches its own errors (a failed checkpoint
// is reported, not fatal) and takes no part in the reset barrier (its messages carry no epoch: a
// LayerUpdated names a tile version, which is the same information in every epoch).
using checkpointer_actor =
    caf::typed_actor<caf::reacts_to<CheckpointNow>, caf::reacts_to<LayerUpdated>, caf::reacts_to<Peers>>;

// The node's run controller (run_controller.cpp): the pipeline's reports, its own tick, the
// checkpointer's results and the supervisor's news.
using node_actor =
    caf::typed_actor<caf::reacts_to<LossReport>, caf::reacts_to<LayerUpdated>, caf::reacts_to<ComputeStepDone>,
                     caf::reacts_to<CollectorStepDone>, caf::reacts_to<OptimizerStepDone>, caf::reacts_to<tick_atom>,
                     caf::reacts_to<CheckpointDone>, caf::reacts_to<CheckpointFailed>, caf::reacts_to<PauseHeld>,
                     caf::reacts_to<CheckpointTaken>, caf::reacts_to<Peers>, caf::reacts_to<RestartStatus>,
                     caf::reacts_to<BudgetExhausted>, caf::reacts_to<RunFailed>>;

// The node's supervisor (supervisor.cpp): its own respawn timer, the controller's requests, and the
// optimizer's CheckpointTaken.
using supervisor_actor =
    caf::typed_actor<caf::reacts_to<respawn_atom, std::int32_t, std::int32_t>, caf::reacts_to<Progress>,
                     caf::reacts_to<StopAt>, caf::reacts_to<PauseRequest>, caf::reacts_to<wake_atom>,
                     caf::reacts_to<CheckpointRequest>, caf::reacts_to<CheckpointTaken>, caf::reacts_to<RestartControl>,
                     caf::reacts_to<WatchdogRestart>, caf::reacts_to<shutdown_atom>>;

}  // namespace mt::actors

// Local-only message types (pointers into this process).
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(mt::actors::Peers)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(mt::actors::MicroBatch)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(mt::actors::RestartControl)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(mt::actors::WatchdogRestart)
