// The prefetcher: walks the schedule ahead of compute and streams each op's stages into free weight
// slots (host tile -> device arena over the backend's link; a backend that shares host memory maps
// the tile into the slot instead, no copy), exactly in the order compute will use them, up to
// prefetch_depth + 1 ops in flight and never more than K weight slots (and, with boundaries on the
// host, K activation slots). A load waits for a free slot and for the stage's tile to reach the
// version the op needs (= its step: the optimizer publishes version s + 1 after step s's update), so
// the next step's forward streams layer i as soon as it is updated. Owns the weight slots' states
// (in the DeviceArena).
//
// A slot compute has freed keeps its contents until it is refilled ("resident"): when a later load
// needs the same stage at the same version (the backward of the last layers of the forward, right
// after the head, and the first layers of the next micro-batch after the backward), it is handed over
// again without a copy. The slot refilled is the resident one needed again farthest ahead. A load of
// a stage and version that a slot in flight holds (layer-major: a layer's backward over every
// micro-batch) shares that slot; it is freed when its last holder frees it.
//
// Boundaries on the host: a layer backward's second load is its input boundary, streamed from the
// host store into a free activation slot once the forward's copy of it has landed there (its stamp
// names the micro-batch); activation slots are used once, never kept resident.
#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "actors/actors.hpp"

namespace mt::actors {
namespace {

struct prefetcher_state {
  Context* ctx = nullptr;
  std::uint64_t epoch = 0;
  bool running = false;
  PeerHandles peers;
  Pos pos;       // the next op to load for
  int load = 0;  // its next load
  std::int64_t end_step = 0;
  struct Held {
    Pos pos;  // the op it was filled for (or, once that op freed it, the earliest sharer)
    std::int64_t stage = 0;
    std::uint64_t version = 0;
    bool filling = false;                      // the copy is queued or running
    std::vector<std::pair<Pos, int>> sharers;  // later loads (op, load) of the same stage and version
  };
  struct Resident {
    std::int64_t stage = 0;
    std::uint64_t version = 0;
  };
  std::map<int, Held> in_flight;      // weight slot -> what compute holds (until it frees it)
  std::map<int, Resident> resident;   // free weight slots whose contents are still valid
  std::map<int, Held> act_in_flight;  // activation slot -> the boundary compute holds
  static constexpr const char* name = "prefetcher";
};

// The resident slot to refill: the one whose contents the schedule needs again farthest ahead (or
// never, within two micro-batches): the schedule is exact, so this is Belady's choice. -1 if none.
int victim(const prefetcher_state& st, Context* ctx) {
  if (st.resident.empty()) return -1;
  std::map<int, std::int64_t> next_use;  // slot -> loads until its stage is needed again
  Pos p = st.pos;
  int load = st.load;
  const std::int64_t horizon = 2 * ctx->sched.ops_per_micro_batch();
  std::int64_t distance = 0;
  for (std::int64_t i = 0; i < horizon && next_use.size() < st.resident.size(); ++i) {
    const Op& op = ctx->sched.op(p);
    for (int li = load; li < op.loads; ++li, ++distance)
      for (const auto& kv : st.resident)
        if (next_use.count(kv.first) == 0 && op.load_kind[li] == LoadKind::weights &&
            kv.second.stage == op.load_stage[li] && kv.second.version == static_cast<std::uint64_t>(p.step))
          next_use[kv.first] = distance;
    load = 0;
    p = ctx->sched.next(p);
  }
  int best = -1;
  std::int64_t best_use = -1;
  for (const auto& kv : st.resident) {
    auto it = next_use.find(kv.first);
    const std::int64_t use = it == next_use.end() ? std::numeric_limits<std::int64_t>::max() : it->second;
    if (use > best_use) {
      best_use = use;
      best = kv.first;
    }
  }
  return best;
}

using self_ptr = prefetcher_actor::stateful_pointer<prefetcher_state>;

// Queues a copy into `dst` whose completion comes back as CopyDone for (pos, load, slot).
void submit_load(self_ptr self, const void* src, void* dst, std::size_t bytes, int slot) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  const auto submitted = Clock::now();
  const CopyDone done{st.epoch, st.pos, st.load, slot};
  prefetcher_actor me = caf::actor_cast<prefetcher_actor>(self);
  ctx->backend->copy_async(LinkDirection::host_to_device, src, dst, bytes, [ctx, me, done, submitted] {
    const auto now = Clock::now();
    ctx->intervals.add(Role::prefetcher, done.pos.step, std::max(submitted, ctx->h2d_last_end), now);
    ctx->h2d_last_end = now;  // only the host-to-device completions write it, in FIFO order
    caf::anon_send(me, done);
  });
}

// Boundaries on the host: streams the current load (a layer's input boundary) into a free activation
// slot. False when it has to wait: for the forward's copy to the host (BoundarySaved wakes us) or for
// a free activation slot (SlotFree).
bool load_boundary(self_ptr self, const Op& op) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  const std::int64_t b = op.load_stage[st.load];
  const int set = ctx->sched.activation_set(st.pos.micro_batch);
  const std::uint64_t need = ctx->boundary_stamp(st.pos.step, st.pos.micro_batch);
  const std::uint64_t have = ctx->host_acts->stamp(set, b);
  if (have < need) return false;
  if (have > need)
    throw std::logic_error("prefetcher: boundary " + std::to_string(b) + " of micro-batch " +
                           std::to_string(st.pos.micro_batch) + " step " + std::to_string(st.pos.step) +
                           " was overwritten before its backward");
  int slot = -1;
  for (int a = 0; a < static_cast<int>(ctx->act_slots.size()) && slot < 0; ++a)
    if (st.act_in_flight.count(a) == 0) slot = a;
  if (slot < 0) return false;
  fault_point(ctx->fault, Role::prefetcher, st.pos.step, ctx->work_micro_batch(st.pos.micro_batch), op.stage,
              Phase::prefetch_boundary);
  submit_load(self, ctx->host_acts->data(set, b), ctx->act_slots[static_cast<std::size_t>(slot)],
              ctx->plan.hidden_floats * sizeof(float), slot);
  st.act_in_flight[slot] = prefetcher_state::Held{st.pos, b, need, true, {}};
  ++st.load;
  return true;
}

