#include "device/cuda/nccl_rank_transport.hpp"

#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <utility>

#include "device/cuda/nccl_check.hpp"
#include "device/cuda/rank_transfer.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace mt::cuda {

namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(RankLinkId), "the bootstrap carries NCCL's id as it is");

ncclComm_t comm_of(void* c) { return static_cast<ncclComm_t>(c); }

// The arrivals of the owner's last receive: every rank's part lands with the same group, so each wait is
// the stream's.
class NcclArrivals final : public GradTransport::Arrivals {
 public:
  NcclArrivals(NcclRankTransport& t, std::string what) : t_(t), what_(std::move(what)) {}
  const float* wait(int rank) override { return t_.wait_received(rank, what_); }

 private:
  NcclRankTransport& t_;
  std::string what_;
};

}  // namespace

RankLinkId new_nccl_id() {
  ncclUniqueId uid;
  if (const ncclResult_t r = ncclGetUniqueId(&uid); r != ncclSuccess)
    throw std::runtime_error("NCCL: ncclGetUniqueId (rank 0's id for the ranks' communicator) failed: " +
                             nccl_error_text(r));
  RankLinkId id;
  std::memcpy(id.data(), &uid, sizeof uid);
  return id;
}

NcclRankTransport::NcclRankTransport(const RankLinkId& id, RankTransportOptions options, cudaEvent_t writers_done)
    : o_(std::move(options)), writers_done_(writers_done) {
  if (o_.ranks < 2) throw std::invalid_argument("NcclRankTransport: needs at least 2 ranks");
  if (o_.chunk_floats == 0) o_.chunk_floats = reduce_chunk_floats(o_.ranks);
  KeepCurrentDevice keep;
  try {
    MT_CUDA_CHECK(cudaSetDevice(o_.gpu));
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once; settle() waits with the timeout
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&c, o_.ranks, uid, o_.rank, &config);
    comm_ = c;
    settle(r, "ncclCommInitRankConfig", "the other ranks", "the ranks' NCCL communicator");
  } catch (const std::exception& e) {
    broken_ = true;
    release();
    throw GradTransportError(std::string(e.what()) + " (making the ranks' NCCL communicator on " + o_.gpu_choice +
                             "). Each rank needs a GPU of its own (NCCL refuses two ranks on one GPU): run at most "
                             "as many ranks per host as it has GPUs, or set cluster.gpu_transport=mpi");
  }
}

NcclRankTransport::~NcclRankTransport() { release(); }

void NcclRankTransport::release() {
  // Best effort, nothing throws from here. A working communicator is finalised (its operations are all
  // complete: every send and receive was waited for), a broken one aborted (its peers may be gone).
  KeepCurrentDevice keep;
  cudaSetDevice(o_.gpu);
  if (comm_ != nullptr) {
    bool finalised = false;
    if (!broken_) {
      ncclResult_t r = ncclCommFinalize(comm_of(comm_));
      finalised = r == ncclSuccess || r == ncclInProgress;
      if (r == ncclInProgress) {
        finalised = poll([&] {
          ncclCommGetAsyncError(comm_of(comm_), &r);
          return r != ncclInProgress;
        });
        finalised = finalised && r == ncclSuccess;
      }
    }
    if (finalised)
      ncclCommDestroy(comm_of(comm_));
    else
      ncclCommAbort(comm_of(comm_));
    comm_ = nullptr;
  }
  if (stream_) cudaStreamSynchronize(stream_), cudaStreamDestroy(stream_);
  if (done_) cudaEventDestroy(done_);
  cudaFree(scratch_);
  for (float* h : host_) cudaFreeHost(h);
  stream_ = nullptr, done_ = nullptr, scratch_ = nullptr, scratch_floats_ = 0;
  host_.clear(), host_floats_ = 0;
}

std::string NcclRankTransport::label() const {
  return "rank " + std::to_string(o_.rank) + " of " + std::to_string(o_.ranks);
}

void NcclRankTransport::fail(const std::string& why) {
  broken_ = true;
  throw GradTransportError(why);
}

