#include "device/backend.hpp"

#include <exception>

#include "device/cpu/cpu_backend.hpp"
#include "kernels/stages.hpp"
#if MEGATRAIN_HAVE_CUDA
#include "device/cuda/cuda_backend.hpp"
#include "device/cuda/device_probe.hpp"
#endif

namespace mt {

int gpu_of(const BackendOptions& options, int visible) {
  if (options.host_rank < 0) return options.device_index;
  return visible > 0 ? options.host_rank % visible : 0;
}

std::string gpu_choice(const BackendOptions& options, int visible) {
  std::string gpu = "GPU " + std::to_string(gpu_of(options, visible));
  if (options.host_rank < 0) return gpu;
  return gpu + " (rank " + std::to_string(options.host_rank) + " of the job's " + std::to_string(options.host_ranks) +
         " ranks on this host, modulo the " + std::to_string(visible) + " GPU(s) visible to it)";
}

void check_backend_available(const BackendOptions& options) {
  if (options.devices < 1)
    throw BackendUnavailable("must be >= 1, got " + std::to_string(options.devices), "device.gpus");
  if (options.kind == "cpu") return;
  if (options.kind != "cuda") throw BackendUnavailable("'" + options.kind + "' is not one of: cpu, cuda");
#if MEGATRAIN_HAVE_CUDA
  const cuda::DeviceProbe probe = cuda::probe_devices();
  if (probe.count == 0)
    throw BackendUnavailable("cuda needs a usable GPU and this machine has none (" + probe.reason +
                             "); use device.backend=cpu");
  if (const int gpu = gpu_of(options, probe.count); gpu < 0 || gpu >= probe.count)
    throw BackendUnavailable("cuda: GPU " + std::to_string(gpu) + " does not exist (" + std::to_string(probe.count) +
                             " found)");
#if !MEGATRAIN_HAVE_NCCL
  if (options.devices > 1)
    throw BackendUnavailable(std::to_string(options.devices) +
                                 " GPUs need NCCL for the gradient reduction, and this build has none (configured "
                                 "without it); use device.gpus = 1",
                             "device.gpus");
#endif
  if (options.devices > probe.count)
    throw BackendUnavailable(std::to_string(options.devices) + " GPUs asked for, and this machine has " +
                                 std::to_string(probe.count) + " (" + probe.reason + ")",
                             "device.gpus");
#else
  throw BackendUnavailable(
      "cuda: this build has no CUDA backend (nvcc was not found when it was configured, or "
      "-DMEGATRAIN_CUDA=OFF); rebuild with the CUDA toolkit or use device.backend=cpu");
#endif
}

void Backend::accumulate_to_host(const float*, float*, std::size_t, bool, int) {
  throw std::logic_error(std::string("the ") + name() +
                         " backend does not share host memory: gradients reach the host over its link");
}

void Backend::reduce_gradients(const std::vector<Backend*>&, const std::vector<float*>&, std::size_t) {
  throw std::logic_error(std::string("the ") + name() +
                         " backend has no cross-device gradient reduction: device.gpus must be 1 with it");
}

// A stage operation's begin and end; on an exception, abandon_stage (its queued work finishes first).
class Backend::StageScope {
 public:
  StageScope(Backend& b, const char* stage) : b_(b) { b_.begin_stage(stage); }
  ~StageScope() {
    if (std::uncaught_exceptions() > exceptions_) b_.abandon_stage();
  }
  StageScope(const StageScope&) = delete;
  StageScope& operator=(const StageScope&) = delete;
  void end() { b_.end_stage(); }

 private:
  Backend& b_;
  int exceptions_ = std::uncaught_exceptions();
};

namespace {
[[noreturn]] void no_rank_transport(const char* backend) {
  throw std::logic_error(std::string("the ") + backend +
                         " backend moves no gradients between the ranks' devices: its ranks send host copies over MPI");
}
}  // namespace

RankLinkId Backend::new_rank_link_id() { no_rank_transport(name()); }

std::unique_ptr<GradTransport> Backend::make_rank_transport(const RankLinkId&, int, int, double) {
  no_rank_transport(name());
}

void Backend::embedding_forward(const ModelConfig& c, const void* weights, const token_t* tokens, const BatchRows& rows,
                                float* x_out) {
  StageScope scope(*this, __func__);
  c.validate();
  validate_batch_shape(c, rows.batch, rows.seq);
  check_ids(c, tokens, rows.batch * rows.seq, false, "embedding_forward");
  mt::embedding_forward(ops(), c, weights, tokens, rows, x_out);
  scope.end();
}

void Backend::embedding_backward(const ModelConfig& c, const token_t* tokens, const BatchRows& rows, const float* dx,
                                 float* grads) {
  StageScope scope(*this, __func__);
  c.validate();
  validate_batch_shape(c, rows.batch, rows.seq);
  check_ids(c, tokens, rows.batch * rows.seq, false, "embedding_backward");
  mt::embedding_backward(ops(), c, tokens, rows, dx, grads);
  scope.end();
}

void Backend::layer_forward(const ModelConfig& c, const void* weights, const BatchRows& rows, const LayerBuffers& b) {
  StageScope scope(*this, __func__);
  mt::layer_forward(ops(), c, weights, rows, b, seq_tile_);
  scope.end();
}

void Backend::layer_backward(const ModelConfig& c, const void* weights, const BatchRows& rows, const LayerBuffers& b) {
  StageScope scope(*this, __func__);
  mt::layer_backward(ops(), c, weights, rows, b, seq_tile_);
  scope.end();
}

LossSum Backend::head_forward_backward(const ModelConfig& c, const void* head_weights, const void* embed_weights,
                                       const BatchRows& rows, const HeadBuffers& b) {
  StageScope scope(*this, __func__);
  c.validate();
  validate_batch_shape(c, rows.batch, rows.seq);
  if (!b.targets) throw std::invalid_argument("head: x_in, targets and workspace must be non-null");
  check_ids(c, b.targets, rows.batch * rows.seq, true, "head_forward_backward");
  const LossSum loss =
      mt::head_forward_backward(ops(), c, head_weights, embed_weights, rows, b, head_chunk_, seq_tile_);
  scope.end();
  return loss;
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  check_backend_available(options);
#if MEGATRAIN_HAVE_CUDA
  if (options.kind == "cuda") return cuda::make_cuda_backend(options);
#endif
  return std::make_unique<CpuBackend>(options);
}

}  // namespace mt
