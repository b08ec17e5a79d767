// The checkpointer: writes due checkpoints from the host tiles in the background (actors/README.md,
// "Checkpoints and resume").
//
// Flow for a checkpoint of tile version v (= v steps done):
//   optimizer: CheckpointNow(v) (after registering v in the version gate), then, for each stage, its
//   update to version v followed by LayerUpdated(stage, v) -> the checkpointer writes that stage's
//   params, exp_avg and exp_avg_sq straight from the tile (CheckpointWriter::write_stage takes the
//   pointers; no staging copy, so no second copy of the model; stages in stage order, see write_due)
//   and marks it written in the gate, which lets the optimizer update the stage again at step v.
//   When every stage is written: finalize with
//   the run state (run_state.hpp) -> atomic publish, `latest`, retention -> CheckpointDone to the node.
//   By default (CheckpointJob::write_after_step) the writes start when the LayerUpdated of the step's
//   last update arrives (every stage at v), in stage order, so they run beside compute's next step
//   instead of competing with the optimizer's burst of updates, which is on the critical path (the
//   next forward waits for each layer's update); measured on the demo model: 0-6% of a step against
//   4-12% when each stage is written at once (tools/bench/run checkpoint).
// Why a version gate and not a staging copy: a stage's tile holds version v for about one whole step
// (from its update in step v-1 to its update in step v), so a disk that writes one step's worth of
// p/m/v per step never stalls training, and memory stays at the tiles alone. The optimizer's wait at
// the gate is measured (StepRecord::checkpoint_wait_s, bench metric checkpoint_stall).
//
// The host state sharded (cluster.shard_state), two ways (CheckpointJob::owners_write, from
// cluster.checkpoint_writers): each rank writes the stages it owns into one shared temporary directory and
// rank 0 publishes the checkpoint once every rank's part is durable (owners: below, "parts"), or rank 0
// writes every stage, the owners sending it their state (rank0: "the state sent to rank 0").
// Detached (its own thread): HDF5 writes and fsyncs block. Any failure (disk full, I/O error) aborts
// that checkpoint only: the temporary directory is removed, the gate released, CheckpointFailed goes to
// the node (progress line / events log), the previous checkpoints stay intact, training continues.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <thread>

#include "actors/actors.hpp"
#include "actors/run_state.hpp"
#include "cluster/grad_reduce.hpp"
#include "plan/engine_plan.hpp"
#include "storage/checkpoint/checkpoint_dir.hpp"
#include "storage/checkpoint/checkpoint_writer.hpp"
#include "storage/hf/file_util.hpp"

