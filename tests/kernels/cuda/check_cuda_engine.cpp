// Whole training runs through the streaming engine (actors, as `megatrain train` runs them) with
// device.backend = cuda against device.backend = cpu on the same config and batches, and two CUDA runs
// against each other. Needs a GPU; exit 77 without.
//   - per-step losses: CUDA within 1e-4 (fp32) / 2e-2 (bf16) of the CPU's, relative;
//   - final parameters: within 1e-3 (fp32) / 5e-2 (bf16) norm-wise after a few AdamW steps (Adam's
//     normalised update amplifies tiny gradient differences on near-zero gradients);
//   - determinism: two CUDA runs leave bit-identical tiles (params, moments, compute copies).
#include <cstdio>
#include <vector>

#include "tests/actors/engine_fixture.hpp"
#include "tests/kernels/cuda/cuda_check_util.hpp"

using namespace mt;
using namespace mt::actors::test;
using namespace mt::cuda::check;

namespace {

void check_run(Verdicts& v, const char* name, Tiny t) {
  t.steps = 4;
  TrainConfig cfg = tiny_config(t);
  const ModelConfig model = cfg.model_config_from_keys();
  const auto batches = tiny_batches(t, 8);
  const bool bf = t.bf16;
  const std::string tag = std::string(name) + (bf ? " bf16" : " fp32") + " keep=" + t.keep + ": ";
  cfg.device.backend = "cpu";
  EngineRun cpu = run_pipeline(cfg, model, batches);
  cfg.device.backend = "cuda";
  EngineRun gpu1 = run_pipeline(cfg, model, batches);
  EngineRun gpu2 = run_pipeline(cfg, model, batches);
  for (const EngineRun* r : {&cpu, &gpu1, &gpu2})
    if (!r->result.error.empty()) {
      v.fact(tag + "engine error: " + r->result.error, false);
      return;
    }
  v.fact(tag + "all runs made " + std::to_string(t.steps) + " steps",
         cpu.result.steps.size() == static_cast<std::size_t>(t.steps) &&
             gpu1.result.steps.size() == cpu.result.steps.size() &&
             gpu2.result.steps.size() == cpu.result.steps.size());
  for (std::size_t s = 0; s < std::min(cpu.result.steps.size(), gpu1.result.steps.size()); ++s)
    v.scalar(tag + "step " + std::to_string(s + 1) + " loss", gpu1.result.steps[s].loss, cpu.result.steps[s].loss,
             bf ? 2e-2 : 1e-4);
  for (std::int64_t s = 0; s < cpu.host->num_stages(); ++s) {
    const std::size_t n = cpu.host->tile(s).floats();
    const std::vector<float> a(gpu1.host->tile(s).params(), gpu1.host->tile(s).params() + n);
    const std::vector<float> b(cpu.host->tile(s).params(), cpu.host->tile(s).params() + n);
    v.close(tag + "stage " + std::to_string(s) + " params after training", a, b, bf ? 5e-2 : 1e-3);
  }
  v.fact(tag + "two CUDA runs: bit-identical tiles (params, moments, compute copies)",
         tiles_equal(*gpu1.host, *gpu2.host));
  const LinkStats ls = gpu1.result.link;
  std::printf("%slink %llu copies / %llu bytes up, %llu copies down\n", tag.c_str(),
              static_cast<unsigned long long>(ls.of(LinkDirection::host_to_device).copies),
              static_cast<unsigned long long>(ls.of(LinkDirection::host_to_device).bytes),
              static_cast<unsigned long long>(ls.of(LinkDirection::device_to_host).copies));
}

}  // namespace

int main() {
  require_gpu("check_cuda_engine");
  Verdicts v;
  try {
    Tiny llama;
    check_run(v, "llama", llama);
    Tiny llama_keep = llama;
    llama_keep.keep = "all";
    llama_keep.micro_batches = 2;
    check_run(v, "llama 2 micro-batches", llama_keep);
    Tiny llama_bf16 = llama;
    llama_bf16.bf16 = true;
    check_run(v, "llama", llama_bf16);
    Tiny gpt2;
    gpt2.arch = Arch::gpt2;
    check_run(v, "gpt2", gpt2);
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    v.failed++;
  }
  return v.finish("check_cuda_engine");
}
