// The backend seam: everything that touches device memory goes through one Backend. The actors
// (prefetcher, compute, gradient collector) hold a Backend and never read or write device bytes
// themselves; slot accounting, the schedule and restart logic stay backend-independent above it.
//
// A backend owns:
//   - device memory: one allocation of the planned arena size, made once before training (the
//     backend-independent DeviceArena in device/device_arena.hpp carves and accounts for it);
//   - the link: copies host -> device and device -> host, FIFO per direction, each with a completion
//     callback the actors turn into messages (CopyDone, BoundarySaved, a collector's future);
//   - device-side work on one compute queue, in call order: fills, device-to-device copies and the
//     stage operations (embedding, decoder layer, fused head with its loss), with the stage API's
//     semantics (kernels/stage_api.hpp) and the run's precision (kernels/precision.hpp). Every backend
//     runs the same stage code (kernels/stages.hpp) over its own ops (kernels/ops.hpp: CpuOps, CudaOps);
//     what a backend adds is memory, the link, pinning, and the checks of token ids on the host;
//   - host registration (pinning) of the tiles it streams from and into.
//
// Ordering contract (what the actors rely on; a GPU backend keeps it with streams and events):
//   1. A stage operation may read a slot only after the host-to-device copy into it completed (the
//      actors call it only after the copy's completion callback ran).
//   2. A device-to-host copy submitted after stage operations reads what they wrote: copies towards
//      the host wait for the compute work submitted before them.
//   3. When a stage operation returns, the host may reuse its inputs and the slots it read: on a
//      backend whose compute is asynchronous, stage operations return after the device finished them
//      (the CUDA backend synchronises its compute stream before returning: cuda/cuda_backend_impl.hpp).
//   4. Completion callbacks run on a backend thread, once, after the bytes landed; keep them short.
//
// Implementations: device/cpu/cpu_backend.hpp (the default; all CI tests) and, when built with
// CUDA, device/cuda/cuda_backend.hpp. make_backend() picks one by the `device.backend` key.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/grad_transport.hpp"
#include "kernels/cuda/scratch_plan.hpp"
#include "kernels/model_config.hpp"
#include "kernels/ops.hpp"
#include "kernels/precision.hpp"
#include "kernels/stage_api.hpp"

