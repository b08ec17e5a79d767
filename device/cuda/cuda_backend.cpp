// The CUDA backend: device memory, pinned host ranges, the two copy streams with their completion
// pollers, token uploads, and the stage operations: the stages of kernels/stages.hpp, the same code the
// CPU backend runs, over CudaOps on the compute stream.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "device/cuda/cuda_backend.hpp"
#include "device/cuda/cuda_backend_impl.hpp"
#if MEGATRAIN_HAVE_NCCL
#include "device/cuda/nccl_rank_transport.hpp"
#endif
#include "device/cuda/rank_transfer.hpp"
#include "device/cuda/reduce_plan.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/plan.hpp"
#include "kernels/stages.hpp"

namespace mt::cuda {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

CudaBackend::CudaBackend(const BackendOptions& options)
    : options_(options),
      pinned_(
          [this](void* p, std::size_t n) {
            select_device();
            MT_CUDA_CHECK(cudaHostRegister(p, n, cudaHostRegisterPortable));
          },
          [this](void* p, std::size_t) {
            select_device();
            MT_CUDA_CHECK(cudaHostUnregister(p));
          }) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    throw BackendUnavailable(std::string("cuda needs a usable GPU and this machine has none (") +
                             (e != cudaSuccess ? cudaGetErrorName(e) : "no device") + "); use device.backend=cpu");
  device_ = gpu_of(options_, count);
  device_choice_ = gpu_choice(options_, count);
  if (device_ < 0 || device_ >= count)
    throw BackendUnavailable("cuda: GPU " + std::to_string(device_) + " does not exist (" + std::to_string(count) +
                             " found)");
  MT_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  device_name_ = prop.name;
  sm_major_ = prop.major, sm_minor_ = prop.minor;
  if (sm_major_ < 8)
    throw BackendUnavailable("cuda: GPU " + std::to_string(device_) + " (" + device_name_ + ", sm_" +
                             std::to_string(sm_major_) + std::to_string(sm_minor_) +
                             ") is older than sm_80; this build has kernels for sm_80 and sm_90");
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&stage_done_, cudaEventDisableTiming));
  for (auto& d : dirs_) MT_CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
  gemm_ = std::make_unique<Gemm>(options_.cuda_tf32);
  head_chunk_ = options_.head_chunk;
  seq_tile_ = options_.seq_tile;
  ops_ = std::make_unique<CudaOps>(*gemm_, compute_, options_.precision,
                                   [this](const token_t* t, std::int64_t n) { return token_rows(t, n); });
  if (!options_.cuda_scratch.empty()) reserve_scratch();
  for (auto& d : dirs_)
    d.done = std::make_unique<CompletionQueue<CopyEvents>>([this](CopyEvents& ev) { return wait_copy(ev); });
}

CudaBackend::~CudaBackend() {
#if MEGATRAIN_HAVE_NCCL
  reducer_.reset();  // synchronises its streams, then finalises and frees the communicator
#endif
  select_device();
  for (auto& d : dirs_)
    if (d.done) d.done->stop();  // drains the queue first: every callback runs
  // Best effort from here: a destructor must not throw, and every resource is released either way.
  cudaDeviceSynchronize();
  pinned_.release_all();
  for (auto& s : slots_) cudaFree(s.device), cudaFree(s.unique), cudaFree(s.offsets), cudaFree(s.rows);
  for (auto& s : float_slots_) cudaFree(s.device);
  ops_.reset();
  for (void* p : allocations_) cudaFree(p);
  for (void* p : mapped_) cudaFreeHost(p);
  gemm_.reset();
  for (auto& d : dirs_) cudaStreamDestroy(d.stream);
  cudaEventDestroy(stage_done_);
  cudaStreamDestroy(compute_);
}

void CudaBackend::select_device() const { MT_CUDA_CHECK(cudaSetDevice(device_)); }

void CudaBackend::reserve_scratch() {
  try {
    ops_->reserve(options_.cuda_scratch);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("CUDA: the ops' scratch for this run's shapes (" +
                             std::to_string(options_.cuda_scratch.total()) + " bytes on GPU " +
                             std::to_string(device_) + ") cannot be allocated: " + e.what() +
                             "; lower the batch or the sequence length, or set device.seq_tile");
  }
}