namespace mt::actors {
namespace {

struct PendingCheckpoint {
  std::unique_ptr<ckpt::CheckpointWriter> writer;  // null on a rank that only sends its part
  std::uint64_t part_bytes = 0;                    // such a rank: the bytes it sent
  // The data loader's cursor before the checkpoint's first batch (CheckpointGate::data_cursor): the
  // loader keeps a bounded history, and with copy on write the last stage may be written steps later.
  nlohmann::json data_cursor;
  std::vector<char> written;
  std::int64_t remaining = 0;
  Clock::time_point t0;
  double cpu0 = 0.0;  // the thread's CPU clock at CheckpointNow
};

struct checkpointer_state {
  Context* ctx = nullptr;
  PeerHandles peers;
  std::map<std::int64_t, PendingCheckpoint> pending;  // by tile version
  std::int64_t last_done = -1;
  CheckpointDone last_done_msg;
  bool niced = false;
  // Owners write (CheckpointJob::owners_write), a rank > 0: the checkpoints whose part (or failure) it
  // has told rank 0 of; exactly one message per checkpoint, whatever happens.
  std::set<std::int64_t> parts_reported;
  // The host state sharded, rank 0: an owner's masters (a bf16 replica holds none) and moments of one stage.
  AlignedFloats peer_master, peer_m, peer_v;
  static constexpr const char* name = "checkpointer";
};

using self_ptr = checkpointer_actor::stateful_pointer<checkpointer_state>;

// This thread's CPU time (a detached actor: one thread), so CheckpointDone can say what a checkpoint
// took from training's cores: its checksums, copies and system calls, not its waits for the disk.
double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// A stage written (or sent) from its tile must hold version v: the version gate keeps the optimizer off it.
void require_version(const HostTile& t, std::int64_t stage, std::int64_t v) {
  if (t.version() != static_cast<std::uint64_t>(v))
    throw std::logic_error("stage " + std::to_string(stage) + " is at version " + std::to_string(t.version()) +
                           ", not " + std::to_string(v) + " (version gate broken)");
}

// The host state sharded (cluster.shard_state; Context::shard_world): rank 0 writes every checkpoint,
// every stage in stage order as always; a stage another rank owns is written from what its owner's
// checkpointer sends on the checkpoint channel (m and v, and with bf16, whose replicas hold no masters,
// the masters first) beside rank 0's replica of its masters (fp32). An owner (a rank > 0: state_part)
// writes nothing: for each of its stages at version v, in stage order, it sends them to rank 0 (from
// its tile, or the copy its optimizer set aside) and marks the stage written in its own gate, so its
// optimizer waits for that send as it would for a write. Both walk the stages in stage order, so the
// transfers pair up; rank 0 holds one stage's state at a time beyond its tiles.
int owner_of(const Context* ctx, std::int64_t stage) { return cluster::stage_owner(stage, ctx->shard_world->size()); }

std::string part_what(std::int64_t v, std::int64_t stage) {
  return "the state of stage " + std::to_string(stage) + " for the checkpoint of step " + std::to_string(v);
}

// The owner sends the stage's masters too when rank 0's replica holds none: with bf16 (a compute
// copy), on the owner and on rank 0 alike.
bool sends_masters(const Context* ctx, std::int64_t stage) { return ctx->host->tile(stage).has_compute_copy(); }

// --- Owners write (CheckpointJob::owners_write) ---------------------------------------------------------
// Every rank writes the stages it owns (masters and moments, through the same lease as one rank) with a
// CheckpointWriter of its own into one temporary directory every rank agrees on, its files named apart
// ("shard-rankR-NNNNN.h5"). An owner tells rank 0 of each stage it has written ({"stage": s}) and, when
// its last one is written, closes and fsyncs its shards, writes their description (CheckpointWriter::
// close_part) beside them as part-rankR.json and tells rank 0 ({"part": that file}), or why it failed
// ({"error": ...}). Rank 0, its own stages written, reads every rank's notes in rank order up to its last
// one, adds the parts to its manifest and publishes (a failure anywhere: the whole directory goes, nothing
// is published). So each wait is for one stage's write (cluster.collective_timeout_s bounds a stage, not
// a rank's whole part), the notes are a few bytes (sent at once, whatever rank 0 is doing), and each
// owner ends every checkpoint with exactly one last note, so the channel stays paired.
bool owners_write(const Context* ctx) { return ctx->shard_world != nullptr && ctx->job->checkpoint.owners_write; }

// This rank sends its stages' state to rank 0, which writes them (rank0 writes).
bool sends_state(const Context* ctx) { return ctx->state_part() && !owners_write(ctx); }

std::string shared_temp_name(const Context* ctx, std::int64_t v) {
  // ".tmp-<step dir>-<pid>-<n>": rank 0's pid, so the stale-directory sweep keeps it while rank 0 runs.
  return std::string(ckpt::kTempPrefix) + ckpt::step_dir_name(v) + "-" + ctx->job->checkpoint.shared_tag + "-ranks";
}

std::string part_message_what(std::int64_t v, int rank) {
  return "rank " + std::to_string(rank) + "'s part of the checkpoint of step " + std::to_string(v);
}

void note_to_rank0(self_ptr self, std::int64_t v, const nlohmann::json& note) {
  cluster::World& world = *self->state.ctx->shard_world;
  world.send_text(cluster::Channel::checkpoint, 0, note.dump(), part_message_what(v, world.rank()));
}

// An owner (rank > 0): the last note of checkpoint v, its part or why it has none (once).
void report_part(self_ptr self, std::int64_t v, const nlohmann::json& note) {
  if (self->state.parts_reported.insert(v).second) note_to_rank0(self, v, note);
}

// Rank 0: every other rank's last note about checkpoint v, in rank order (the stage notes before it are
// each rank's progress: each keeps the wait within the timeout).
std::vector<nlohmann::json> receive_part_messages(self_ptr self, std::int64_t v) {
  cluster::World& world = *self->state.ctx->shard_world;
  std::vector<nlohmann::json> last;
  for (int r = 1; r < world.size(); ++r)
    for (;;) {
      const std::string text = world.recv_text(cluster::Channel::checkpoint, r, part_message_what(v, r));
      nlohmann::json note = nlohmann::json::parse(text, nullptr, false);
      if (note.is_discarded() || !note.is_object()) note = nlohmann::json{{"error", "its note is not a JSON object"}};
      if (note.contains("stage")) continue;
      last.push_back(std::move(note));
      break;
    }
  return last;
}

// Rank 0, its own stages written: every part into its manifest; throws naming the first rank that failed.
void add_parts(self_ptr self, std::int64_t v, ckpt::CheckpointWriter& writer) {
  const std::vector<nlohmann::json> notes = receive_part_messages(self, v);
  for (std::size_t i = 0; i < notes.size(); ++i)
    if (!notes[i].contains("part"))
      throw ckpt::CheckpointError("rank " + std::to_string(i + 1) +
                                  " could not write its part: " + notes[i].value("error", notes[i].dump()));
  for (const auto& note : notes) {
    const std::filesystem::path file = writer.temp_dir() / note["part"].get<std::string>();
    writer.add_part(hf::read_json_file(file));
    std::filesystem::remove(file);  // described in the manifest now
  }
}

// --- The state sent to rank 0 (rank0 writes) ---------------------------------------------------------------
// Rank 0: the owner's part of `stage` (masters with bf16, m and v) into the receive buffers.
void receive_part(self_ptr self, std::int64_t v, std::int64_t stage) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  if (!st.peer_m) {
    st.peer_m = make_aligned_floats(ctx->host->largest_stage_floats());
    st.peer_v = make_aligned_floats(ctx->host->largest_stage_floats());
  }
  if (!st.peer_master && sends_masters(ctx, stage))  // bf16 only: an fp32 replica holds its masters
    st.peer_master = make_aligned_floats(ctx->host->largest_stage_floats());
  const std::size_t bytes = ctx->host->tile(stage).region_bytes();
  const std::string what = part_what(v, stage);
  const int owner = owner_of(ctx, stage);
  if (sends_masters(ctx, stage))
    ctx->shard_world->recv(cluster::Channel::checkpoint, owner, st.peer_master.get(), bytes, what);
  ctx->shard_world->recv(cluster::Channel::checkpoint, owner, st.peer_m.get(), bytes, what);
  ctx->shard_world->recv(cluster::Channel::checkpoint, owner, st.peer_v.get(), bytes, what);
}

// Rank 0, a checkpoint given up (disk full): the owners still send their part of every stage not yet
// written; take them (and drop them) so the channel stays paired. Their tiles reach v without rank 0.
void drain_parts(self_ptr self, std::int64_t v, PendingCheckpoint& p) {
  Context* ctx = self->state.ctx;
  if (ctx->shard_world == nullptr || ctx->state_part()) return;
  for (std::int64_t s = 0; s < ctx->stages(); ++s)
    if (!p.written[static_cast<std::size_t>(s)] && !ctx->host->owns(s)) {
      receive_part(self, v, s);
      p.written[static_cast<std::size_t>(s)] = 1;
    }
}

// `parts_taken`: rank 0 (owners write) already has every rank's message about v.
void fail(self_ptr self, std::int64_t v, const std::string& why, bool parts_taken = false) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  ctx->gate.close(v);  // the optimizer goes on (also while the owners' parts are taken)
  auto it = st.pending.find(v);
  if (it != st.pending.end()) {
    if (it->second.writer) it->second.writer->abort();
    drain_parts(self, v, it->second);
    st.pending.erase(it);
  }
  if (owners_write(ctx) && ctx->state_part()) {
    report_part(self, v, nlohmann::json{{"error", why}});
  } else if (owners_write(ctx)) {
    if (!parts_taken) receive_part_messages(self, v);  // the owners write on until their message: wait for it
    std::error_code ec;                                // then clear up what they wrote
    std::filesystem::remove_all(std::filesystem::path(ctx->job->checkpoint.root) / shared_temp_name(ctx, v), ec);
  }
  self->send(st.peers.node, CheckpointFailed{v, why});
}

