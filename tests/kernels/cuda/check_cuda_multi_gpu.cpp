// device.gpus = 2 on the CUDA backend through the whole engine (actors, as `megatrain train` runs it):
// two GPUs with one micro-batch each against one GPU with two, on the same config and batches. The host
// accumulates 0 + (g0 + g1) where one device adds (0 + g0) + g1: the same fp32 sums, and every micro-batch
// runs the same deterministic kernels on the same GPU model, so losses and every tile (fp32 masters, Adam
// moments, bf16 compute copies) must be bit-identical. Needs 2 GPUs; exit 77 (skipped) with fewer.
#include <cstdio>

#include "tests/actors/engine_fixture.hpp"
#include "tests/kernels/cuda/cuda_check_util.hpp"

using namespace mt;
using namespace mt::actors::test;
using namespace mt::cuda::check;

namespace {

void check_two_gpus(Verdicts& v, const char* name, Tiny t) {
  t.steps = 4;
  const auto batches = tiny_batches(t, 16);
  const std::string tag = std::string(name) + (t.bf16 ? " bf16" : " fp32") + " keep=" + t.keep + ": ";
  Tiny one = t;
  one.micro_batches = 2 * t.micro_batches;
  TrainConfig single = tiny_config(one);
  TrainConfig multi = tiny_config(t);
  single.device.backend = multi.device.backend = "cuda";
  multi.device.gpus = 2;
  const ModelConfig model = single.model_config_from_keys();
  EngineRun a = run_pipeline(single, model, batches);
  EngineRun b = run_pipeline(multi, model, batches);
  for (const EngineRun* r : {&a, &b})
    if (!r->result.error.empty()) {
      v.fact(tag + "engine error: " + r->result.error, false);
      return;
    }
  v.fact(tag + "both runs made " + std::to_string(t.steps) + " steps",
         a.result.steps.size() == static_cast<std::size_t>(t.steps) && b.result.steps.size() == a.result.steps.size());
  bool same_losses = a.result.steps.size() == b.result.steps.size();
  for (std::size_t s = 0; same_losses && s < a.result.steps.size(); ++s)
    same_losses = a.result.steps[s].loss == b.result.steps[s].loss;
  v.fact(tag + "per-step losses: 2 GPUs x " + std::to_string(t.micro_batches) + " == 1 GPU x " +
             std::to_string(one.micro_batches) + ", bit for bit",
         same_losses);
  v.fact(tag + "tiles (masters, moments, compute copies) bit-identical", tiles_equal(*a.host, *b.host));
  v.fact(tag + "two device arenas used",
         b.result.device_arenas.size() == 2 && b.result.device_arenas[1].peak_bytes > 0);
  if (!a.result.steps.empty())
    std::printf("%sloss %.9g -> %.9g\n", tag.c_str(), a.result.steps.front().loss, a.result.steps.back().loss);
}

}  // namespace

int main() {
  require_gpu("check_cuda_multi_gpu");
  int count = 0;
  MT_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::printf("check_cuda_multi_gpu: %d GPU, device.gpus = 2 needs 2: skipped\n", count);
    return 77;
  }
  Verdicts v;
  try {
    Tiny llama;
    check_two_gpus(v, "llama", llama);
    Tiny llama_bf16 = llama;
    llama_bf16.bf16 = true;
    llama_bf16.keep = "all";
    check_two_gpus(v, "llama", llama_bf16);
    Tiny gpt2;
    gpt2.arch = Arch::gpt2;
    check_two_gpus(v, "gpt2", gpt2);
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    v.failed++;
  }
  return v.finish("check_cuda_multi_gpu");
}