std::string CudaBackend::describe() const {
  return "cuda backend: GPU " + std::to_string(device_) + " " + device_name_ + " (sm_" + std::to_string(sm_major_) +
         std::to_string(sm_minor_) + "), " + precision_name(options_.precision) + " compute, cuBLASLt " +
         (options_.precision == Precision::bf16 ? "bf16 x bf16 -> fp32"
                                                : (gemm_->tf32() ? "fp32 (TF32 allowed)" : "fp32 (no TF32)")) +
         ", flash-style attention, one compute + two copy streams";
}

// ---------------- memory ----------------
std::byte* CudaBackend::allocate_mapped_host(std::size_t bytes) {
  select_device();
  int unified = 0;
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, device_));
  if (!unified)
    throw std::runtime_error("CUDA: GPU " + std::to_string(device_) +
                             " has no unified addressing, so it cannot use host memory in place; use "
                             "device.keep_intermediates=boundary_host");
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess)
    throw std::runtime_error("CUDA: cudaHostAlloc of the mapped layer boundaries (" + std::to_string(bytes) +
                             " bytes) failed: " + cudaGetErrorName(e) +
                             "; use device.keep_intermediates=boundary_host or lower data.seq_length");
  mapped_.push_back(p);
  return static_cast<std::byte*>(p);
}

std::byte* CudaBackend::allocate_device(std::size_t bytes) {
  select_device();
  std::size_t free_b = 0, total_b = 0;
  MT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  // Several GPUs: the reduction's scratch (device 0) and NCCL's buffers live beside the arena too.
  // Several ranks over NCCL: its scratch (every rank owns stages) and NCCL's buffers, on every rank's GPU.
  // The ops' scratch was allocated with the backend: free_b no longer holds it.
  check_arena_fits(
      bytes, free_b, total_b, device_,
      kDeviceReserveBytes + reduce_reserve_bytes(options_.devices, device_) +
          (options_.rank_transport_ranks > 1 ? rank_transport_reserve_bytes(options_.rank_transport_ranks) : 0),
      options_.cuda_scratch.total());
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess)
    throw std::runtime_error("CUDA: cudaMalloc of the device arena (" + std::to_string(bytes) +
                             " bytes) failed: " + cudaGetErrorName(e) + "; lower device.max_vram_gb");
  allocations_.push_back(p);
  MT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute_));
  MT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  return static_cast<std::byte*>(p);
}

void CudaBackend::register_host(void* data, std::size_t bytes) { pinned_.add(data, bytes); }

void CudaBackend::unregister_host(void* data, std::size_t bytes) { pinned_.remove(data, bytes); }

// ---------------- the link ----------------
void CudaBackend::copy_async(LinkDirection dir, const void* src, void* dst, std::size_t bytes,
                             std::function<void()> on_done) {
  select_device();
  Direction& d = dirs_[static_cast<int>(dir)];
  CopyEvents e;
  e.dir = dir, e.bytes = bytes, e.src = src, e.dst = dst;
  std::lock_guard<std::mutex> lock(d.submit);
  MT_CUDA_CHECK(cudaEventCreate(&e.start));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&e.end, cudaEventBlockingSync));
  if (dir == LinkDirection::device_to_host) {  // rule 2: after the compute work submitted so far
    cudaEvent_t ready = nullptr;
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    MT_CUDA_CHECK(cudaEventRecord(ready, compute_));
    MT_CUDA_CHECK(cudaStreamWaitEvent(d.stream, ready, 0));
    MT_CUDA_CHECK(cudaEventDestroy(ready));  // released once it completed; the wait stays enqueued
  }
  MT_CUDA_CHECK(cudaEventRecord(e.start, d.stream));
  if (bytes > 0)
    MT_CUDA_CHECK(cudaMemcpyAsync(
        dst, src, bytes, dir == LinkDirection::host_to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
        d.stream));
  MT_CUDA_CHECK(cudaEventRecord(e.end, d.stream));
  d.done->push(e, bytes, std::move(on_done));
}

