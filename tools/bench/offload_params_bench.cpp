// tools/bench/run offload-params [--dir DIR] [--hidden N] [--intermediate N] [--layers N] [--heads N]
//                                [--vocab N] [--seq N] [--steps N] [--staging N]
// Beyond RAM: a Llama-shaped model (default d=2560, 24 layers, intermediate 6912, vocabulary 32000:
// 2.07B parameters) trains `steps` steps (default 5) with train.offload_params: fp32 masters and fp32
// Adam moments in files under DIR (O_DIRECT), the bf16 compute copy and the fp32 gradients in RAM
// (6 bytes per parameter) plus the staging slots. Prints the parameter count (offload_params), the
// peak resident memory of the process (VmHWM: offload_peak_rss_gib, target <= 20 GiB), the bytes each
// tier holds by the engine's own accounting, and the step times. DIR's files are removed at the end.
// Mind the disk: the files take 12 bytes per parameter (25 GB at the default size).
#include <sys/statvfs.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "actors/engine.hpp"
#include "plan/hardware.hpp"
#include "storage/offload/staged_moment_store.hpp"
#include "tools/bench/bench_report.hpp"
#include "tools/bench/demo_model.hpp"
#include "tools/bench/gemm_ceiling.hpp"

using namespace mt;
namespace fs = std::filesystem;

namespace {

double gib(double bytes) { return bytes / double(1u << 30); }

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "offload-params-bench-tmp";
  TrainConfig cfg = bench::demo_train_config(5);
  cfg.model.hidden_size = 2560;
  cfg.model.intermediate_size = 6912;
  cfg.model.layers = 24;
  cfg.model.heads = 20;
  cfg.model.kv_heads = 20;
  cfg.model.vocab_size = 32000;
  cfg.model.max_position_embeddings = 2048;
  cfg.train.per_device_train_batch_size = 1;
  cfg.data.seq_length = 64;
  cfg.train.offload_staging_stages = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::int64_t v = std::atoll(argv[i + 1]);
    if (k == "--dir")
      dir = argv[i + 1];
    else if (k == "--hidden")
      cfg.model.hidden_size = v;
    else if (k == "--intermediate")
      cfg.model.intermediate_size = v;
    else if (k == "--layers")
      cfg.model.layers = v;
    else if (k == "--heads")
      cfg.model.heads = cfg.model.kv_heads = v;
    else if (k == "--vocab")
      cfg.model.vocab_size = v;
    else if (k == "--seq")
      cfg.data.seq_length = v;
    else if (k == "--steps")
      cfg.train.max_steps = v;
    else if (k == "--staging")
      cfg.train.offload_staging_stages = v;
    else {
      std::fprintf(stderr,
                   "usage: offload-params [--dir DIR] [--hidden N] [--intermediate N] [--layers N] [--heads N] "
                   "[--vocab N] [--seq N] [--steps N] [--staging N]\n");
      return 2;
    }
  }
  cfg.train.bf16 = true;
  cfg.train.offload_params = true;
  cfg.train.offload_dir = dir;
  cfg.device.max_vram_gb = 4;
  try {
    const ModelConfig model = cfg.model_config_from_keys();
    std::int64_t params = 0;
    for (std::int64_t s = 0; s < num_stages(model); ++s) params += stage_layout(model, s).total_floats;
    std::printf("offload-params: %s\n  ISA: %s\n", bench::cpu_model().c_str(), bench::cpu_isa_flags().c_str());
    std::printf("  model: Llama d=%lld, %lld layers, intermediate %lld, vocabulary %lld: %.3fB parameters (padded)\n",
                static_cast<long long>(cfg.model.hidden_size), static_cast<long long>(cfg.model.layers),
                static_cast<long long>(cfg.model.intermediate_size), static_cast<long long>(cfg.model.vocab_size),
                static_cast<double>(params) / 1e9);
    fs::create_directories(dir);
    struct statvfs vfs {};
    if (::statvfs(dir.c_str(), &vfs) == 0)
      std::printf("  %s: %.1f GiB free, the tier needs %.1f GiB\n", dir.c_str(),
                  gib(static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize)),
                  gib(12.0 * static_cast<double>(params)));
    const auto t0 = std::chrono::steady_clock::now();
    HostModel host(model, plan::host_tile_options(cfg), nullptr, actors::moment_store_for(cfg, model));
    std::printf("  %s\n  RAM: tiles %.2f GiB (bf16 copy + fp32 grad), staging %.2f GiB; NVMe: %.2f GiB\n",
                host.moments().describe().c_str(),
                gib(static_cast<double>(host_model_bytes(model, plan::host_tile_options(cfg)))),
                gib(static_cast<double>(host.moments().ram_bytes())),
                gib(static_cast<double>(host.moments().disk_bytes())));
    actors::init_host_model(host, 1337);
    host.moments().flush();
    const double init_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  initialised (masters written to the tier) in %.1f s\n", init_s);
    std::fflush(stdout);
    const auto batches = bench::random_batches(cfg, 8, 2024);
    actors::VectorBatchSource source(batches);
    actors::EngineJob job;
    job.cfg = cfg;
    job.model = model;
    job.data = &source;
    job.host = &host;
    const actors::EngineResult r = actors::run_engine(std::move(job));
    if (!r.error.empty()) throw std::runtime_error(r.error);
    for (const auto& s : r.steps)
      std::printf("  step %lld: loss %.4f, %.1f s\n", static_cast<long long>(s.step), s.loss, s.step_s);
    const auto& st = dynamic_cast<offload::StagedMomentStore&>(host.moments()).stats();
    std::printf("  tier: %.1f GB read, %.1f GB written; the optimizer waited %.1f s for it\n",
                static_cast<double>(st.file_bytes_read) / 1e9, static_cast<double>(st.file_bytes_written) / 1e9,
                st.acquire_wait_s);
    const double peak = plan::process_status_bytes("VmHWM");
    std::printf("  peak resident memory (VmHWM) %.2f GiB\n", gib(peak));
    bench::Report report("offload_params");
    report.add({"offload_params", static_cast<double>(params), "parameters", 0, 2e9, "higher"});
    report.add({"offload_peak_rss_gib", gib(peak), "GiB", 0, 20.0, "lower"});
    double mean = 0;
    for (const auto& s : r.steps) mean += s.step_s;
    report.add({"offload_params_step_time", mean / static_cast<double>(r.steps.size()), "s", 0, 0, "lower"});
    report.print();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "offload-params bench: %s\n", e.what());
    std::error_code ec;
    fs::remove(dir, ec);
    return 1;
  }
  std::error_code ec;
  fs::remove(dir, ec);  // the store removed its own files; the directory only when empty
  return 0;
}