// An owner's part of checkpoint v is sent (rank 0 publishes the checkpoint): done here.
void finish_part(self_ptr self, std::int64_t v) {
  auto& st = self->state;
  auto it = st.pending.find(v);
  CheckpointDone done{v, "", seconds_between(it->second.t0, Clock::now()), it->second.part_bytes,
                      thread_cpu_seconds() - it->second.cpu0};
  st.pending.erase(it);
  st.ctx->gate.close(v);
  st.last_done = v;
  st.last_done_msg = done;
  self->send(st.peers.node, done);
}

// An owner (rank > 0): its stage's moments at version v to rank 0. Its failures end the run (rank 0
// would otherwise wait for the moments): a ClusterError, or a broken gate.
void send_part_stage(self_ptr self, std::int64_t v, std::int64_t stage, PendingCheckpoint& p) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  const std::size_t bytes = ctx->host->tile(stage).region_bytes();
  const std::string what = part_what(v, stage);
  auto send = [&](const float* master, const float* m, const float* vv) {
    for (const float* state : {sends_masters(ctx, stage) ? master : nullptr, m, vv})
      if (state != nullptr) {
        ctx->shard_world->send(cluster::Channel::checkpoint, 0, state, bytes, what);
        p.part_bytes += bytes;
      }
  };
  if (const StageSnapshot* copy = ctx->gate.begin_write(v, stage)) {
    send(copy->master.get(), copy->m.get(), copy->v.get());
  } else {
    HostTile& t = ctx->host->tile(stage);
    require_version(t, stage, v);
    // Through the store, as rank 0 writes its own stages: the tile's regions, or one stage of the
    // owner's store (compressed, or read back from its files), beside the optimizer's read-ahead.
    const StateLease state(*ctx->host, stage, MomentLease::Use::read);
    send(state.master(), state.m(), state.v());
  }
  p.written[static_cast<std::size_t>(stage)] = 1;
  ctx->gate.mark_written(v, stage);
  ctx->monitor->board().probe(monitor::ActorId::checkpointer).unit(v, -1, stage, "checkpoint send");
  if (--p.remaining > 0) return;
  finish_part(self, v);
}

