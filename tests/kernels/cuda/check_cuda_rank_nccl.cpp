// The ranks' gradient transport over NCCL (device/cuda/nccl_rank_transport.hpp) against the one over MPI
// (cluster/host_grad_transport.hpp), under mpirun with one GPU per rank (`mpirun -np 2
// check_cuda_rank_nccl`; tools/gpu-stages runs it when 2 GPUs are visible): the communicator's id from
// rank 0 over the World (cluster/bootstrap_id.hpp), then rounds of reduce_round with every rank as the
// owner in turn, stages of 1 float to larger than a chunk (a transport with 1000-float chunks, and the
// backend's own with 64 MiB ones). The owner's sum must be bit-identical to the MPI transport's and to
// ((0 + g0) + g1) + ... computed on the owner from every rank's values; the non-owners send from the
// device alone (no host copy is passed). Exit 77 (skipped, never passed) without a GPU for every rank
// or outside mpirun.
#include <cstdio>
#include <cstring>
#include <vector>

#include "cluster/bootstrap_id.hpp"
#include "cluster/grad_reduce.hpp"
#include "cluster/host_grad_transport.hpp"
#include "device/backend.hpp"
#include "device/cuda/nccl_rank_transport.hpp"
#include "kernels/step_math.hpp"
#include "tests/kernels/cuda/cuda_check_util.hpp"

using namespace mt;
using namespace mt::cuda::check;

namespace {

// Rank r's gradient of a round: values of mixed magnitude, so the order of the additions shows in the bits.
std::vector<float> gradient_of(int rank, int round, std::size_t n) {
  std::vector<float> g(n);
  std::uint32_t s = 2654435761u * static_cast<std::uint32_t>(rank + 1) + 40503u * static_cast<std::uint32_t>(round);
  for (float& v : g) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<std::int32_t>(s >> 8) - (1 << 23)) * (rank % 2 ? 1e-3f : 7.0f);
  }
  return g;
}

struct Job {
  cluster::World& world;
  Backend& backend;
  Verdicts& v;
};

// Two rounds (the first zeroes the accumulator) of `n` floats to each owner in turn over `nccl`, against
// the MPI transport and the sum in rank order.
void check_rounds(Job& job, GradTransport& nccl, std::size_t n, const std::string& tag) {
  cluster::World& w = job.world;
  const int me = w.rank(), R = w.size();
  cluster::HostGradTransport mpi(w, n);
  auto* dev = reinterpret_cast<float*>(job.backend.allocate_device(std::max<std::size_t>(n, 1) * sizeof(float)));
  const std::uint64_t sent_before = nccl.bytes_sent();
  std::uint64_t expect_sent = 0;
  for (int owner = 0; owner < R; ++owner) {
    std::vector<float> over_nccl(n), over_mpi(n), in_order(n, 0.0f);
    for (int round = 0; round < 2; ++round) {
      const std::vector<float> mine = gradient_of(me, round, n);
      // The transport's non-blocking stream does not wait for the legacy stream, and a pageable copy may
      // return before its bytes land: drain the device before the send reads them.
      MT_CUDA_CHECK(cudaMemcpy(dev, mine.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      MT_CUDA_CHECK(cudaDeviceSynchronize());
      const std::string what = tag + " round " + std::to_string(round) + " to rank " + std::to_string(owner);
      // A non-owner passes no host copy: the NCCL transport must send from the device.
      const RoundGradient g{dev, me == owner ? mine.data() : nullptr};
      cluster::reduce_round(w, nccl, owner, g, over_nccl.data(), n, round == 0, 1, what);
      cluster::reduce_round(w, mpi, owner, RoundGradient{dev, mine.data()}, over_mpi.data(), n, round == 0, 1, what);
      if (me != owner) expect_sent += n * sizeof(float);
      if (me == owner)
        for (int r = 0; r < R; ++r) cpu::accumulate(in_order.data(), gradient_of(r, round, n).data(), n, 1);
    }
    if (me != owner) continue;
    const std::string who = "rank " + std::to_string(me) + ": " + tag + ", owner " + std::to_string(owner);
    job.v.bit_equal(who + ": NCCL == MPI transport", over_nccl, over_mpi);
    job.v.bit_equal(who + ": NCCL == ((0 + g0) + g1) + ... on the host", over_nccl, in_order);
  }
  job.v.fact("rank " + std::to_string(me) + ": " + tag + ": NCCL counted the bytes it sent",
             nccl.bytes_sent() - sent_before == expect_sent);
}

}  // namespace

int main() {
  require_gpu("check_cuda_rank_nccl");
  std::unique_ptr<cluster::World> world;
  try {
    world = cluster::World::join("auto", 120.0);
  } catch (const std::exception& e) {
    std::printf("check_cuda_rank_nccl: %s: skipped\n", e.what());
    return 77;
  }
  if (world == nullptr || world->size() < 2) {
    std::printf("check_cuda_rank_nccl: run it under mpirun with 2 or more ranks (one GPU each): skipped\n");
    return 77;
  }
  int count = 0;
  MT_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (world->local_size() > count) {  // every rank sees the same: all skip alike
    std::printf(
        "check_cuda_rank_nccl: rank %d: %d ranks on this host and %d GPU(s): NCCL refuses two ranks on one "
        "GPU: skipped\n",
        world->rank(), world->local_size(), count);
    return 77;
  }
  Verdicts v;
  try {
    BackendOptions o;
    o.kind = "cuda";
    o.host_rank = world->local_rank();
    o.host_ranks = world->local_size();
    o.rank_transport_ranks = world->size();
    const std::unique_ptr<Backend> backend = make_backend(o);
    std::printf("rank %d of %d: %s\n", world->rank(), world->size(), backend->describe().c_str());
    Job job{*world, *backend, v};
    // The backend's own transport (64 MiB chunks: these stages are one chunk each; the transport below
    // with small chunks cuts a stage into many).
    const RankLinkId id = cluster::share_bootstrap_id(
        *world, cluster::Channel::grads, [&] { return backend->new_rank_link_id(); }, "the check's NCCL id");
    {
      const std::unique_ptr<GradTransport> t = backend->make_rank_transport(id, world->rank(), world->size(), 120.0);
      check_rounds(job, *t, 1, "1 float");
      check_rounds(job, *t, 300000, "300000 floats");
    }
    // Chunks of 1000 floats: a stage of 12345 is 13 chunks, received a group each through the bounded scratch.
    cuda::RankTransportOptions small;
    small.rank = world->rank(), small.ranks = world->size(), small.timeout_s = 120.0, small.chunk_floats = 1000;
    small.gpu = gpu_of(o, count), small.gpu_choice = gpu_choice(o, count);
    const RankLinkId id2 = cluster::share_bootstrap_id(
        *world, cluster::Channel::grads, [] { return cuda::new_nccl_id(); }, "the check's second NCCL id");
    cuda::NcclRankTransport chunked(id2, small, nullptr);
    check_rounds(job, chunked, 12345, "12345 floats in 1000-float chunks");
  } catch (const std::exception& e) {
    std::printf("FAIL rank %d: %s\n", world->rank(), e.what());
    return 1;
  }
  return v.finish("check_cuda_rank_nccl");
}