namespace mt {

enum class LinkDirection { host_to_device = 0, device_to_host = 1 };

struct LinkDirectionStats {
  std::uint64_t copies = 0;
  std::uint64_t bytes = 0;
  double busy_seconds = 0.0;
};

struct LinkStats {
  LinkDirectionStats direction[2];  // indexed by LinkDirection
  const LinkDirectionStats& of(LinkDirection d) const { return direction[static_cast<int>(d)]; }
};

// What a run asks of its backend, decided before anything is allocated.
struct BackendOptions {
  std::string kind = "cpu";  // the device.backend key: cpu | cuda
  Precision precision = Precision::fp32;
  int compute_threads = 1;        // CPU: the kernels' OpenMP threads (results do not depend on it)
  int link_workers = 1;           // CPU: copy workers (1 = both directions on one, 2 = full duplex)
  double link_bytes_per_s = 0.0;  // CPU: per-direction bandwidth limit standing in for PCIe; 0 = none
  std::int64_t head_chunk = 0;    // ComputeCtx::head_chunk
  std::int64_t seq_tile = 0;      // ComputeCtx::seq_tile: sequence tiles (long context), 0 = whole sequences
  int device_index = 0;           // CUDA: which GPU
  int devices = 1;                // device.gpus: devices 0..devices-1 must exist (check_backend_available)
  // Several ranks (mpirun), one GPU each: this rank's place among the job's ranks on its host
  // (cluster.local_rank) and their number; the GPU is then host_rank mod the visible GPUs (gpu_of), not
  // device_index. -1: not a rank of a job.
  int host_rank = -1;
  int host_ranks = 1;
  // The job's ranks when their gradients move between the GPUs (NCCL, cluster.gpu_transport; 0: not):
  // the arena's fit check leaves room for the transport's scratch and NCCL's buffers.
  int rank_transport_ranks = 0;
  bool cuda_tf32 = false;  // CUDA, fp32 runs: let cuBLASLt use TF32 tensor cores (10-bit mantissa inputs)
  // CUDA: its ops' scratch for the run's shapes (cuda::cuda_scratch_plan), allocated when the backend is
  // made, before the arena; empty: grown on first need (the op test, the checks).
  cuda::ScratchPlan cuda_scratch;
};

// The GPU a backend of these options drives among the `visible` GPUs: device_index, or for a rank of a
// job (host_rank >= 0) host_rank mod visible, so the ranks of a host take GPUs 0, 1, ... in rank order
// (and a launcher that shows each rank one GPU gives GPU 0 everywhere, each its own). gpu_choice says
// which and why, for errors ("GPU 1 (rank 1 of the job's 2 ranks on this host; 2 GPUs visible)").
int gpu_of(const BackendOptions& options, int visible);
std::string gpu_choice(const BackendOptions& options, int visible);

// A backend cannot run here (no such backend in this build, no usable device, fewer devices than
// device.gpus); nothing has been allocated. what() is "<key>: <reason>", the key being the config key to
// change (device.backend, or device.gpus); reason() is the part after the key.
class BackendUnavailable : public std::runtime_error {
 public:
  explicit BackendUnavailable(const std::string& reason, const std::string& key = "device.backend")
      : std::runtime_error(key + ": " + reason), key_(key), reason_(reason) {}
  const std::string& key() const { return key_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string key_;
  std::string reason_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual const char* name() const = 0;      // "cpu", "cuda"
  virtual std::string describe() const = 0;  // one line: device, kernels chosen, threads, precision
  virtual Precision precision() const = 0;

  // --- device memory ------------------------------------------------------------------------------
  // The arena's memory: `bytes`, zero-filled, aligned to 256 bytes, valid until the backend is
  // destroyed. Called once per run. Throws std::runtime_error naming the size when it cannot be had.
  virtual std::byte* allocate_device(std::size_t bytes) = 0;
  // Host memory the stage operations read and write in place (device.keep_intermediates=
  // boundary_mapped: the layer boundaries at long context): `bytes`, aligned to 256, valid until the
  // backend is destroyed, not zero-filled. CPU: plain memory. CUDA: mapped pinned memory
  // (cudaHostAllocMapped; with unified addressing its host address is its device address), which the
  // kernels reach over the link: at long context a layer's attention costs far more than reading its
  // boundaries across it. Throws std::runtime_error naming the size when it cannot be had.
  virtual std::byte* allocate_mapped_host(std::size_t bytes) = 0;

  // --- host memory --------------------------------------------------------------------------------
  // Registers host memory for fast copies (cudaHostRegister on CUDA; nothing on the CPU backend) and
  // undoes it. Exact byte ranges, no rounding.
  virtual void register_host(void* data, std::size_t bytes) = 0;
  virtual void unregister_host(void* data, std::size_t bytes) = 0;

  // --- host memory the stage operations address directly -----------------------------------------
  // True when the stage operations read and write host memory at its own addresses and no link is
  // modelled between the two (the CPU backend with DeviceSection::copy_bandwidth_gbps 0): a weight load
  // then maps the host tile (DeviceArena::map_slot) instead of copying it, and the collector sums a
  // gradient straight from the device buffer into the host accumulator (accumulate_to_host). Copies
  // would share the cores with compute for nothing (tools/bench/README.md, "overlap").
  virtual bool shares_host_memory() const { return false; }
  // host_acc = (first ? +0 : host_acc) + device_src element-wise, in one pass with `threads` host
  // threads: the bits of a device-to-host copy, cpu::zero (first) and cpu::accumulate. Only when
  // shares_host_memory(); the default throws std::logic_error. Ordering: after the stage operation
  // that wrote device_src (rule 3); device_src may be reused when it returns.
  virtual void accumulate_to_host(const float* device_src, float* host_acc, std::size_t n, bool first, int threads);

  // --- the link -----------------------------------------------------------------------------------
  // Queues a copy; on_done (optional) runs on a backend thread after the bytes landed.
  virtual void copy_async(LinkDirection dir, const void* src, void* dst, std::size_t bytes,
                          std::function<void()> on_done) = 0;
  // Blocks until every copy submitted so far is done and its callback ran.
  virtual void wait_link_idle() = 0;
  virtual LinkStats link_stats() const = 0;

  // --- device-side work, on the compute queue in call order --------------------------------------
  virtual void fill_zero(void* device_dst, std::size_t bytes) = 0;
  virtual void copy_on_device(void* device_dst, const void* device_src, std::size_t bytes) = 0;
  // Waits until the compute queue's work so far is finished (CPU: it already is).
  virtual void synchronize() = 0;
  // The host threads compute may use from the next stage operation on (the CPU backend's OpenMP
  // threads; a GPU backend computes on the device and ignores it). Call from the computing thread,
  // between stage operations. Results do not depend on it.
  virtual void set_compute_threads(int) {}

  // The stage operations of kernels/stage_api.hpp on device pointers: weights in the run's precision
  // (slots filled from the tiles' stream source), hidden states, gradients and workspace fp32. Written
  // once for every backend: the stages of kernels/stages.hpp over ops(), between begin_stage() and
  // end_stage(), with the token ids checked by check_ids() first. rows (kernels/stage_api.hpp): the shape
  // and, with documents, positions where the backend computes (upload_tokens' pointer), validated by the
  // caller on the host (validate_positions); the (batch, seq) forms are the stream's.
  void embedding_forward(const ModelConfig& c, const void* weights, const token_t* tokens, const BatchRows& rows,
                         float* x_out);
  void embedding_backward(const ModelConfig& c, const token_t* tokens, const BatchRows& rows, const float* dx,
                          float* grads);
  void embedding_forward(const ModelConfig& c, const void* weights, const token_t* tokens, std::int64_t batch,
                         std::int64_t seq, float* x_out) {
    embedding_forward(c, weights, tokens, BatchRows{batch, seq}, x_out);
  }
  void embedding_backward(const ModelConfig& c, const token_t* tokens, std::int64_t batch, std::int64_t seq,
                          const float* dx, float* grads) {
    embedding_backward(c, tokens, BatchRows{batch, seq}, dx, grads);
  }
  // The layer's buffers (kernels/stage_api.hpp: LayerBuffers) in device memory, or mapped host memory
  // (sequence, attention); the load-balancing gradient behind `balance` is upload_floats' pointer, its
  // statistics host arrays. The sequence tiles are BackendOptions::seq_tile.
  void layer_forward(const ModelConfig& c, const void* weights, const BatchRows& rows, const LayerBuffers& b);
  void layer_backward(const ModelConfig& c, const void* weights, const BatchRows& rows, const LayerBuffers& b);
  // The fused head; returns the loss read back to the host (once per call).
  // targets: upload_tokens' pointer.
  LossSum head_forward_backward(const ModelConfig& c, const void* head_weights, const void* embed_weights,
                                const BatchRows& rows, const HeadBuffers& b);

  // Where the next stage operations run in the schedule (the compute actor sets it before each):
  // failure messages name it. layer: the decoder layer, -1 for the embedding and head.
  void set_position(std::int64_t step, std::int64_t micro_batch, std::int64_t layer) {
    position_ = {step, micro_batch, layer};
  }

  // The backend's op set, on its compute queue (rules 1-4 as for the stage operations; its ops may
  // return before they ran, loss_sum waits). The stage operations above run the stages over it; the op
  // test (tests/device/test_backend_ops.cpp) calls it directly on buffers from allocate_device.
  virtual Ops& ops() = 0;

  // Token ids the stage operations read: on the CPU backend host memory is device memory; a GPU
  // backend copies them into a device buffer of its own and returns that pointer (valid until the
  // next call with the same `slot`, 0..5: inputs, targets and documents' positions (int32 like the ids)
  // of the two micro-batches in flight).
  virtual const token_t* upload_tokens(const token_t* host_tokens, std::size_t n, int slot) = 0;
  // A few floats the stage operations read (the load-balancing gradient): the host pointer on the CPU
  // backend, a copy in a device buffer of slot 0..1 elsewhere (valid until the next call with that slot).
  virtual const float* upload_floats(const float* host, std::size_t n, int slot) = 0;

  // --- several devices of one node (device.gpus = N) ----------------------------------------------
  // Sums one stage's gradients across the node's devices, on the devices, called on device 0's
  // backend: devices[d] is device d's backend (devices[0] == this), grads[d] a buffer of `floats`
  // fp32 values in device d's memory. On return grads[0] holds the element-wise sum, added in device
  // order, ((g0 + g1) + g2) + ... (fixed: deterministic run to run, and bit-identical across backends);
  // grads[1..] are unchanged and may be reused at once. Ordering: the stage operations that wrote every
  // grads[d] were called before (rule 3), and a device-to-host copy of grads[0] submitted on this backend
  // after the call reads the sum (rule 2). The CPU backend adds in host memory; the CUDA backend gathers
  // the buffers onto device 0 with NCCL in bounded chunks and adds them there in device order (its
  // README). The default: this backend cannot (device.gpus must stay 1).
  virtual void reduce_gradients(const std::vector<Backend*>& devices, const std::vector<float*>& grads,
                                std::size_t floats);

  // --- several ranks (mpirun), one device each ---------------------------------------------------
  // A transport that moves the ranks' gradients between their devices (device/grad_transport.hpp): the
  // CUDA backend's over NCCL in builds with NCCL (cuda/nccl_rank_transport.hpp). The default throws
  // std::logic_error (the ranks then send host copies over MPI: cluster/host_grad_transport.hpp).
  // new_rank_link_id: rank 0's half of the bootstrap, a new communicator id (ncclGetUniqueId), which
  // cluster/bootstrap_id.hpp gives every rank. make_rank_transport: this rank's end of it, from that id
  // as every rank holds it; a collective (every rank makes its own at the same point). timeout_s bounds
  // every wait (cluster.collective_timeout_s).
  virtual RankLinkId new_rank_link_id();
  virtual std::unique_ptr<GradTransport> make_rank_transport(const RankLinkId& id, int rank, int ranks,
                                                             double timeout_s);

 protected:
  struct Position {
    std::int64_t step = -1, micro_batch = -1, layer = -1;
  };
  // Around every stage operation (`stage`: its name): make this backend's device current; then wait for
  // the stage's work (rule 3) and surface asynchronous errors. The CPU backend's compute is synchronous:
  // nothing to do. abandon_stage replaces end_stage when the stage throws: the caller may reuse the
  // buffers the stage's queued work still reads as soon as the exception reaches it, so it waits for
  // that work first (best effort: it must not throw while unwinding).
  virtual void begin_stage(const char* /*stage*/) {}
  virtual void end_stage() {}
  virtual void abandon_stage() noexcept {}
  Position position_;  // set_position's
  class StageScope;
  // Throws std::invalid_argument unless ids[0..n) (what upload_tokens returned) are token ids of the
  // model (targets: or -100), read where the host can (a GPU backend keeps a host copy of each upload).
  virtual void check_ids(const ModelConfig& c, const token_t* ids, std::int64_t n, bool targets, const char* what) = 0;
  std::int64_t head_chunk_ = 0;  // BackendOptions::head_chunk
  std::int64_t seq_tile_ = 0;    // BackendOptions::seq_tile
};

// The backend named by options.kind. Throws BackendUnavailable (naming `device.backend` and why) when
// this build or machine cannot run it: "cuda" in a build without the CUDA backend, no usable GPU, or a
// backend that is not implemented yet. Nothing falls back silently.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);

// Checks what make_backend would, without allocating anything (config validation before start).
void check_backend_available(const BackendOptions& options);

}  // namespace mt