// Every stage of checkpoint v this rank writes is written: publish it (rank 0; with owners writing, once
// every rank's part is in), or hand this rank's part to rank 0 (an owner).
void complete(self_ptr self, std::int64_t v) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  PendingCheckpoint& p = st.pending.at(v);
  bool parts_taken = false;
  try {
    if (owners_write(ctx) && ctx->state_part()) {  // an owner's stages are durable: hand them to rank 0
      const std::string name = "part-rank" + std::to_string(ctx->shard_world->rank()) + ".json";
      hf::write_text_atomically(p.writer->temp_dir() / name, p.writer->close_part().dump());
      report_part(self, v, nlohmann::json{{"part", name}});
      p.part_bytes = p.writer->bytes_written();
      finish_part(self, v);
      return;
    }
    if (owners_write(ctx)) {
      parts_taken = true;  // taken even when one of them is a failure (add_parts throws)
      add_parts(self, v, *p.writer);
    }
    const nlohmann::json run = make_run_state(*ctx->cfg, p.data_cursor, v, ctx->micro_batches(), *ctx->host,
                                              evaluations_json(*ctx->evaluations));
    const std::uint64_t bytes = p.writer->bytes_written();
    const auto dir = p.writer->finalize(run);
    CheckpointDone done{v, dir.string(), seconds_between(p.t0, Clock::now()), bytes, thread_cpu_seconds() - p.cpu0};
    st.pending.erase(v);
    ctx->gate.close(v);
    st.last_done = v;
    st.last_done_msg = done;
    self->send(st.peers.node, done);
  } catch (const cluster::ClusterError&) {
    throw;  // a rank that does not answer ends the run (the supervisor's rule), not just this checkpoint
  } catch (const std::exception& e) {
    fail(self, v, e.what(), parts_taken);
  }
}

