// Host-side arithmetic of the NCCL rank transport (nccl_rank_transport.hpp): how one round's gradient
// (`floats` per rank) is cut into chunks, where each rank's part of a chunk lands in the owner's device
// scratch, and the order of the steps on each side. Plain C++ (no CUDA or NCCL headers), so CI tests it
// without a GPU (tests/kernels/cuda/test_rank_transfer.cpp) with fake steps standing in for NCCL.
//
// The chunks are the GPUs-of-one-node reduction's (reduce_plan.hpp) with the ranks as its devices:
// 64 MiB per peer, fewer when (ranks - 1) of them would pass 256 MiB, so the owner's scratch is bounded
// however large the stage. The owner, per chunk: one NCCL group receiving every other rank's part (rank
// order; peer i, the i-th of them, into scratch slot i), then a copy of each slot to that rank's host
// buffer at the chunk's offset. A sender, per chunk in the same order: one send of its part. NCCL
// matches the point-to-point operations of two ranks in the order they are issued, so part k of a
// sender meets receive k of the owner.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/cuda/reduce_plan.hpp"

namespace mt::cuda {

struct RankTransferPlan {
  int ranks = 0, owner = 0;
  std::vector<int> peers;           // every rank but the owner, in rank order
  std::vector<ReduceChunk> chunks;  // of every rank's `floats`, in the order both sides run them
  std::size_t scratch_floats = 0;   // the owner's device scratch: one chunk per peer
  // Where peer i's part of chunk c lands in the owner's scratch (the slots of one chunk are contiguous).
  std::size_t slot_offset(std::size_t peer_index, const ReduceChunk& c) const { return peer_index * c.floats; }
};

// The plan of one round of `floats` per rank to `owner`, in chunks of at most chunk_floats per peer
// (reduce_chunk_floats(ranks) in a run; smaller in tests).
inline RankTransferPlan rank_transfer_plan(std::size_t floats, int ranks, int owner, std::size_t chunk_floats) {
  if (ranks < 2) throw std::invalid_argument("rank_transfer_plan: needs at least 2 ranks");
  if (owner < 0 || owner >= ranks)
    throw std::invalid_argument("rank_transfer_plan: owner " + std::to_string(owner) + " is not one of " +
                                std::to_string(ranks) + " ranks");
  RankTransferPlan p;
  p.ranks = ranks, p.owner = owner;
  for (int r = 0; r < ranks; ++r)
    if (r != owner) p.peers.push_back(r);
  p.chunks = reduce_chunks(floats, chunk_floats);
  p.scratch_floats = reduce_scratch_floats(floats, chunk_floats, ranks);
  return p;
}

// Device memory the transport needs on each rank's GPU beside the arena: every rank owns stages, so each
// reserves the largest scratch a round can ask for, and NCCL's own allowance (reduce_plan.hpp).
inline std::size_t rank_transport_reserve_bytes(int ranks) { return reduce_reserve_bytes(ranks, 0); }

// The owner's steps of one round, in issue order: per chunk, group_begin(); recv(peer, scratch_offset,
// floats) for every peer; group_end(); then copy_out(peer, host_offset, scratch_offset, floats) for
// every peer.
template <class Steps>
void run_owner_steps(const RankTransferPlan& p, Steps& steps) {
  for (const ReduceChunk& c : p.chunks) {
    steps.group_begin();
    for (std::size_t i = 0; i < p.peers.size(); ++i) steps.recv(p.peers[i], p.slot_offset(i, c), c.floats);
    steps.group_end();
    for (std::size_t i = 0; i < p.peers.size(); ++i)
      steps.copy_out(p.peers[i], c.offset, p.slot_offset(i, c), c.floats);
  }
}

// A sender's steps of one round, in issue order: send(owner, offset, floats) per chunk.
template <class Steps>
void run_sender_steps(const RankTransferPlan& p, Steps& steps) {
  for (const ReduceChunk& c : p.chunks) steps.send(p.owner, c.offset, c.floats);
}

}  // namespace mt::cuda
