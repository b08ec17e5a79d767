// tools/bench/run offload [--dir DIR] [--gib N] [--steps N] [--io-threads N] [--chunk-kib N] [--io-only 1]:
// the NVMe tier for the Adam moments (--io-only 1: part 1 alone; --io-threads / --chunk-kib: the tier's).
//   1. Tier throughput: a StagedMomentStore (fp32 moments in files, O_DIRECT, the engine's defaults: 1 MiB
//      chunks, 4 I/O threads, 4 staging stages) over N GiB of stages, written (update + write-behind)
//      and read back in the optimizer's order (read-ahead), best of 3 rounds each, against fio's
//      sequential O_DIRECT rates on a file of the same size measured in the same run: with the tier's
//      block size and queue depth (io_uring iodepth 4, and psync 4 jobs: the two I/O mechanisms), and
//      the best fio finds over block sizes and depths. offload_read_bandwidth /
//      offload_write_bandwidth: ceiling = the best fio rate.
//   2. Step-time cost: the demo model's step with the moments in the tiles, on the tier (fp32,
//      lossless) and compressed in RAM (lossless, int8), same run (offload_step_time: ceiling = RAM).
//   3. Lossless on real moments: the demo model's moments after those steps, encoded and decoded by
//      the lossless codec: ratio (encoded / raw) and throughput.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/engine.hpp"
#include "storage/offload/staged_moment_store.hpp"
#include "tools/bench/bench_report.hpp"
#include "tools/bench/demo_model.hpp"
#include "tools/bench/gemm_ceiling.hpp"

using namespace mt;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct TierRates {
  double write_bps = 0, read_bps = 0;
};

// One store of `stages` stages of `floats` each; every round: a pass of updates (write-behind), then,
// with every slot dropped, a pass of reads in the same order (read-ahead).
TierRates measure_tier(const std::string& dir, std::size_t stages, std::size_t floats, int rounds,
                       const offload::StagedMomentStoreOptions& options) {
  offload::StagedMomentStoreOptions o = options;
  o.dir = dir;
  offload::StagedMomentStore store(std::vector<std::size_t>(stages, floats), o);
  std::printf("  tier: %s\n", store.describe().c_str());
  TierRates best;
  for (int r = 0; r < rounds; ++r) {
    auto s0 = store.stats();
    auto t0 = Clock::now();
    for (std::size_t s = 0; s < stages; ++s) {
      MomentLease l(store, static_cast<std::int64_t>(s), MomentLease::Use::overwrite);  // no read first
      l.m()[0] = static_cast<float>(r);
    }
    store.flush();
    const double tw = since(t0);
    auto s1 = store.stats();
    store.evict_all();
    t0 = Clock::now();
    for (std::size_t s = 0; s < stages; ++s) MomentLease l(store, static_cast<std::int64_t>(s));
    const double tr = since(t0);
    auto s2 = store.stats();
    const double w = static_cast<double>(s1.file_bytes_written - s0.file_bytes_written) / tw;
    const double rd = static_cast<double>(s2.file_bytes_read - s1.file_bytes_read) / tr;
    std::printf(
        "  round %d: write %.0f MB/s (%.2f s; the two workers busy %.2f s), read %.0f MB/s (acquire waited %.2f s of "
        "%.2f s)\n",
        r + 1, w / 1e6, tw, s1.store_s - s0.store_s, rd / 1e6, s2.acquire_wait_s - s1.acquire_wait_s, tr);
    best.write_bps = std::max(best.write_bps, w);
    best.read_bps = std::max(best.read_bps, rd);
  }
  return best;
}

// fio's sequential O_DIRECT rate (bytes/s) on `file` of `bytes`: rw = read | write.
double fio_rate(const std::string& file, std::size_t bytes, const std::string& rw, const std::string& engine,
                int depth_or_jobs, const std::string& bs) {
  const bool psync = engine == "psync";
  const std::string cmd = "fio --name=t --filename=" + file + " --size=" + std::to_string(bytes) + " --rw=" + rw +
                          " --bs=" + bs + " --direct=1 --ioengine=" + engine +
                          (psync ? " --numjobs=" + std::to_string(depth_or_jobs) + " --offset_increment=" +
                                       std::to_string(bytes / static_cast<std::size_t>(depth_or_jobs)) +
                                       " --size=" + std::to_string(bytes / static_cast<std::size_t>(depth_or_jobs))
                                 : " --iodepth=" + std::to_string(depth_or_jobs)) +
                          " --group_reporting --output-format=json 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return 0;
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  if (::pclose(p) != 0) return 0;
  try {
    const auto j = nlohmann::json::parse(out.substr(out.find('{')));
    return j["jobs"][0][rw == "write" ? "write" : "read"]["bw_bytes"].get<double>();
  } catch (const std::exception&) {
    return 0;
  }
}

struct StepRun {
  double step_s = 0;
  std::string where;
  offload::MomentStoreStats stats;
  std::vector<std::vector<float>> m, v;  // final moments (lossless figures)
};