void write_stage(self_ptr self, std::int64_t v, std::int64_t stage) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  auto it = st.pending.find(v);
  if (it == st.pending.end() || it->second.written[static_cast<std::size_t>(stage)]) return;
  PendingCheckpoint& p = it->second;
  const CheckpointJob& cj = ctx->job->checkpoint;
  if (sends_state(ctx)) {
    send_part_stage(self, v, stage, p);
    return;
  }
  try {
    if (cj.stall_step == v && cj.stall_stage == stage && cj.stall_seconds > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(cj.stall_seconds));
    if (cj.fail_step == v && cj.fail_stage == stage)
      throw ckpt::CheckpointError("stage " + std::to_string(stage) + ": a failure injected by the test");
    // The optimizer needed the tile first and copied version v aside; else the tile itself (the optimizer
    // now waits for this stage's write). A copy here too would free the optimizer of that wait, but it
    // measured worse on 2 busy cores: the copy's CPU and memory traffic cost compute more than the wait.
    const bool own = ctx->host->owns(stage);
    if (!own) receive_part(self, v, stage);  // before anything can fail: the owner is sending them
    const float* peer_m = own ? nullptr : st.peer_m.get();
    const float* peer_v = own ? nullptr : st.peer_v.get();
    if (const StageSnapshot* copy = ctx->gate.begin_write(v, stage)) {
      p.writer->write_stage(
          stage, ckpt::StageState{copy->master.get(), own ? copy->m.get() : peer_m, own ? copy->v.get() : peer_v});
    } else if (!own && sends_masters(ctx, stage)) {  // a bf16 replica: everything came from the owner
      p.writer->write_stage(stage, ckpt::StageState{st.peer_master.get(), peer_m, peer_v});
    } else if (!own) {
      const HostTile& t = ctx->host->tile(stage);
      require_version(t, stage, v);
      p.writer->write_stage(stage, ckpt::StageState{t.params(), peer_m, peer_v});
    } else {
      HostTile& t = ctx->host->tile(stage);
      require_version(t, stage, v);
      // The moments (and masters) through the store: the tile's regions, or one staged stage read
      // from the tier (a reader beside the optimizer: its read-ahead stays with the optimizer).
      StateLease state(*ctx->host, stage, MomentLease::Use::read);
      p.writer->write_stage(stage, ckpt::StageState{state.master(), state.m(), state.v()});
    }
    p.written[static_cast<std::size_t>(stage)] = 1;
    ctx->gate.mark_written(v, stage);
    ctx->monitor->board().probe(monitor::ActorId::checkpointer).unit(v, -1, stage, "checkpoint write");
    if (owners_write(ctx) && ctx->state_part()) note_to_rank0(self, v, nlohmann::json{{"stage", stage}});
    if (--p.remaining > 0) return;
    complete(self, v);
  } catch (const cluster::ClusterError&) {
    throw;  // a rank that does not answer ends the run (the supervisor's rule), not just this checkpoint
  } catch (const std::exception& e) {
    fail(self, v, e.what());
  }
}

// Writes the stages of checkpoint v that are due, always in stage order, so the shard files' layout
// does not depend on the order of the updates or on when the checkpoint began: the same state gives
// the same bytes (a checkpoint taken while training equals one taken at a pause). By default
// (write_after_step) none is due before every stage is at v, the optimizer's burst of updates being
// over; then they are written while compute runs the next step. Otherwise each stage as soon as it
// and every stage before it are at v.
void write_due(self_ptr self, std::int64_t v) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  auto at_v = [&](std::int64_t s) {
    const std::uint64_t version = ctx->host->tile(s).version();
    // A bf16 replica (nothing of it is written: its owner sends it all) need not wait at v.
    if (!ctx->host->holds_masters(s)) return version >= static_cast<std::uint64_t>(v);
    return version == static_cast<std::uint64_t>(v) || ctx->gate.has_snapshot(v, s);
  };
  if (!st.pending.count(v)) return;
  if (ctx->job->checkpoint.write_after_step && !sends_state(ctx)) {  // an owner sends as soon as it can
    const std::vector<char>& written = st.pending.at(v).written;
    for (std::int64_t s = 0; s < ctx->stages(); ++s)  // (a stage another rank writes may be past v)
      if (!written[static_cast<std::size_t>(s)] && !at_v(s)) return;
  }
  for (std::int64_t s = 0; s < ctx->stages(); ++s) {
    auto it = st.pending.find(v);
    if (it == st.pending.end()) return;  // published, or failed
    if (it->second.written[static_cast<std::size_t>(s)]) continue;
    if (!at_v(s)) return;
    write_stage(self, v, s);
  }
}

// The checkpointer's thread yields the CPU to training: on a small machine (2 cores) its checksums,
// HDF5 copies and writeback calls otherwise take time from compute. Nice + 10 (relative to the process's
// own) leaves it the idle cycles and a small share; the version gate gives it a whole step per stage, so
// it still keeps up.
void lower_priority(self_ptr self) {
  if (self->state.niced) return;
  self->state.niced = true;
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int base = ::getpriority(PRIO_PROCESS, tid);
  if (base == -1 && errno != 0) return;
  const int low = std::min(base + 10, 19);
  ::setpriority(PRIO_PROCESS, tid, low);
  // While the optimizer waits for a stage this thread is writing, the write is on the critical path: back
  // to training's priority until the wait ends. Raising a priority again needs CAP_SYS_NICE or a
  // RLIMIT_NICE that allows it; without either the write stays low, and after one refusal no more tries.
  auto may_raise = std::make_shared<std::atomic<bool>>(true);
  self->state.ctx->gate.set_writer_urgency([tid, base, low, may_raise](bool urgent) {
    if (!may_raise->load()) return;
    if (::setpriority(PRIO_PROCESS, tid, urgent ? base : low) != 0 && urgent) may_raise->store(false);
  });
  // The gate outlives this actor (it is the run's): no call may reach this thread's id once it is gone.
  Context* ctx = self->state.ctx;
  self->attach_functor([ctx] { ctx->gate.set_writer_urgency({}); });
}

