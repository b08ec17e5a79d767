// Data parallel across ranks: a stage's gradient summed over every rank's micro-batches in one fixed
// order, so N ranks give the bits of one rank with N times the accumulation steps.
//
// The mapping: a step has R x M micro-batches (R ranks, M = train.gradient_accumulation_steps each);
// rank r's local micro-batch m is the step's global micro-batch m * R + r (the one a single rank with
// R x M accumulation steps runs in that position). One rank adds them into the stage's fp32
// accumulator in global order, ((0 + g0) + g1) + g2 ...; here round m (every rank's local micro-batch
// m) is added by the stage's owner in rank order: acc + g(m*R) + g(m*R + 1) + ... + g(m*R + R - 1),
// the same additions on the same values in the same order, hence the same bits (the sum is never
// split into partial sums, which fp32 would round differently).
//
// The owner of a stage (stage_owner: round-robin) gathers every rank's gradient of the round, each
// rank sending its own straight from its staging slot; after the last round the owner sends the
// complete sum to every other rank (share_stage), which then runs the same optimizer on it. Bytes each
// rank sends per step: M x (R-1)/R of the model's gradients, plus (R-1)/R of it once (its stages to
// every other rank): 2(R-1)/R of the model with M = 1. The next slice shards the host state by the same
// owner: the owner updates its stages alone and sends the new weights instead of the gradient sum.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "cluster/world.hpp"
#include "device/grad_transport.hpp"

namespace mt::cluster {

// The rank that sums (and, in the sharded slice, updates) stage `stage`.
inline int stage_owner(std::int64_t stage, int ranks) { return static_cast<int>(stage % ranks); }

// One round of one stage on every rank, called by every rank in the same order of (step, round, stage).
// `mine`: this rank's gradient of its micro-batch of the round (n floats). `transport` carries it to the
// owner (device/grad_transport.hpp: MPI from host memory, or NCCL from the device); the owner adds every
// rank's in rank order into `accum`, the stage's fp32 accumulator (the host tile's gradient), zeroed
// first when `first` (the step's round 0), on the host: the same code and the same bits whatever the
// transport. Only the owner's `accum` is written (others may pass null).
void reduce_round(World& world, GradTransport& transport, int owner, const RoundGradient& mine, float* accum,
                  std::size_t n, bool first, int threads, const std::string& what);

// After the last round: the owner's complete sum into every other rank's `accum`.
void share_stage(World& world, int owner, float* accum, std::size_t n, const std::string& what);

// The owner's `bytes` at `data` into every other rank's `data`, on channel `ch` (the owner sends to
// each rank in rank order; the others receive). With the host state sharded (cluster.shard_state) the
// owner shares a stage's sum of squares after its last round (8 bytes, instead of the whole sum) and,
// after its update, the stage's new weights.
void share_from_owner(World& world, Channel ch, int owner, void* data, std::size_t bytes, const std::string& what);

}  // namespace mt::cluster