void pump(self_ptr self) {
  auto& st = self->state;
  Context* ctx = st.ctx;
  const int depth = ctx->serial ? 0 : ctx->plan.prefetch_depth;
  while (st.running && st.pos.step < st.end_step) {
    const Op& op = ctx->sched.op(st.pos);
    if (st.load >= op.loads) {
      st.pos = ctx->sched.next(st.pos);
      st.load = 0;
      continue;
    }
    std::set<Pos> ops_in_flight;
    for (const auto& kv : st.in_flight) {
      ops_in_flight.insert(kv.second.pos);
      for (const auto& sh : kv.second.sharers) ops_in_flight.insert(sh.first);
    }
    for (const auto& kv : st.act_in_flight) ops_in_flight.insert(kv.second.pos);
    if (ops_in_flight.count(st.pos) == 0 && static_cast<int>(ops_in_flight.size()) >= depth + 1) return;
    if (op.load_kind[st.load] == LoadKind::boundary) {
      if (!load_boundary(self, op)) return;
      continue;
    }
    const std::int64_t stage = op.load_stage[st.load];
    HostTile& tile = ctx->host->tile(stage);
    const std::uint64_t need = static_cast<std::uint64_t>(st.pos.step);
    const std::uint64_t have = tile.version();
    if (have < need) return;  // LayerUpdated will wake us
    if (have > need)
      throw std::logic_error("prefetcher: stage " + std::to_string(stage) + " is at version " + std::to_string(have) +
                             " but step " + std::to_string(st.pos.step) + " needs " + std::to_string(need));
    const std::size_t bytes = tile.stream_bytes();
    fault_point(ctx->fault, Role::prefetcher, st.pos.step, ctx->work_micro_batch(st.pos.micro_batch), stage,
                Phase::prefetch);
    ctx->monitor->board()
        .probe(monitor::ActorId::prefetcher, ctx->device)
        .unit(st.pos.step, ctx->work_micro_batch(st.pos.micro_batch), stage, "prefetch");
    // A backend that shares host memory reads the tile itself: the slot only bounds the ops in flight.
    if (ctx->backend->shares_host_memory()) {
      int slot = -1;
      for (int k = 0; k < ctx->arena->weight_slot_count() && slot < 0; ++k)
        if (st.in_flight.count(k) == 0) slot = k;
      if (slot < 0) return;  // SlotFree will wake us
      ctx->arena->map_slot(slot, stage, have, bytes, tile.stream_source());
      st.in_flight[slot] = prefetcher_state::Held{st.pos, stage, have, false, {}};
      self->send(st.peers.compute, WeightsReady{st.epoch, st.pos, st.load, stage, slot, have});
      ++st.load;
      continue;
    }
    // A slot compute still holds (or that is still filling) with exactly this stage and version: share
    // it, no transfer (layer-major: each layer's backward over every micro-batch back to back).
    int shared = -1;
    for (const auto& kv : st.in_flight)
      if (kv.second.stage == stage && kv.second.version == have) shared = kv.first;
    if (shared >= 0) {
      prefetcher_state::Held& h = st.in_flight[shared];
      h.sharers.emplace_back(st.pos, st.load);
      ctx->slot_reuses.fetch_add(1);
      if (!h.filling) self->send(st.peers.compute, WeightsReady{st.epoch, st.pos, st.load, stage, shared, have});
      ++st.load;
      continue;
    }
    // A resident copy of exactly this stage and version: hand it over again, no transfer.
    int hit = -1;
    for (const auto& kv : st.resident)
      if (kv.second.stage == stage && kv.second.version == have) hit = kv.first;
    if (hit >= 0) {
      st.resident.erase(hit);
      ctx->arena->begin_fill_slot(hit, stage, have, bytes);
      ctx->arena->mark_ready(hit);
      ctx->slot_reuses.fetch_add(1);
      st.in_flight[hit] = prefetcher_state::Held{st.pos, stage, have, false, {}};
      self->send(st.peers.compute, WeightsReady{st.epoch, st.pos, st.load, stage, hit, have});
      ++st.load;
      continue;
    }
    // A never-used free slot, else the least recently freed resident one.
    int slot = -1;
    for (int k = 0; k < ctx->arena->weight_slot_count() && slot < 0; ++k)
      if (st.in_flight.count(k) == 0 && st.resident.count(k) == 0) slot = k;
    if (slot < 0) slot = victim(st, ctx);
    if (slot < 0) return;  // SlotFree will wake us
    st.resident.erase(slot);
    ctx->arena->begin_fill_slot(slot, stage, have, bytes);
    // Queue the copy and go on: the link always has the next transfer queued behind this one. The
    // copy engine's worker reports completion with a CopyDone message.
    submit_load(self, tile.stream_source(), ctx->arena->weight_slot(slot), bytes, slot);
    st.in_flight[slot] = prefetcher_state::Held{st.pos, stage, have, true, {}};
    ++st.load;
  }
}

