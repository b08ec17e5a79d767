// Internal: the CUDA backend's state (cuda_backend.cpp: memory, the link, tokens, and the stage
// operations, which run the stages of kernels/stages.hpp over its CudaOps).
//
// Streams and ordering (backend.hpp's contract):
//   - compute: fills, device-to-device copies and every stage operation, in call order. A stage
//     operation synchronises the compute stream before it returns (rule 3: the host may then reuse its
//     inputs and slots), so a slot the actors free is never read afterwards.
//   - host-to-device: its own stream. The actors call a stage operation only after the copy's
//     completion ran (rule 1), which the poller reports only after the copy's event completed, so the
//     bytes are on the device; the copy does not wait for compute (that would serialise prefetch
//     behind the layer being computed).
//   - device-to-host: its own stream; every copy first waits (on the device) for an event recorded on
//     the compute stream at submission, so it reads what the compute work submitted before it wrote
//     (rule 2) without blocking the host.
//   - several ranks over NCCL (make_rank_transport): the NcclRankTransport's own stream; a send waits
//     for stage_done_ (as below), the owner's receives write only the transport's own buffers.
//   - several GPUs (reduce_gradients, on device 0's backend): the NcclReducer's own stream per GPU.
//     Each GPU's part starts after that backend's stage_done_ event (recorded at the end of every stage
//     operation: the buffers' writers), never after an event recorded on a compute stream at call time,
//     which would hold the reduction behind whatever stage operation that device runs meanwhile (and
//     the other devices' next writes behind it). Device 0's device-to-host stream then waits for the sum
//     (the collector's copy of it follows), device d's compute stream for the end of its sends (its
//     buffer is rewritten there next). Device 0's compute does not wait: it rewrites its buffer only
//     after the copy of the sum landed.
// Completions: one poller thread per direction waits (cudaEventBlockingSync, no spinning) on each
// copy's end event in submission order and runs its callback there (rule 4). Chosen over
// cudaLaunchHostFunc because a host function occupies its stream until it returns (a slow actor
// callback would stall the next copy) and may not call CUDA, while the poller can also read the copy's
// timing events for LinkStats.
#pragma once
#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device/backend.hpp"
#include "device/cuda/completion_queue.hpp"
#include "device/cuda/nccl_reduce.hpp"
#include "device/cuda/pinned_ranges.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/cuda/fault_context.hpp"
#include "kernels/cuda/gemm.hpp"

namespace mt::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;

  const char* name() const override { return "cuda"; }
  std::string describe() const override;
  Precision precision() const override { return options_.precision; }

  std::byte* allocate_device(std::size_t bytes) override;
  std::byte* allocate_mapped_host(std::size_t bytes) override;
  void register_host(void* data, std::size_t bytes) override;
  void unregister_host(void* data, std::size_t bytes) override;

  void copy_async(LinkDirection dir, const void* src, void* dst, std::size_t bytes,
                  std::function<void()> on_done) override;
  void wait_link_idle() override;
  LinkStats link_stats() const override;

  void fill_zero(void* device_dst, std::size_t bytes) override;
  void copy_on_device(void* device_dst, const void* device_src, std::size_t bytes) override;
  void synchronize() override;

  const token_t* upload_tokens(const token_t* host_tokens, std::size_t n, int slot) override;
  const float* upload_floats(const float* host, std::size_t n, int slot) override;
  void reduce_gradients(const std::vector<Backend*>& devices, const std::vector<float*>& grads,
                        std::size_t floats) override;
  RankLinkId new_rank_link_id() override;
  std::unique_ptr<GradTransport> make_rank_transport(const RankLinkId& id, int rank, int ranks,
                                                     double timeout_s) override;

  Ops& ops() override;  // on the compute stream, this backend's device selected

  // Used by the tests.
  cudaStream_t compute_stream() const { return compute_; }
  Gemm& gemm() { return *gemm_; }
  int device() const { return device_; }

 protected:
  void begin_stage(const char* stage) override;  // selects the device, sets the thread's fault context
  void end_stage() override;                     // synchronises compute (rule 3) and surfaces asynchronous errors
  void abandon_stage() noexcept override;
  // On the host copy of the upload.
  void check_ids(const ModelConfig& c, const token_t* ids, std::int64_t n, bool targets, const char* what) override;

 private:
  struct CopyEvents {  // a copy's start and end on its stream (timing), and what it was (errors) ...
    cudaEvent_t start = nullptr, end = nullptr;
    LinkDirection dir = LinkDirection::host_to_device;
    std::size_t bytes = 0;
    const void* src = nullptr;
    void* dst = nullptr;
  };
  struct Direction {
    cudaStream_t stream = nullptr;
    std::mutex submit;  // ... enqueued and queued under one lock: the queue's order is the stream's
    std::unique_ptr<CompletionQueue<CopyEvents>> done;
  };
  struct TokenSlot {
    std::vector<token_t> host;  // what was uploaded (validated against the model at use)
    token_t* device = nullptr;
    std::size_t capacity = 0;
    bool csr_ready = false;  // the per-token row lists below match `host`
    std::int32_t *unique = nullptr, *offsets = nullptr, *rows = nullptr;
    std::vector<std::int32_t> host_unique, host_offsets, host_rows;  // the sources of their copies
    std::int64_t n_unique = 0;
  };
  void select_device() const;
  void reserve_scratch();                 // options_.cuda_scratch, naming what to change when it does not fit
  double wait_copy(CopyEvents& e) const;  // on a poller thread
  [[noreturn]] void copy_failed(const CopyEvents& e, cudaError_t err, const char* what) const;
  TokenSlot& slot_of(const token_t* device_tokens, const char* what);
  void build_token_rows(TokenSlot& s);
  TokenRows token_rows(const token_t* device_tokens, std::int64_t n);

  BackendOptions options_;
  int device_ = 0;             // gpu_of(options_, the visible GPUs)
  std::string device_choice_;  // gpu_choice: which GPU and why, for errors
  std::string device_name_;
  int sm_major_ = 0, sm_minor_ = 0;
  cudaStream_t compute_ = nullptr;
  cudaEvent_t stage_done_ = nullptr;  // recorded on compute_ at the end of every stage operation
  mutable std::mutex stage_mu_;
  FaultContext last_stage_;  // the stage operation begun last (a poller's failure names it)
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<CudaOps> ops_;  // the stages' ops, on compute_
  Direction dirs_[2];
  std::vector<void*> allocations_;
  std::vector<void*> mapped_;  // cudaHostAlloc'ed (mapped) host memory: allocate_mapped_host
  PinnedRanges pinned_;        // cudaHostRegister'ed host ranges
  std::mutex token_mu_;
  TokenSlot slots_[6];  // inputs, targets and (documents) positions of the two micro-batches in flight
  struct FloatSlot {
    std::vector<float> host;  // the source of the last upload's copy
    float* device = nullptr;
    std::size_t capacity = 0;
  };
  FloatSlot float_slots_[2];              // upload_floats' (the load-balancing gradient of the micro-batches in flight)
#if MEGATRAIN_HAVE_NCCL                   // nccl_reduce.cu is built only with NCCL
  std::mutex reduce_mu_;                  // one reduction at a time (NCCL: one call order on every rank)
  std::unique_ptr<NcclReducer> reducer_;  // device 0's: made on its first reduce_gradients
#endif
};

}  // namespace mt::cuda