// A failure on a poller thread cannot be thrown to anyone: it ends the process, naming the call, the
// copy and the stage operation compute began last (a kernel's fault surfaces at any later wait, this
// one included; CUDA_LAUNCH_BLOCKING=1 pins it on its kernel).
void CudaBackend::copy_failed(const CopyEvents& e, cudaError_t err, const char* what) const {
  FaultContext stage;
  {
    std::lock_guard<std::mutex> lock(stage_mu_);
    stage = last_stage_;
  }
  const std::string where = describe_fault(stage);
  std::fprintf(stderr,
               "megatrain: CUDA copy completion on GPU %d: %s failed: %s (%s); the copy: %s, %zu bytes, %p -> %p; "
               "compute's last stage operation%s\n",
               device_, what, cudaGetErrorName(err), cudaGetErrorString(err),
               e.dir == LinkDirection::host_to_device ? "host to device" : "device to host", e.bytes, e.src, e.dst,
               where.empty() ? ": none yet" : where.c_str());
  std::abort();
}

double CudaBackend::wait_copy(CopyEvents& e) const {
  const auto check = [&](cudaError_t err, const char* what) {
    if (err != cudaSuccess) copy_failed(e, err, what);
  };
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaEventSynchronize(e.end), "cudaEventSynchronize on a copy's end event");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, e.start, e.end), "cudaEventElapsedTime");
  check(cudaEventDestroy(e.start), "cudaEventDestroy");
  check(cudaEventDestroy(e.end), "cudaEventDestroy");
  return ms * 1e-3;
}

void CudaBackend::wait_link_idle() {
  for (auto& d : dirs_) d.done->wait_idle();
}

LinkStats CudaBackend::link_stats() const {
  LinkStats s;
  for (int d = 0; d < 2; ++d) s.direction[d] = dirs_[d].done->stats();
  return s;
}

// ---------------- compute-queue utilities ----------------
void CudaBackend::fill_zero(void* device_dst, std::size_t bytes) {
  select_device();
  if (bytes) MT_CUDA_CHECK(cudaMemsetAsync(device_dst, 0, bytes, compute_));
}

void CudaBackend::copy_on_device(void* device_dst, const void* device_src, std::size_t bytes) {
  select_device();
  if (bytes) MT_CUDA_CHECK(cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, compute_));
}

