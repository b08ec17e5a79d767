// A job of several ranks on this machine (cluster/, issue 27), side by side in one run: the demo model
// (config/demo.ini's shapes, on a token shard this benchmark writes) trained by `megatrain train`
// under mpirun, each rank with one thread, against one rank with one thread:
//   1 rank x 1 thread                 the reference step and peak resident memory;
//   1 rank x 2 micro-batches          the 2-rank job's tokens in one process, on 1 thread and on 2;
//   2 ranks x 1 thread, unsharded     every rank holds the whole host state;
//   2 ranks x 1 thread, sharded       cluster.shard_state: each rank its own stages' state;
//   3 ranks, unsharded and sharded    (more ranks than cores: memory only, their steps are not figures).
// Figures: cluster_step_2x1 (the 2-rank step against the 1-rank step: each rank does the 1-rank
// step's work, plus the reduction); cluster_reduction_hidden_fraction (rank 0's reduction, the part
// not after the step's last gradient, as the node reports it; target >= 0.8); cluster_bytes_per_step
// (what rank 0 sends a step against 2(N-1)/N of the model's fp32 gradient); cluster_rank_rss_sharded_N
// (the largest rank's peak RSS against one rank's less the tiles it does not hold: the unsharded part
// plus 1/N of the sharded state; target within 10%); the planner's host RAM per rank for a 120B
// Llama on 4 ranks of one H200 and 512 GB each, the moments in the tiles (_rank_tiles) and on each
// rank's NVMe tier with the masters (_rank_ram_tier).
// Usage: bench_cluster [steps=12]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_report.hpp"
#include "tools/bench/gemm_ceiling.hpp"
#include "tools/bench/token_shard.hpp"

namespace fs = std::filesystem;

