// Several ranks (mpirun), one device each: how one round's gradient of a stage travels from every rank
// to the stage's owner. The owner then adds every rank's in rank order on the host (cluster/
// grad_reduce.hpp, reduce_round): that arithmetic is written once, over this seam, so each transport
// gives the same bits by construction. Two transports:
//   - over MPI from host memory (cluster/host_grad_transport.hpp): the CPU backend, and
//     cluster.gpu_transport=mpi on a GPU; every rank first copies its gradient to the host;
//   - over NCCL from device memory (cuda/nccl_rank_transport.hpp, builds with NCCL): a non-owner sends
//     straight from its staging slot (no copy to its host), the owner receives each rank's into device
//     scratch and copies it to its host receive buffer.
// A Backend makes its device transport (Backend::make_rank_transport); this header has no CUDA, NCCL or
// MPI in it, so both sides (device/ and cluster/) implement it.
//
// Calls come from one thread (the collector's), in the same order of (step, round, stage) on every rank.
// Every wait has the job's timeout (cluster.collective_timeout_s) and throws naming the rank waited for.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace mt {

// The 128 opaque bytes a device transport's communicator is made from (NCCL's ncclUniqueId): made on
// rank 0 (Backend::new_rank_link_id), given to every rank by cluster/bootstrap_id.hpp.
using RankLinkId = std::array<unsigned char, 128>;

// A transport's failure: a rank did not answer within the timeout, or the link itself failed (a device
// transport's communicator is then unusable). No restart of this rank's actors can mend it: reduce_round
// turns it into the World's ClusterError, which ends the run (and MPI_Abort the job).
class GradTransportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// This rank's gradient of the round.
struct RoundGradient {
  const float* device = nullptr;  // the staging slot, in the backend's device memory
  // Its copy in host memory: what a host transport sends, and what the owner adds as its own. Null on a
  // non-owner whose transport sends from the device (sends_from_device()).
  const float* host = nullptr;
};

class GradTransport {
 public:
  virtual ~GradTransport() = default;
  virtual const char* name() const = 0;  // "mpi", "nccl": said in the node's lines
  // True when a non-owner's send reads RoundGradient::device: it then needs no host copy.
  virtual bool sends_from_device() const = 0;

  // A non-owner's part: its `n` floats to `owner`; returns once they may be rewritten (the slot freed).
  virtual void send(int owner, const RoundGradient& mine, std::size_t n, const std::string& what) = 0;

  // The owner's part: every other rank's `n` floats of the round, all posted at once.
  class Arrivals {
   public:
    virtual ~Arrivals() = default;
    // Rank `rank`'s floats in host memory once they are all there (blocks, with the timeout); valid
    // until the next receive().
    virtual const float* wait(int rank) = 0;
  };
  virtual std::unique_ptr<Arrivals> receive(std::size_t n, const std::string& what) = 0;

  // Payload bytes this transport sent itself (a host transport's go through the World, which counts them
  // per channel: 0 there).
  virtual std::uint64_t bytes_sent() const { return 0; }
};

}  // namespace mt