void CudaBackend::synchronize() {
  select_device();
  MT_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

void CudaBackend::begin_stage(const char* stage) {
  select_device();
  FaultContext& c = fault_context();
  c = FaultContext{};
  c.stage = stage, c.device = device_;
  c.step = position_.step, c.micro_batch = position_.micro_batch, c.layer = position_.layer;
  std::lock_guard<std::mutex> lock(stage_mu_);
  last_stage_ = c;
}

void CudaBackend::end_stage() {
  MT_CUDA_CHECK(cudaGetLastError());
  MT_CUDA_CHECK(cudaEventRecord(stage_done_, compute_));
  MT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  fault_context() = FaultContext{};
}

void CudaBackend::abandon_stage() noexcept {
  // The caller may free or rewrite the stage's buffers once the exception reaches it: let the queued
  // kernels finish (or fail) first. Errors were, or will be, reported by the call that threw.
  if (cudaSetDevice(device_) == cudaSuccess) cudaStreamSynchronize(compute_);
  fault_context() = FaultContext{};
}

// ---------------- several GPUs ----------------
void CudaBackend::reduce_gradients(const std::vector<Backend*>& devices, const std::vector<float*>& grads,
                                   std::size_t floats) {
  std::vector<CudaBackend*> peers;
  std::vector<int> gpus;
  for (Backend* b : devices) {
    peers.push_back(dynamic_cast<CudaBackend*>(b));
    gpus.push_back(peers.back() ? peers.back()->device_ : -1);
  }
  check_reduce_call(gpus, std::vector<const float*>(grads.begin(), grads.end()), floats,
                    !devices.empty() && devices[0] == this);
  if (devices.size() == 1 || floats == 0) return;
#if MEGATRAIN_HAVE_NCCL
  std::lock_guard<std::mutex> lock(reduce_mu_);
  if (!reducer_) {
    reducer_ = std::make_unique<NcclReducer>(gpus, reduce_chunk_floats(static_cast<int>(gpus.size())));
  } else if (reducer_->gpus() != gpus) {
    throw std::invalid_argument("CUDA reduce_gradients: the communicator was made for " +
                                std::to_string(reducer_->size()) +
                                " GPUs in another order; every call of a run "
                                "must name the same devices");
  }
  std::vector<cudaEvent_t> after;
  for (CudaBackend* p : peers) after.push_back(p->stage_done_);
  reducer_->reduce_to_first(grads, floats, after);
  KeepCurrentDevice keep;
  for (std::size_t d = 1; d < peers.size(); ++d) {  // device d rewrites its buffer on compute, next
    peers[d]->select_device();
    MT_CUDA_CHECK(cudaStreamWaitEvent(peers[d]->compute_, reducer_->done(static_cast<int>(d)), 0));
  }
  select_device();
  Direction& down = dirs_[static_cast<int>(LinkDirection::device_to_host)];
  std::lock_guard<std::mutex> submit(down.submit);  // between two copies, not inside one's timing events
  MT_CUDA_CHECK(cudaStreamWaitEvent(down.stream, reducer_->done(0), 0));
#else
  throw std::logic_error(
      "CUDA reduce_gradients: this build has no NCCL (configured without it), so device.gpus must be 1 with "
      "device.backend=cuda");
#endif
}

// ---------------- several ranks ----------------
RankLinkId CudaBackend::new_rank_link_id() {
#if MEGATRAIN_HAVE_NCCL
  return new_nccl_id();
#else
  return Backend::new_rank_link_id();
#endif
}

std::unique_ptr<GradTransport> CudaBackend::make_rank_transport(const RankLinkId& id, int rank, int ranks,
                                                                double timeout_s) {
#if MEGATRAIN_HAVE_NCCL
  RankTransportOptions o;
  o.rank = rank, o.ranks = ranks, o.gpu = device_, o.gpu_choice = device_choice_, o.timeout_s = timeout_s;
  return std::make_unique<NcclRankTransport>(id, o, stage_done_);
#else
  return Backend::make_rank_transport(id, rank, ranks, timeout_s);
#endif
}

// ---------------- tokens ----------------
const float* CudaBackend::upload_floats(const float* host, std::size_t n, int slot) {
  if (slot < 0 || slot > 1) throw std::invalid_argument("CUDA upload_floats: slot must be 0..1");
  select_device();
  std::lock_guard<std::mutex> lock(token_mu_);
  FloatSlot& s = float_slots_[slot];
  MT_CUDA_CHECK(cudaStreamSynchronize(compute_));  // queued work may still read the previous contents
  if (n > s.capacity) {
    MT_CUDA_CHECK(cudaFree(s.device));
    s.device = nullptr;
    MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.device), std::max<std::size_t>(n, 1) * sizeof(float)));
    s.capacity = n;
  }
  // Copied on the compute stream that reads it, from a host copy kept until the next upload to this
  // slot (which waits for compute first): a plain cudaMemcpy from pageable memory may return before the
  // bytes landed, and it is not ordered with the non-blocking compute stream.
  s.host.assign(host, host + n);
  if (n) MT_CUDA_CHECK(cudaMemcpyAsync(s.device, s.host.data(), n * sizeof(float), cudaMemcpyHostToDevice, compute_));
  return s.device;
}

const token_t* CudaBackend::upload_tokens(const token_t* host_tokens, std::size_t n, int slot) {
  if (slot < 0 || slot > 5) throw std::invalid_argument("CUDA upload_tokens: slot must be 0..5");
  select_device();
  std::lock_guard<std::mutex> lock(token_mu_);
  TokenSlot& s = slots_[slot];
  // The compute actor uploads a micro-batch's ids before each of its operations: the same ids again
  // need no copy (and no synchronisation).
  if (s.device && n == s.host.size() && std::equal(s.host.begin(), s.host.end(), host_tokens)) return s.device;
  // The previous contents may still be read by queued compute work (a fill or copy never reads tokens,
  // and stage operations synchronise, but be exact): wait for compute before overwriting.
  MT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  if (n > s.capacity) {
    MT_CUDA_CHECK(cudaFree(s.device));
    s.device = nullptr;
    MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.device), std::max<std::size_t>(n, 1) * sizeof(token_t)));
    s.capacity = n;
  }
  s.host.assign(host_tokens, host_tokens + n);
  s.csr_ready = false;
  // On the compute stream that reads it; `s.host` stays until the next upload, which waits for compute.
  if (n) MT_CUDA_CHECK(cudaMemcpyAsync(s.device, s.host.data(), n * sizeof(token_t), cudaMemcpyHostToDevice, compute_));
  return s.device;
}