StepRun demo_steps(const std::string& offload_dir, const std::string& compression, int steps, bool keep_moments) {
  TrainConfig cfg = bench::demo_train_config(steps);
  cfg.train.offload_dir = offload_dir;
  cfg.train.optimizer_compression = compression;
  const ModelConfig model = cfg.model_config_from_keys();
  HostModel host(model, plan::host_tile_options(cfg), nullptr, actors::moment_store_for(cfg, model));
  actors::init_host_model(host, 1337);
  const auto batches = bench::random_batches(cfg, 8, 2024);
  actors::VectorBatchSource source(batches);
  actors::EngineJob job;
  job.cfg = cfg;
  job.model = model;
  job.data = &source;
  job.host = &host;
  const actors::EngineResult r = actors::run_engine(std::move(job));
  if (!r.error.empty()) throw std::runtime_error("offload bench: " + r.error);
  StepRun out;
  out.where = host.moments().describe();
  const std::size_t first = 2;  // warm-up: the first steps fill the staging slots and the page cache
  for (std::size_t s = first; s < r.steps.size(); ++s) out.step_s += r.steps[s].step_s;
  out.step_s /= static_cast<double>(r.steps.size() - first);
  if (auto* st = dynamic_cast<offload::StagedMomentStore*>(&host.moments())) out.stats = st->stats();
  if (keep_moments)
    for (std::int64_t s = 0; s < host.num_stages(); ++s) {
      MomentLease l(host.moments(), s);
      const std::size_t n = host.tile(s).floats();
      out.m.emplace_back(l.m(), l.m() + n);
      out.v.emplace_back(l.v(), l.v() + n);
    }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "offload-bench-tmp";
  double gib = 1.0;
  int steps = 10;
  bool io_only = false;
  offload::StagedMomentStoreOptions tier_options;  // the engine's defaults unless given
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--dir")
      dir = argv[i + 1];
    else if (k == "--io-threads")
      tier_options.io_threads = std::atoi(argv[i + 1]);
    else if (k == "--chunk-kib")
      tier_options.io_chunk_bytes = static_cast<std::size_t>(std::atoll(argv[i + 1])) << 10;
    else if (k == "--io-only")
      io_only = std::atoi(argv[i + 1]) != 0;
    else if (k == "--gib")
      gib = std::atof(argv[i + 1]);
    else if (k == "--steps")
      steps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "usage: offload [--dir DIR] [--gib N] [--steps N] [--io-threads N] [--chunk-kib N] [--io-only 1]\n");
      return 2;
    }
  }
  std::printf("offload: %s\n  ISA: %s\n  dir: %s (%.1f GiB of stages)\n", bench::cpu_model().c_str(),
              bench::cpu_isa_flags().c_str(), dir.c_str(), gib);
  fs::create_directories(dir);
  bench::Report report("offload");

  // 1. Throughput against fio.
  const std::size_t stage_floats = std::size_t{16} << 20;  // 64 MiB of m + 64 MiB of v per stage
  const std::size_t stages = std::max<std::size_t>(3, static_cast<std::size_t>(gib * (1 << 30) / (8.0 * stage_floats)));
  const std::size_t bytes = stages * stage_floats * 8;
  const TierRates tier = measure_tier(dir, stages, stage_floats, 3, tier_options);
  const std::string file = dir + "/fio.dat";
  double fio_w_same = 0, fio_r_same = 0, fio_w_threads = 0, fio_r_threads = 0, fio_w_best = 0, fio_r_best = 0;
  std::string best_w, best_r;
  for (int round = 0; round < 2; ++round) {
    fio_w_same = std::max(fio_w_same, fio_rate(file, bytes, "write", "io_uring", 4, "1M"));
    fio_r_same = std::max(fio_r_same, fio_rate(file, bytes, "read", "io_uring", 4, "1M"));
    fio_w_threads = std::max(fio_w_threads, fio_rate(file, bytes, "write", "psync", 4, "1M"));
    fio_r_threads = std::max(fio_r_threads, fio_rate(file, bytes, "read", "psync", 4, "1M"));
  }
  fio_w_best = std::max(fio_w_same, fio_w_threads);
  fio_r_best = std::max(fio_r_same, fio_r_threads);
  best_w = best_r = "1M, depth 4";
  for (const char* bs : {"1M", "4M"})
    for (int depth : {1, 16, 32}) {
      const double w = fio_rate(file, bytes, "write", "io_uring", depth, bs);
      const double r = fio_rate(file, bytes, "read", "io_uring", depth, bs);
      if (w > fio_w_best) fio_w_best = w, best_w = std::string(bs) + ", depth " + std::to_string(depth);
      if (r > fio_r_best) fio_r_best = r, best_r = std::string(bs) + ", depth " + std::to_string(depth);
    }
  fs::remove(file);
  std::printf(
      "  fio O_DIRECT sequential, 1 MiB blocks, 4 in flight: io_uring write %.0f read %.0f MB/s; psync 4 "
      "threads write %.0f read %.0f MB/s\n",
      fio_w_same / 1e6, fio_r_same / 1e6, fio_w_threads / 1e6, fio_r_threads / 1e6);
  std::printf("  fio best: write %.0f MB/s (%s), read %.0f MB/s (%s)\n", fio_w_best / 1e6, best_w.c_str(),
              fio_r_best / 1e6, best_r.c_str());
  std::printf("  tier (thread pool): write %.0f MB/s = %.2f of fio's best, read %.0f MB/s = %.2f\n",
              tier.write_bps / 1e6, tier.write_bps / fio_w_best, tier.read_bps / 1e6, tier.read_bps / fio_r_best);
  report.add({"offload_write_bandwidth", tier.write_bps / 1e6, "MB/s", fio_w_best / 1e6, 0.85, "higher"});
  report.add({"offload_read_bandwidth", tier.read_bps / 1e6, "MB/s", fio_r_best / 1e6, 0.85, "higher"});
  report.add({"offload_fio_uring_vs_threads_read", fio_r_same / 1e6, "MB/s", fio_r_threads / 1e6});
  if (io_only) {
    std::error_code ec;
    fs::remove(dir, ec);
    report.print();
    return 0;
  }

  // 2. Step time: in the tiles, on the tier, compressed in RAM.
  std::printf("  demo model, %d steps each (mean step of steps 3..%d):\n", steps, steps);
  const StepRun ram = demo_steps("", "none", steps, true);
  std::printf("    %-70s %.3f s\n", ram.where.c_str(), ram.step_s);
  const StepRun disk = demo_steps(dir, "none", steps, false);
  std::printf("    %-70s %.3f s (tier: %.0f MB read, %.0f MB written, optimizer waited %.2f s)\n", disk.where.c_str(),
              disk.step_s, static_cast<double>(disk.stats.file_bytes_read) / 1e6,
              static_cast<double>(disk.stats.file_bytes_written) / 1e6, disk.stats.acquire_wait_s);
  const StepRun disk_z = demo_steps(dir, "lossless", steps, false);
  std::printf("    %-70s %.3f s\n", disk_z.where.c_str(), disk_z.step_s);
  const StepRun ram_z = demo_steps("", "lossless", steps, false);
  std::printf("    %-70s %.3f s\n", ram_z.where.c_str(), ram_z.step_s);
  const StepRun ram_q = demo_steps("", "int8", steps, false);
  std::printf("    %-70s %.3f s\n", ram_q.where.c_str(), ram_q.step_s);
  report.add({"offload_step_time", disk.step_s, "s", ram.step_s, 0, "lower"});
  report.add({"offload_lossless_step_time", disk_z.step_s, "s", ram.step_s, 0, "lower"});
  report.add({"int8_ram_step_time", ram_q.step_s, "s", ram.step_s, 0, "lower"});

  // 3. Lossless on the demo run's moments.
  std::size_t raw = 0, enc = 0;
  double te = 0, td = 0;
  for (std::size_t s = 0; s < ram.m.size(); ++s) {
    const std::size_t n = ram.m[s].size();
    std::vector<std::byte> buf(offload::encoded_bound(offload::MomentCodec::lossless, n));
    std::vector<float> m2(n), v2(n);
    std::size_t got = 0;
    te += bench::best_seconds(
        [&] {
          got =
              offload::encode_moments(offload::MomentCodec::lossless, ram.m[s].data(), ram.v[s].data(), n, buf.data());
        },
        3);
    td += bench::best_seconds(
        [&] { offload::decode_moments(offload::MomentCodec::lossless, buf.data(), got, n, m2.data(), v2.data()); }, 3);
    if (std::memcmp(m2.data(), ram.m[s].data(), n * 4) != 0 || std::memcmp(v2.data(), ram.v[s].data(), n * 4) != 0) {
      std::fprintf(stderr, "offload bench: lossless round trip differs (stage %zu)\n", s);
      return 1;
    }
    raw += 8 * n;
    enc += got;
  }
  std::printf(
      "  lossless on the demo run's moments (%.1f MB): ratio %.3f, encode %.0f MB/s, decode %.0f MB/s (one "
      "thread)\n",
      static_cast<double>(raw) / 1e6, static_cast<double>(enc) / static_cast<double>(raw),
      static_cast<double>(raw) / te / 1e6, static_cast<double>(raw) / td / 1e6);
  report.add({"lossless_ratio", static_cast<double>(enc) / static_cast<double>(raw), "encoded/raw", 0, 0, "lower"});
  report.add({"lossless_encode_throughput", static_cast<double>(raw) / te / 1e6, "MB/s", 0});
  report.add({"lossless_decode_throughput", static_cast<double>(raw) / td / 1e6, "MB/s", 0});
  std::error_code ec;
  fs::remove(dir, ec);  // only when empty: never a directory the user had filled
  report.print();
  return 0;
}