template <class Ready>
bool NcclRankTransport::poll(Ready ready) {
  // At once, yielding the core, for the first 100 ms (a transfer in flight ends soon); then a growing
  // sleep (a peer far behind, or a hang, costs no core) until cluster.collective_timeout_s.
  const auto start = Clock::now();
  const auto limit = std::chrono::duration<double>(o_.timeout_s);
  auto pause = std::chrono::microseconds(2);
  while (!ready()) {
    const auto waited = Clock::now() - start;
    if (waited > limit) return false;
    if (waited < std::chrono::milliseconds(100)) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
  }
  return true;
}

std::string NcclRankTransport::timed_out(const std::string& waiting_for, const std::string& what) const {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", o_.timeout_s);
  return label() + ": no answer from " + waiting_for + " within " + secs +
         " s (cluster.collective_timeout_s) while waiting for " + what +
         " over NCCL: a rank died, hangs or is far behind";
}

void NcclRankTransport::settle(int result, const char* call, const std::string& waiting_for, const std::string& what) {
  auto r = static_cast<ncclResult_t>(result);
  if (r == ncclInProgress && comm_ != nullptr) {
    const bool done = poll([&] {
      if (ncclCommGetAsyncError(comm_of(comm_), &r) != ncclSuccess) r = ncclInternalError;
      return r != ncclInProgress;
    });
    if (!done) fail(timed_out(waiting_for, what) + " (in " + call + ")");
  }
  if (r != ncclSuccess)
    fail(label() + ": NCCL " + call + " failed while waiting for " + what + " on " + o_.gpu_choice + ": " +
         nccl_error_text(r, comm_of(comm_)));
}

void NcclRankTransport::wait_stream(const std::string& waiting_for, const std::string& what) {
  cudaError_t e = cudaSuccess;
  ncclResult_t async = ncclSuccess;
  const bool done = poll([&] {
    e = cudaEventQuery(done_);
    if (e != cudaErrorNotReady) return true;  // done, or a CUDA error (below)
    e = cudaSuccess;
    ncclCommGetAsyncError(comm_of(comm_), &async);  // a peer that failed, a network error
    return async != ncclSuccess && async != ncclInProgress;
  });
  if (e != cudaSuccess)
    fail(label() + ": CUDA failed while waiting for " + what + " over NCCL on " + o_.gpu_choice + ": " +
         cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  if (async != ncclSuccess && async != ncclInProgress)
    fail(label() + ": NCCL failed while waiting for " + what + " from " + waiting_for + ": " +
         nccl_error_text(async, comm_of(comm_)));
  if (!done) fail(timed_out(waiting_for, what));
}

void NcclRankTransport::ensure_buffers(std::size_t scratch_floats, std::size_t host_floats) {
  // Grown, never shrunk: each round's are at most the largest stage's. The stream is idle here (every
  // round waits for its own operations).
  if (scratch_floats > scratch_floats_) {
    MT_CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr, scratch_floats_ = 0;
    const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&scratch_), scratch_floats * sizeof(float));
    if (e != cudaSuccess)
      throw std::runtime_error("cudaMalloc of the rank transport's scratch (" +
                               std::to_string(scratch_floats * sizeof(float)) +
                               " bytes) failed: " + cudaGetErrorName(e) + "; lower device.max_vram_gb");
    scratch_floats_ = scratch_floats;
  }
  if (host_floats > host_floats_) {
    for (float* h : host_) MT_CUDA_CHECK(cudaFreeHost(h));
    host_.assign(static_cast<std::size_t>(o_.ranks), nullptr);
    host_floats_ = 0;
    for (int r = 0; r < o_.ranks; ++r)
      if (r != o_.rank)
        MT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_[static_cast<std::size_t>(r)]),
                                    host_floats * sizeof(float), cudaHostAllocPortable));
    host_floats_ = host_floats;
  }
}

