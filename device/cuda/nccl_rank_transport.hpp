// The gradients of a job's ranks moved GPU to GPU with NCCL (device/grad_transport.hpp; built under
// MEGATRAIN_HAVE_NCCL): one process per rank, each driving its own GPU, one communicator over the job
// (ncclCommInitRankConfig with rank 0's id, which cluster/bootstrap_id.hpp gave every rank). The CUDA
// backend makes it (Backend::make_rank_transport).
//
// A round (rank_transfer.hpp has the chunks and the order): a non-owner sends its gradient straight from
// its staging slot to the owner's GPU, chunk by chunk, and returns once the last chunk left (the slot is
// then freed); it copies nothing to its host. The owner receives every other rank's chunk in one group
// into device scratch (bounded: 64 MiB a peer, 256 MiB in all) and copies each to that rank's pinned host
// buffer; reduce_round then adds them on the host in rank order, the MPI transport's code, so the bits
// are the same. No NCCL reduction is used: ncclReduce would add in its ring's order.
//
// Streams: the transport's own stream on this rank's GPU; a send first waits for `writers_done` (the
// backend's event recorded at the end of every stage operation: the slot's writer), never for an event
// recorded on compute at call time, which would hold the send behind the layer computed meanwhile.
// Timeouts: the communicator is non-blocking, so every NCCL call and every wait is polled against
// cluster.collective_timeout_s and a stuck one ends the run, naming the rank waited for; a failure or a
// timeout marks the communicator broken (aborted, not finalised, in the destructor) and throws
// GradTransportError.
#pragma once
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "device/grad_transport.hpp"

namespace mt::cuda {

struct RankTransportOptions {
  int rank = 0, ranks = 0;
  int gpu = 0;                   // this rank's GPU (gpu_of: its rank on its host mod the visible GPUs)
  std::string gpu_choice;        // how it was chosen (backend.hpp's gpu_choice), for errors
  double timeout_s = 300.0;      // cluster.collective_timeout_s
  std::size_t chunk_floats = 0;  // per peer and chunk; 0 = reduce_chunk_floats(ranks)
};

// Rank 0's id: ncclGetUniqueId's 128 bytes. Throws std::runtime_error naming the call.
RankLinkId new_nccl_id();

class NcclRankTransport final : public GradTransport {
 public:
  // A collective: every rank makes its own with the same id at the same point of the job. Throws
  // GradTransportError naming NCCL's error, this rank's GPU and why it is that GPU.
  NcclRankTransport(const RankLinkId& id, RankTransportOptions options, cudaEvent_t writers_done);
  ~NcclRankTransport() override;
  NcclRankTransport(const NcclRankTransport&) = delete;
  NcclRankTransport& operator=(const NcclRankTransport&) = delete;

  const char* name() const override { return "nccl"; }
  bool sends_from_device() const override { return true; }
  void send(int owner, const RoundGradient& mine, std::size_t n, const std::string& what) override;
  std::unique_ptr<Arrivals> receive(std::size_t n, const std::string& what) override;
  std::uint64_t bytes_sent() const override { return sent_; }

  // The last receive's transfers landed in the host buffers (Arrivals::wait).
  const float* wait_received(int rank, const std::string& what);

 private:
  using Clock = std::chrono::steady_clock;
  std::string label() const;  // "rank R of N"
  std::string timed_out(const std::string& waiting_for, const std::string& what) const;
  [[noreturn]] void fail(const std::string& why);
  // An NCCL call's result on the non-blocking communicator: ncclInProgress is polled until it settles.
  void settle(int result, const char* call, const std::string& waiting_for, const std::string& what);
  // Until the work enqueued so far on the stream is done (done_), or the timeout.
  void wait_stream(const std::string& waiting_for, const std::string& what);
  // Polls ready() (true: done; it throws on failure) until the timeout; false when it passed.
  template <class Ready>
  bool poll(Ready ready);
  void ensure_buffers(std::size_t scratch_floats, std::size_t host_floats);
  void release();

  RankTransportOptions o_;
  cudaEvent_t writers_done_ = nullptr;
  void* comm_ = nullptr;  // ncclComm_t, kept opaque so this header needs no nccl.h
  bool broken_ = false;   // a failure or timeout: the communicator is aborted, never used again
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;  // recorded after each round's last operation on stream_
  float* scratch_ = nullptr;    // the owner's device scratch: one chunk per peer
  std::size_t scratch_floats_ = 0;
  std::vector<float*> host_;  // the owner's pinned receive buffer per rank (this rank's unused)
  std::size_t host_floats_ = 0;
  std::uint64_t sent_ = 0;
};

}  // namespace mt::cuda
