#include "cluster/grad_reduce.hpp"

#include <cstring>
#include <memory>
#include <stdexcept>

#include "kernels/step_math.hpp"

namespace mt::cluster {

namespace {

void reduce_round_in_rank_order(World& world, GradTransport& transport, int owner, const RoundGradient& mine,
                                float* accum, std::size_t n, bool first, int threads, const std::string& what) {
  const int R = world.size(), me = world.rank();
  // The transport's waits are shown as the World's own (World::last_transfer: the monitor's "waits for").
  if (me != owner) {
    world.begin_wait(Channel::grads, owner, what, true);
    transport.send(owner, mine, n, what);
    world.end_wait(Channel::grads);
    return;
  }
  if (mine.host == nullptr && n > 0) throw std::logic_error("reduce_round: the owner's gradient has no host copy");
  // Every other rank's receive is posted at once; each is added in rank order as soon as it landed.
  const std::unique_ptr<GradTransport::Arrivals> arrivals = transport.receive(n, what);
  if (first) std::memset(accum, 0, n * sizeof(float));  // the collector's zeroed accumulator for micro-batch 0
  for (int r = 0; r < R; ++r) {
    const float* g = mine.host;
    if (r != me) {
      world.begin_wait(Channel::grads, r, what, false);
      g = arrivals->wait(r);
      world.end_wait(Channel::grads);
    }
    cpu::accumulate(accum, g, n, threads);
  }
}

}  // namespace

void reduce_round(World& world, GradTransport& transport, int owner, const RoundGradient& mine, float* accum,
                  std::size_t n, bool first, int threads, const std::string& what) {
  try {
    reduce_round_in_rank_order(world, transport, owner, mine, accum, n, first, threads, what);
  } catch (const GradTransportError& e) {  // a device transport's timeout or failure ends the run as MPI's does
    throw ClusterError(e.what());
  }
}

void share_stage(World& world, int owner, float* accum, std::size_t n, const std::string& what) {
  share_from_owner(world, Channel::grads, owner, accum, n * sizeof(float), what);
}

void share_from_owner(World& world, Channel ch, int owner, void* data, std::size_t bytes, const std::string& what) {
  if (world.rank() != owner) {
    world.recv(ch, owner, data, bytes, what);
    return;
  }
  for (int r = 0; r < world.size(); ++r)
    if (r != owner) world.send(ch, r, data, bytes, what);
}

}  // namespace mt::cluster