void NcclRankTransport::send(int owner, const RoundGradient& mine, std::size_t n, const std::string& what) {
  const std::string peer = "rank " + std::to_string(owner);
  if (broken_) fail(label() + ": the NCCL link failed before; not sending " + what);
  KeepCurrentDevice keep;
  try {
    const RankTransferPlan plan = rank_transfer_plan(n, o_.ranks, owner, o_.chunk_floats);
    if (plan.chunks.empty()) return;
    if (mine.device == nullptr) throw std::logic_error("NcclRankTransport: the gradient has no device buffer");
    MT_CUDA_CHECK(cudaSetDevice(o_.gpu));
    if (writers_done_) MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, writers_done_, 0));
    struct Sends {
      NcclRankTransport& t;
      const float* src;
      const std::string& peer;
      const std::string& what;
      void send(int to, std::size_t offset, std::size_t floats) {
        t.settle(ncclSend(src + offset, floats, ncclFloat32, to, comm_of(t.comm_), t.stream_), "ncclSend", peer, what);
      }
    } sends{*this, mine.device, peer, what};
    run_sender_steps(plan, sends);
    MT_CUDA_CHECK(cudaEventRecord(done_, stream_));
    wait_stream(peer, what);
  } catch (const GradTransportError&) {
    throw;
  } catch (const std::exception& e) {
    fail(label() + ": sending " + what + " to " + peer + " over NCCL: " + e.what());
  }
  sent_ += n * sizeof(float);
}

std::unique_ptr<GradTransport::Arrivals> NcclRankTransport::receive(std::size_t n, const std::string& what) {
  if (broken_) fail(label() + ": the NCCL link failed before; not receiving " + what);
  KeepCurrentDevice keep;
  try {
    const RankTransferPlan plan = rank_transfer_plan(n, o_.ranks, o_.rank, o_.chunk_floats);
    MT_CUDA_CHECK(cudaSetDevice(o_.gpu));
    ensure_buffers(plan.scratch_floats, n);
    struct Receives {
      NcclRankTransport& t;
      const std::string& what;
      bool open = false;  // a group this thread must end, on an error too
      void group_begin() {
        if (const ncclResult_t r = ncclGroupStart(); r != ncclSuccess)
          throw std::runtime_error("ncclGroupStart failed: " + nccl_error_text(r));
        open = true;
      }
      void recv(int from, std::size_t scratch_offset, std::size_t floats) {
        const ncclResult_t r =
            ncclRecv(t.scratch_ + scratch_offset, floats, ncclFloat32, from, comm_of(t.comm_), t.stream_);
        if (r != ncclSuccess && r != ncclInProgress)
          throw std::runtime_error("ncclRecv from rank " + std::to_string(from) +
                                   " failed: " + nccl_error_text(r, comm_of(t.comm_)));
      }
      void group_end() {
        open = false;
        t.settle(ncclGroupEnd(), "ncclGroupEnd", "the ranks sending", what);
      }
      void copy_out(int from, std::size_t host_offset, std::size_t scratch_offset, std::size_t floats) {
        MT_CUDA_CHECK(cudaMemcpyAsync(t.host_[static_cast<std::size_t>(from)] + host_offset,
                                      t.scratch_ + scratch_offset, floats * sizeof(float), cudaMemcpyDeviceToHost,
                                      t.stream_));
      }
    } receives{*this, what};
    try {
      run_owner_steps(plan, receives);
    } catch (...) {
      if (receives.open) ncclGroupEnd();  // the first error is the one reported
      throw;
    }
    MT_CUDA_CHECK(cudaEventRecord(done_, stream_));
  } catch (const GradTransportError&) {
    throw;
  } catch (const std::exception& e) {
    fail(label() + ": receiving " + what + " over NCCL: " + e.what());
  }
  return std::make_unique<NcclArrivals>(*this, what);
}

const float* NcclRankTransport::wait_received(int rank, const std::string& what) {
  if (rank < 0 || rank >= o_.ranks || rank == o_.rank)
    throw std::logic_error("NcclRankTransport: no receive from rank " + std::to_string(rank));
  if (broken_) fail(label() + ": the NCCL link failed before; " + what + " did not arrive");
  std::string senders;
  for (int r = 0; r < o_.ranks; ++r)
    if (r != o_.rank) senders += (senders.empty() ? "" : ", ") + std::to_string(r);
  // One group brings every rank's part of a chunk: NCCL cannot say which of them is missing.
  KeepCurrentDevice keep;
  try {
    MT_CUDA_CHECK(cudaSetDevice(o_.gpu));
    wait_stream("rank(s) " + senders + " (their parts arrive in one NCCL group)", what);
  } catch (const GradTransportError&) {
    throw;
  } catch (const std::exception& e) {
    fail(label() + ": receiving " + what + " over NCCL: " + e.what());
  }
  return host_floats_ > 0 ? host_[static_cast<std::size_t>(rank)] : nullptr;
}

}  // namespace mt::cuda