bool is_boundary_load(Context* ctx, const Pos& pos, int load) {
  return ctx->sched.op(pos).load_kind[load] == LoadKind::boundary;
}

prefetcher_actor::behavior_type prefetcher_fn(self_ptr self, Context* ctx, std::uint64_t epoch) {
  self->state.ctx = ctx;
  self->state.epoch = epoch;
  self->set_exception_handler(exception_to_error);
  return {
      [=](const SlotFree& m) {
        const auto probe = probe_handler(self, monitor::ActorId::prefetcher, "SlotFree");
        auto& st = self->state;
        if (m.epoch != st.epoch) return;
        if (is_boundary_load(ctx, m.pos, m.load)) {
          st.act_in_flight.erase(m.slot);
          pump(self);
          return;
        }
        auto it = st.in_flight.find(m.slot);
        if (it != st.in_flight.end()) {
          auto& sharers = it->second.sharers;
          const std::pair<Pos, int> freed{m.pos, m.load};
          if (!sharers.empty()) {  // other ops still hold the slot: only this holder goes
            if (it->second.pos == m.pos) {
              it->second.pos = sharers.front().first;
              sharers.erase(sharers.begin());
            } else {
              sharers.erase(std::remove(sharers.begin(), sharers.end(), freed), sharers.end());
            }
            pump(self);
            return;
          }
          if (!ctx->backend->shares_host_memory())  // a mapped slot holds nothing of its own
            st.resident[m.slot] = prefetcher_state::Resident{it->second.stage, it->second.version};
          st.in_flight.erase(it);
        }
        ctx->arena->release_slot(m.slot);
        pump(self);
      },
      [=](const CopyDone& m) {
        const auto probe = probe_handler(self, monitor::ActorId::prefetcher, "CopyDone");
        auto& st = self->state;
        if (m.epoch != st.epoch) return;
        const bool boundary = is_boundary_load(ctx, m.pos, m.load);
        auto& held = boundary ? st.act_in_flight : st.in_flight;
        auto it = held.find(m.slot);
        if (it == held.end() || !it->second.filling) return;
        it->second.filling = false;
        if (!boundary) ctx->arena->mark_ready(m.slot);
        self->send(st.peers.compute,
                   WeightsReady{st.epoch, m.pos, m.load, it->second.stage, m.slot, it->second.version});
        for (const auto& sh : it->second.sharers)  // later loads of the same stage waited for this copy
          self->send(st.peers.compute,
                     WeightsReady{st.epoch, sh.first, sh.second, it->second.stage, m.slot, it->second.version});
      },
      [=](const LayerUpdated& m) {
        const auto probe = probe_handler(self, monitor::ActorId::prefetcher, "LayerUpdated");
        if (m.epoch != self->state.epoch) return;
        pump(self);
      },
      // A wake-up only (the stamps in the host store are the state); see compute's handler.
      [=](const BoundarySaved&) {
        const auto probe = probe_handler(self, monitor::ActorId::prefetcher, "BoundarySaved");
        pump(self);
      },
      [=](const StopAt& m) {
        const auto probe = probe_handler(self, monitor::ActorId::prefetcher, "StopAt");
        self->state.end_step = std::min(self->state.end_step, m.end_step);
      },
      [=](const Peers& p) {
        const auto probe = probe_handler(self, monitor::ActorId::prefetcher, "Peers");
        self->state.peers.set(p);
      },
      [=](const Resume& r) {
        const auto probe = probe_handler(self, monitor::ActorId::prefetcher, "Resume");
        auto& st = self->state;
        st.epoch = r.epoch;
        // Every slot is free again: compute dropped what it held at the reset.
        for (int s = 0; s < ctx->arena->weight_slot_count(); ++s) ctx->arena->release_slot(s);
        st.in_flight.clear();
        st.resident.clear();
        st.act_in_flight.clear();
        st.pos = r.pos;
        st.load = 0;
        st.end_step = r.end_step;
        st.running = true;
        pump(self);
      },
      [=](reset_atom, std::uint64_t e) {
        const auto probe = probe_handler(self, monitor::ActorId::prefetcher, "reset");
        self->state.epoch = e;
        self->state.running = false;
        // No copy of the old epoch may land in a slot after the barrier.
        ctx->backend->wait_link_idle();
        return ack_atom::value;
      },
  };
}

}  // namespace

prefetcher_actor spawn_prefetcher(caf::actor_system& sys, Context* ctx, std::uint64_t epoch) {
  return sys.spawn<caf::detached>(prefetcher_fn, ctx, epoch);
}

}  // namespace mt::actors
