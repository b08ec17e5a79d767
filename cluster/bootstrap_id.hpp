// The bootstrap of a communicator across the ranks (NCCL's: ncclGetUniqueId on one rank, then
// ncclCommInitRank on every rank with the same 128 bytes). This file knows nothing of NCCL: the id is an
// opaque blob that rank 0 makes and every rank must hold byte for byte before any of them uses it, so
// the exchange is tested on the CPU under mpirun (tests/cluster/test_bootstrap_id.cpp).
//
// Why a check after the broadcast: a rank that made its communicator from other bytes (a message
// matched to the wrong transfer, a rank of another job) would not fail there but hang in NCCL's own
// bootstrap, with no rank named. So every rank's checksum of what it holds goes to every rank (an
// allgather, 8 bytes each), and each rank refuses, naming the ranks that differ from rank 0, before any
// communicator is made. Every transfer has the World's timeout: a rank that never joins is named.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "cluster/world.hpp"

namespace mt::cluster {

inline constexpr std::size_t kBootstrapIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
using BootstrapId = std::array<unsigned char, kBootstrapIdBytes>;

// XXH3-64 of the id: what the ranks compare.
std::uint64_t bootstrap_id_checksum(const BootstrapId& id);

// Rank 0 runs make_id() and sends the bytes to every other rank on `ch` (in rank order); returns the id
// on every rank. Every rank of the world calls it at the same point of `ch`'s order.
BootstrapId broadcast_bootstrap_id(World& world, Channel ch, const std::function<BootstrapId()>& make_id,
                                   const std::string& what);
// Every rank's checksum of `id` to every rank; throws ClusterError on every rank when any rank's differs
// from rank 0's, naming those ranks.
void check_same_bootstrap_id(World& world, Channel ch, const BootstrapId& id, const std::string& what);

// Both: the id every rank then makes its communicator from.
BootstrapId share_bootstrap_id(World& world, Channel ch, const std::function<BootstrapId()>& make_id,
                               const std::string& what);

}  // namespace mt::cluster
