// The gradient transport over the World (MPI) from host memory (device/grad_transport.hpp): the CPU
// backend's, and a GPU's with cluster.gpu_transport=mpi (each rank copies its gradient to the host
// first). Non-blocking receives of every other rank into a host buffer per rank, each waited for with
// the World's timeout; the sends are the World's on the gradients channel.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "cluster/world.hpp"
#include "device/grad_transport.hpp"
#include "kernels/tile.hpp"

namespace mt::cluster {

class HostGradTransport final : public GradTransport {
 public:
  // max_floats: the largest stage's gradient (each receive buffer's size, made on first use).
  HostGradTransport(World& world, std::size_t max_floats) : world_(world), max_floats_(max_floats) {}

  const char* name() const override { return "mpi"; }
  bool sends_from_device() const override { return false; }
  void send(int owner, const RoundGradient& mine, std::size_t n, const std::string& what) override;
  std::unique_ptr<Arrivals> receive(std::size_t n, const std::string& what) override;

 private:
  World& world_;
  std::size_t max_floats_;
  std::vector<AlignedFloats> buffers_;  // per rank (this rank's unused)
};

}  // namespace mt::cluster
