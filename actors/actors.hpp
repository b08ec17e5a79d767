// Internal: the spawn functions of the pipeline actors (each defined in its own file) and small
// helpers they share. Includes CAF: only actor sources include it.
#pragma once
#include <chrono>
#include <cstdint>
#include <vector>

#include "actors/context.hpp"
#include "actors/messages.hpp"
#include "cluster/world.hpp"
#include "monitor/monitor.hpp"

namespace mt::actors {

// Each spawns a detached actor (its own thread: all of them block on copies or kernels) that waits
// for Peers and Resume before doing any work.
loader_actor spawn_loader(caf::actor_system& sys, Context* ctx, std::uint64_t epoch);
prefetcher_actor spawn_prefetcher(caf::actor_system& sys, Context* ctx, std::uint64_t epoch);
compute_actor spawn_compute(caf::actor_system& sys, Context* ctx, std::uint64_t epoch);
collector_actor spawn_collector(caf::actor_system& sys, Context* ctx, std::uint64_t epoch);
optimizer_actor spawn_optimizer(caf::actor_system& sys, Context* ctx, std::uint64_t epoch);
// The checkpointer (detached: HDF5 writes block). Not restarted by the node; it reports failures.
checkpointer_actor spawn_checkpointer(caf::actor_system& sys, Context* ctx);
// The node: its supervisor (event-based, on the scheduler; it only routes messages), which spawns the
// run controller and every other actor. Quits after every child is down; `result` is filled by then.
supervisor_actor spawn_node(caf::actor_system& sys, Context* ctx, EngineResult* result);
// The run controller (event-based), spawned by the supervisor; it writes `result` but for restarts.
node_actor spawn_run_controller(caf::actor_system& sys, Context* ctx, EngineResult* result,
                                supervisor_actor supervisor);

// An actor's uncaught exception becomes its exit reason (sec::runtime_error with the what() text), so
// the supervisor can log it and restart the actor.
inline caf::error exception_to_error(std::exception_ptr& x) {
  try {
    std::rethrow_exception(x);
  } catch (const cluster::ClusterError& e) {  // another rank did not answer: no restart brings it back
    return caf::make_error(caf::sec::request_timeout, std::string(e.what()));
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::runtime_error, std::string(e.what()));
  } catch (...) {
    return caf::make_error(caf::sec::runtime_error, std::string("unknown exception"));
  }
}

// The handles the supervisor sent in its last Peers message.
struct PeerHandles {
  loader_actor loader;
  prefetcher_actor prefetcher;
  compute_actor compute;
  collector_actor collector;
  optimizer_actor optimizer;
  node_actor node;              // the run controller
  supervisor_actor supervisor;  // the node's supervisor
  checkpointer_actor checkpointer;
  std::vector<compute_actor> computes;        // every device's, in device order
  std::vector<prefetcher_actor> prefetchers;  // every device's, in device order

  void set(const Peers& p) {
    computes.clear();
    prefetchers.clear();
    for (const auto& c : p.computes) computes.push_back(caf::actor_cast<compute_actor>(c));
    for (const auto& c : p.prefetchers) prefetchers.push_back(caf::actor_cast<prefetcher_actor>(c));
    checkpointer = caf::actor_cast<checkpointer_actor>(p.checkpointer);
    loader = caf::actor_cast<loader_actor>(p.loader);
    prefetcher = caf::actor_cast<prefetcher_actor>(p.prefetcher);
    compute = caf::actor_cast<compute_actor>(p.compute);
    collector = caf::actor_cast<collector_actor>(p.collector);
    optimizer = caf::actor_cast<optimizer_actor>(p.optimizer);
    node = caf::actor_cast<node_actor>(p.node);
    supervisor = caf::actor_cast<supervisor_actor>(p.supervisor);
  }
};

// Publishes, for the monitor, that `self` is in `handler` (a message name) until the returned scope
// ends, with the depth of its mailbox (readable only by the actor itself). Lock-free: relaxed atomics.
template <class Self>
monitor::HandlerScope probe_handler(Self* self, monitor::ActorId who, const char* handler) {
  return monitor::HandlerScope(self->state.ctx->monitor->board().probe(who, self->state.ctx->device), handler,
                               self->mailbox().size());
}

// The monitor's name for a pipeline role.
inline monitor::ActorId actor_id(Role r) { return static_cast<monitor::ActorId>(static_cast<int>(r)); }

using Clock = std::chrono::steady_clock;
inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace mt::actors
