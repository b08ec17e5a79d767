#include "cluster/grad_reduce.hpp"

#include <cstring>
#include <memory>

#include "kernels/step_math.hpp"

namespace mt::cluster {

void reduce_round(World& world, int owner, const float* mine, float* accum, std::size_t n, bool first, int threads,
                  std::vector<AlignedFloats>& scratch, std::size_t scratch_floats, const std::string& what) {
  const int R = world.size(), me = world.rank();
  const std::size_t bytes = n * sizeof(float);
  if (me != owner) {
    world.send(Channel::grads, owner, mine, bytes, what);
    return;
  }
  // Every other rank's receive is posted at once; each is added in rank order as soon as it landed.
  scratch.resize(static_cast<std::size_t>(R));
  std::vector<std::unique_ptr<World::PendingRecv>> pending(static_cast<std::size_t>(R));
  for (int r = 0; r < R; ++r) {
    if (r == me) continue;
    AlignedFloats& buf = scratch[static_cast<std::size_t>(r)];
    if (!buf) buf = make_aligned_floats(scratch_floats);
    pending[static_cast<std::size_t>(r)] = world.start_recv(Channel::grads, r, buf.get(), bytes, what);
  }
  if (first) std::memset(accum, 0, bytes);  // the collector's zeroed accumulator for micro-batch 0
  for (int r = 0; r < R; ++r) {
    const float* g = mine;
    if (r != me) {
      pending[static_cast<std::size_t>(r)]->wait();
      g = scratch[static_cast<std::size_t>(r)].get();
    }
    cpu::accumulate(accum, g, n, threads);
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
