// The multi-GPU gradient reduction (device/cuda/nccl_reduce.hpp, CudaBackend::reduce_gradients) on
// 2..N GPUs of this machine against the host sum in device order, ((g0 + g1) + g2) + ..., bit for bit:
//   - NcclReducer alone, with a small chunk (many chunks, a short last one; one short chunk);
//   - through the Backend interface as the collector calls it: real-size chunks (two of them), the
//     other devices' buffers unchanged and rewritten at once on their compute queues, the sum read by a
//     device-to-host copy submitted afterwards, the caller's current device kept.
// Needs 2 GPUs; exit 77 (skipped) with fewer.
#include <cstdio>
#include <vector>

#include "device/backend.hpp"
#include "device/cuda/nccl_reduce.hpp"
#include "device/cuda/reduce_plan.hpp"
#include "tests/kernels/cuda/cuda_check_util.hpp"

using namespace mt;
using namespace mt::cuda::check;

namespace {

std::vector<float> host_sum(const std::vector<std::vector<float>>& g) {
  std::vector<float> s = g[0];
  for (std::size_t d = 1; d < g.size(); ++d)
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += g[d][i];
  return s;
}

std::vector<std::vector<float>> random_grads(int gpus, std::size_t floats, unsigned seed) {
  std::vector<std::vector<float>> g;
  for (int d = 0; d < gpus; ++d) g.push_back(test::randn(floats, seed + static_cast<unsigned>(d)));
  return g;
}

void check_reducer(Verdicts& v, int gpus, std::size_t floats, std::size_t chunk) {
  const std::string tag = "NcclReducer " + std::to_string(gpus) + " GPUs, " + std::to_string(floats) +
                          " floats, chunk " + std::to_string(chunk) + ": ";
  std::vector<int> ids;
  for (int d = 0; d < gpus; ++d) ids.push_back(d);
  cuda::NcclReducer red(ids, chunk);
  const auto host = random_grads(gpus, floats, 7);
  std::vector<std::unique_ptr<DevBuf<float>>> bufs;
  std::vector<float*> ptrs;
  for (int d = 0; d < gpus; ++d) {
    MT_CUDA_CHECK(cudaSetDevice(d));
    bufs.push_back(std::make_unique<DevBuf<float>>(host[d]));
    ptrs.push_back(bufs.back()->ptr);
  }
  red.reduce_to_first(ptrs, floats, std::vector<cudaEvent_t>(static_cast<std::size_t>(gpus), nullptr));
  for (int d = 0; d < gpus; ++d) {
    MT_CUDA_CHECK(cudaSetDevice(d));
    MT_CUDA_CHECK(cudaEventSynchronize(red.done(d)));
    const std::vector<float> got = bufs[d]->download();
    if (d == 0)
      v.bit_equal(tag + "GPU 0 holds the host sum in device order", got, host_sum(host));
    else
      v.bit_equal(tag + "GPU " + std::to_string(d) + " unchanged", got, host[d]);
  }
}

// As the collector calls it: every device a backend with an arena, the buffers written over the link.
void check_backend(Verdicts& v, int gpus) {
  const std::size_t floats = cuda::reduce_chunk_floats(gpus) + 4099;  // two chunks, the second short
  const std::string tag =
      "reduce_gradients on " + std::to_string(gpus) + " GPUs, " + std::to_string(floats) + " floats: ";
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> devices;
  std::vector<float*> grads;
  const auto host = random_grads(gpus, floats, 100);
  for (int d = 0; d < gpus; ++d) {
    BackendOptions o;
    o.kind = "cuda";
    o.device_index = d;
    o.devices = gpus;
    owned.push_back(make_backend(o));
    devices.push_back(owned.back().get());
    grads.push_back(reinterpret_cast<float*>(devices.back()->allocate_device(floats * sizeof(float))));
  }
  auto upload = [&] {
    for (int d = 0; d < gpus; ++d) {
      devices[d]->synchronize();  // queued device work on the buffer first
      devices[d]->copy_async(LinkDirection::host_to_device, host[d].data(), grads[d], floats * sizeof(float), nullptr);
      devices[d]->wait_link_idle();
    }
  };
  auto download = [&](int d, std::vector<float>& out) {
    out.assign(floats, 0.0f);
    devices[d]->copy_async(LinkDirection::device_to_host, grads[d], out.data(), floats * sizeof(float), nullptr);
  };
  upload();
  MT_CUDA_CHECK(cudaSetDevice(gpus - 1));
  devices[0]->reduce_gradients(devices, grads, floats);
  int current = -1;
  MT_CUDA_CHECK(cudaGetDevice(&current));
  v.fact(tag + "the caller's current device is kept", current == gpus - 1);
  // The other buffers are rewritten at once on their compute queues: the sends must have read them first.
  for (int d = 1; d < gpus; ++d) devices[d]->fill_zero(grads[d], floats * sizeof(float));
  std::vector<float> sum;
  download(0, sum);
  devices[0]->wait_link_idle();
  v.bit_equal(tag + "device 0 holds the host sum in device order (others zeroed right after)", sum, host_sum(host));
  // A second call reuses the communicator and the scratch; the other buffers are left as they were.
  upload();
  devices[0]->reduce_gradients(devices, grads, floats);
  std::vector<std::vector<float>> got(static_cast<std::size_t>(gpus));
  for (int d = 0; d < gpus; ++d) download(d, got[d]);
  for (Backend* b : devices) b->wait_link_idle();
  v.bit_equal(tag + "second call: device 0 holds the host sum again", got[0], host_sum(host));
  for (int d = 1; d < gpus; ++d)
    v.bit_equal(tag + "device " + std::to_string(d) + "'s buffer unchanged", got[d], host[d]);
}

}  // namespace

int main() {
  require_gpu("check_cuda_nccl");
  int count = 0;
  MT_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::printf("check_cuda_nccl: %d GPU, the reduction needs 2: skipped\n", count);
    return 77;
  }
  Verdicts v;
  try {
    for (int gpus = 2; gpus <= count; ++gpus) {
      check_reducer(v, gpus, 12345, 1000);
      check_reducer(v, gpus, 999, 1000);
      check_backend(v, gpus);
    }
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    v.failed++;
  }
  return v.finish("check_cuda_nccl");
}