namespace {

const std::string kBinary = MEGATRAIN_BINARY;
const std::string kMpiexec = MEGATRAIN_MPIEXEC;
const std::string kSource = MEGATRAIN_SOURCE_DIR;

struct Run {
  std::string out;                 // the job's stdout and stderr
  double step_s = 0;               // median step time (steps 3..)
  double peak_rss = 0;             // bytes: the one rank's (wait4) or the largest rank's (the node's line)
  std::vector<double> rank_rss;    // bytes per rank (several ranks)
  std::vector<double> rank_tiles;  // host tile bytes per rank (several ranks)
  double whole_tiles = 0;          // one rank's tiles unsharded (several ranks)
  double hidden = -1, bytes_ratio = -1;
};

// The number after `tag` in `text` (or -1).
double after(const std::string& text, const std::string& tag) {
  const std::size_t at = text.find(tag);
  return at == std::string::npos ? -1.0 : std::atof(text.c_str() + at + tag.size());
}

Run train(int ranks, bool sharded, const fs::path& shard, const fs::path& dir, int steps, int accumulation = 1,
          int threads = 1) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path log = dir / "job.log";
  const std::string args = " train --config-file=" + kSource + "/config/demo.ini --data.train_files=" + shard.string() +
                           " '--data.validation_files=\"\"' '--data.tokenizer_file=\"\"'" +
                           " --train.max_steps=" + std::to_string(steps) +
                           " --threads.total=" + std::to_string(threads) +
                           " --train.gradient_accumulation_steps=" + std::to_string(accumulation) +
                           " --monitor.enabled=false --train.save_steps=0"
                           " --train.output_dir=" +
                           (dir / "out").string() + (sharded ? " --cluster.shard_state=true" : "");
  const std::string launch =
      ranks > 1 ? kMpiexec + " --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none -np " +
                      std::to_string(ranks) + " "
                : "";
  const std::string cmd = launch + kBinary + args + " > " + log.string() + " 2>&1";
  std::fflush(stdout);
  const pid_t child = fork();
  if (child == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  wait4(child, &status, 0, &usage);
  Run r;
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.out = ss.str();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("cluster benchmark: `" + cmd + "` failed:\n" + r.out);
  std::vector<double> times;
  std::ifstream rows(dir / "out" / "train.jsonl");
  for (std::string row; std::getline(rows, row);) {
    const auto j = nlohmann::json::parse(row);
    if (j.contains("step_s") && j.value("step", 0) > 2) times.push_back(j["step_s"].get<double>());
  }
  r.step_s = mt::bench::median(times);
  if (ranks == 1) {
    r.peak_rss = static_cast<double>(usage.ru_maxrss) * 1024;  // the shell exec'd the node: its own
    return r;
  }
  for (int k = 0; k < ranks; ++k) {
    const std::string tag = " rank " + std::to_string(k) + " ";
    const std::size_t rss_line = r.out.find("peak resident memory per rank:");
    const std::size_t tiles_line = r.out.find("host tiles per rank (");
    r.rank_rss.push_back(after(r.out.substr(rss_line), tag) * 1048576.0);
    r.rank_tiles.push_back(after(r.out.substr(tiles_line), tag) * 1048576.0);
    r.peak_rss = std::max(r.peak_rss, r.rank_rss.back());
  }
  r.whole_tiles = after(r.out, "one rank unsharded ") * 1048576.0;
  r.hidden = after(r.out, "of it after the step's last gradient: ");
  r.bytes_ratio = after(r.out, " steps (");
  return r;
}

void describe(const char* what, const Run& r) {
  std::printf("  %-32s step %.3f s, peak RSS %.1f MiB", what, r.step_s, r.peak_rss / 1048576.0);
  for (std::size_t k = 0; k < r.rank_rss.size(); ++k)
    std::printf("%s rank %zu %.1f MiB (tiles %.1f)", k ? "," : ":", k, r.rank_rss[k] / 1048576.0,
                r.rank_tiles[k] / 1048576.0);
  if (r.hidden >= 0) std::printf("; reduction %.3f hidden, %.4f x the gradient sent a step", r.hidden, r.bytes_ratio);
  std::printf("\n");
}

// The largest rank's peak RSS against one rank's, less the tile bytes that rank does not hold.
double predicted_rss(const Run& one, const Run& job) {
  std::size_t largest = 0;
  for (std::size_t k = 0; k < job.rank_rss.size(); ++k)
    if (job.rank_rss[k] > job.rank_rss[largest]) largest = k;
  return one.peak_rss - (job.whole_tiles - job.rank_tiles[largest]);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 12;
  if (steps < 4) {
    std::fprintf(stderr, "usage: bench_cluster [steps >= 4]\n");
    return 2;
  }
  std::printf("cluster benchmark: the demo model, ranks of one thread each under mpirun, %d steps\n", steps);
  std::printf("  CPU: %s\n  ISA: %s\n", mt::bench::cpu_model().c_str(), mt::bench::cpu_isa_flags().c_str());
  try {
    const fs::path dir = fs::temp_directory_path() / ("mt_bench_cluster_" + std::to_string(getpid()));
    const fs::path shard = mt::bench::write_token_shard(dir, 1 << 20);
    const Run one = train(1, false, shard, dir / "one", steps);
    describe("1 rank", one);
    // The same tokens as 2 ranks x 1 in one process: on one core, and on both.
    const Run one_m2 = train(1, false, shard, dir / "one_m2", steps, 2);
    describe("1 rank x 2 micro-batches", one_m2);
    const Run one_m2_t2 = train(1, false, shard, dir / "one_m2_t2", steps, 2, 2);
    describe("1 rank x 2 micro-batches, 2 threads", one_m2_t2);
    const Run two = train(2, false, shard, dir / "two", steps);
    describe("2 ranks, unsharded", two);
    const Run two_s = train(2, true, shard, dir / "two_sharded", steps);
    describe("2 ranks, sharded", two_s);
    const Run three = train(3, false, shard, dir / "three", steps);
    describe("3 ranks, unsharded (memory)", three);
    const Run three_s = train(3, true, shard, dir / "three_sharded", steps);
    describe("3 ranks, sharded (memory)", three_s);
    // The planner: a 120B Llama (the plan bench's shape) on 4 ranks of one H200 and 512 GB each, the
    // moments in the tiles, and on each rank's NVMe tier with the masters (train.offload_params).
    auto plan_120b = [&](const std::string& extra, const char* what) {
      const fs::path plan_log = dir / "plan.log";
      const std::string plan = kBinary +
                               " plan --model.hidden_size=10240 --model.layers=108 --model.heads=80 --model.kv_heads=8"
                               " --model.intermediate_size=28672 --model.vocab_size=32000"
                               " --model.max_position_embeddings=4096 --train.per_device_train_batch_size=4"
                               " --data.seq_length=2048 --plan.hardware=h200 --train.bf16=true --plan.ranks=4"
                               " --plan.host_ram_gb=512 --cluster.shard_state=true " +
                               extra + " > " + plan_log.string() + " 2>&1";
      (void)std::system(plan.c_str());
      std::ifstream pin(plan_log);
      std::stringstream pss;
      pss << pin.rdbuf();
      const std::string planned = pss.str();
      const std::size_t at = planned.find("cluster: 4 ranks");
      const std::string line = at == std::string::npos ? "" : planned.substr(at, planned.find('\n', at) - at);
      const std::size_t fit = planned.find("\nfits: ");
      const std::string fits = fit != std::string::npos ? planned.substr(fit + 7, planned.find('\n', fit + 1) - fit - 7)
                               : planned.find("DOES NOT FIT") != std::string::npos ? "no"
                                                                                   : "?";
      std::printf("  planner, 120B on 4 x (H200, 512 GB), sharded, %s: fits: %s; %s\n", what, fits.c_str(),
                  line.c_str());
      return after(line, " 0: ");
    };
    const double rank0_gib = plan_120b("", "moments in the tiles");
    const double rank0_tier_gib =
        plan_120b("--train.offload_dir=" + (dir / "nvme").string() + " --train.offload_params=true",
                  "masters and moments on each rank's NVMe tier");
    fs::remove_all(dir);

    mt::bench::Report report("cluster");
    report.add({"cluster_step_2x1", two.step_s, "s", one.step_s, 0.0, "lower"});
    report.add({"cluster_step_2x1_sharded", two_s.step_s, "s", one.step_s, 0.0, "lower"});
    // The same tokens a step in one process: 2 micro-batches on one core, and on both cores.
    report.add({"cluster_step_2x1_vs_1x2_one_core", two.step_s, "s", one_m2.step_s, 0.0, "lower"});
    report.add({"cluster_step_2x1_vs_1x2_two_threads", two.step_s, "s", one_m2_t2.step_s, 0.0, "lower"});
    report.add({"cluster_reduction_hidden_fraction", two.hidden, "fraction", 0.0, 0.8});
    report.add({"cluster_reduction_hidden_fraction_sharded", two_s.hidden, "fraction", 0.0, 0.8});
    report.add({"cluster_bytes_per_step", two.bytes_ratio, "model gradients", 1.0, 0.0, "lower"});
    report.add({"cluster_bytes_per_step_sharded", two_s.bytes_ratio, "model gradients", 1.0, 0.0, "lower"});
    report.add(
        {"cluster_rank_rss_unsharded_2", two.peak_rss / 1048576.0, "MiB", one.peak_rss / 1048576.0, 0.0, "lower"});
    report.add({"cluster_rank_rss_sharded_2", two_s.peak_rss / 1048576.0, "MiB", predicted_rss(one, two_s) / 1048576.0,
                1.10, "lower"});
    report.add({"cluster_rank_rss_sharded_3", three_s.peak_rss / 1048576.0, "MiB",
                predicted_rss(one, three_s) / 1048576.0, 1.10, "lower"});
    report.add(
        {"cluster_rank_rss_unsharded_3", three.peak_rss / 1048576.0, "MiB", one.peak_rss / 1048576.0, 0.0, "lower"});
    if (rank0_gib > 0) report.add({"cluster_plan_120b_4x512gb_rank_tiles", rank0_gib, "GiB", 512.0, 1.0, "lower"});
    if (rank0_tier_gib > 0)
      report.add({"cluster_plan_120b_4x512gb_rank_ram_tier", rank0_tier_gib, "GiB", 512.0, 1.0, "lower"});
    report.print();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