void begin(self_ptr self, std::int64_t v) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  lower_priority(self);
  if (v == st.last_done) {
    self->send(st.peers.node, st.last_done_msg);
    return;
  }
  if (st.pending.count(v)) return;
  PendingCheckpoint p;
  p.t0 = Clock::now();
  p.cpu0 = thread_cpu_seconds();
  p.written.assign(static_cast<std::size_t>(ctx->stages()), 0);
  p.remaining = ctx->stages();
  if (ctx->shard_world != nullptr && (ctx->state_part() || owners_write(ctx)))  // this rank's stages only
    for (std::int64_t s = 0; s < ctx->stages(); ++s)
      if (!ctx->host->owns(s)) {
        p.written[static_cast<std::size_t>(s)] = 1;
        --p.remaining;
        ctx->gate.mark_written(v, s);
      }
  if (sends_state(ctx)) {  // rank0 writes: an owner sends its stages to rank 0
    st.pending.emplace(v, std::move(p));
    if (st.pending.at(v).remaining == 0)
      finish_part(self, v);
    else
      write_due(self, v);
    return;
  }
  try {
    const CheckpointJob& cj = ctx->job->checkpoint;
    ckpt::CheckpointWriterOptions o;
    o.keep_last = cj.keep_last;
    // The run's plan (an evaluation pass's pipeline runs a reduced copy; the checkpoint records the run's).
    if (ctx->job->plan) o.plan = plan::plan_summary(*ctx->job->plan);
    if (!cj.hf_config_json.empty()) o.hf_config = nlohmann::json::parse(cj.hf_config_json);
    if (owners_write(ctx)) {  // one directory, every rank's files; rank 0 publishes
      o.temp_name = shared_temp_name(ctx, v);
      if (ctx->state_part()) {
        o.part = true;
        o.shard_prefix = "shard-rank" + std::to_string(ctx->shard_world->rank()) + "-";
      }
    }
    p.writer = std::make_unique<ckpt::CheckpointWriter>(cj.root, v, *ctx->model, o);
    p.data_cursor = ctx->gate.data_cursor(v);      // taken when the optimizer decided the checkpoint
    if (p.data_cursor.is_null() && ctx->run_data)  // decided elsewhere (the end of the run), or not kept
      p.data_cursor = ctx->run_data->cursor_before(static_cast<std::uint64_t>(v) *
                                                   static_cast<std::uint64_t>(ctx->micro_batches()));
  } catch (const std::exception& e) {
    fail(self, v, e.what());
    return;
  }
  st.pending.emplace(v, std::move(p));
  if (st.pending.at(v).remaining == 0) {  // owners write: a rank that owns no stage has only its message
    complete(self, v);
    return;
  }
  write_due(self, v);  // stages already at version v (the final checkpoint; after an optimizer restart)
}

checkpointer_actor::behavior_type checkpointer_fn(self_ptr self, Context* ctx) {
  self->state.ctx = ctx;
  self->set_exception_handler(exception_to_error);
  return {
      [=](const CheckpointNow& m) {
        const auto probe = probe_handler(self, monitor::ActorId::checkpointer, "CheckpointNow");
        begin(self, m.step);
      },
      [=](const LayerUpdated& m) {
        const auto probe = probe_handler(self, monitor::ActorId::checkpointer, "LayerUpdated");
        write_due(self, static_cast<std::int64_t>(m.version));
      },
      [=](const Peers& p) {
        const auto probe = probe_handler(self, monitor::ActorId::checkpointer, "Peers");
        self->state.peers.set(p);
      },
  };
}

}  // namespace

checkpointer_actor spawn_checkpointer(caf::actor_system& sys, Context* ctx) {
  return sys.spawn<caf::detached>(checkpointer_fn, ctx);
}

}  // namespace mt::actors