CudaBackend::TokenSlot& CudaBackend::slot_of(const token_t* device_tokens, const char* what) {
  for (auto& s : slots_)
    if (s.device == device_tokens && device_tokens) return s;
  throw std::invalid_argument(std::string("CUDA ") + what +
                              ": the token pointer is not one upload_tokens returned (device token ids are needed)");
}

// Counting sort of the positions by token id: for each distinct token, its rows in ascending order.
// The lists are copied on the compute stream (the embedding's backward, next on it, reads them) from
// host vectors the slot keeps until it is rebuilt, after compute drained.
void CudaBackend::build_token_rows(TokenSlot& s) {
  if (s.csr_ready) return;
  MT_CUDA_CHECK(cudaStreamSynchronize(compute_));  // queued work may still read the old lists
  const std::size_t n = s.host.size();
  std::vector<std::int32_t>& order = s.host_rows;
  order.resize(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return s.host[a] < s.host[b]; });
  s.host_unique.clear(), s.host_offsets.clear();
  for (std::size_t k = 0; k < n; ++k)
    if (k == 0 || s.host[order[k]] != s.host[order[k - 1]]) {
      s.host_unique.push_back(s.host[order[k]]);
      s.host_offsets.push_back(static_cast<std::int32_t>(k));
    }
  s.host_offsets.push_back(static_cast<std::int32_t>(n));
  MT_CUDA_CHECK(cudaFree(s.unique));
  MT_CUDA_CHECK(cudaFree(s.offsets));
  MT_CUDA_CHECK(cudaFree(s.rows));
  s.unique = s.offsets = s.rows = nullptr;
  const std::size_t cap = std::max<std::size_t>(n, 1) + 1;
  MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.unique), cap * sizeof(std::int32_t)));
  MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.offsets), cap * sizeof(std::int32_t)));
  MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.rows), cap * sizeof(std::int32_t)));
  const auto up = [this](std::int32_t* dst, const std::vector<std::int32_t>& src) {
    if (!src.empty())
      MT_CUDA_CHECK(
          cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, compute_));
  };
  up(s.unique, s.host_unique);
  up(s.offsets, s.host_offsets);
  up(s.rows, order);
  s.n_unique = static_cast<std::int64_t>(s.host_unique.size());
  s.csr_ready = true;
}

// ---------------- the stage operations ----------------
Ops& CudaBackend::ops() {
  select_device();
  return *ops_;
}

void CudaBackend::check_ids(const ModelConfig& c, const token_t* device_tokens, std::int64_t n, bool targets,
                            const char* what) {
  std::lock_guard<std::mutex> lock(token_mu_);
  TokenSlot& s = slot_of(device_tokens, what);
  if (static_cast<std::int64_t>(s.host.size()) < n)
    throw std::invalid_argument(std::string("CUDA ") + what + ": fewer uploaded ids than batch x seq");
  if (targets)
    validate_targets(c, s.host.data(), static_cast<std::size_t>(n));
  else
    validate_tokens(c, s.host.data(), static_cast<std::size_t>(n));
}

TokenRows CudaBackend::token_rows(const token_t* device_tokens, std::int64_t n) {
  std::lock_guard<std::mutex> lock(token_mu_);
  TokenSlot& s = slot_of(device_tokens, "embedding_backward");
  if (static_cast<std::int64_t>(s.host.size()) != n)
    throw std::invalid_argument("CUDA embedding_backward: the uploaded tokens are not batch x seq ids");
  build_token_rows(s);
  return {s.unique, s.offsets, s.rows, s.n_unique};
}

}  // namespace mt::cuda
