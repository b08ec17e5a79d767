// What watching a node costs: the node binary training the demo model (config/demo.ini, random tokens)
// with its monitor endpoint scraped 10 times a second (GET /metrics and GET /status) and an SSE client
// on /events, against the same run with monitor.enabled=false. Runs alternate (plain, monitored, plain,
// ...) so drifting machine load hits both alike; each config's figure is the median step time (the
// node's own step_s in train.jsonl) over all its runs, the first steps of each run left out (warm-up).
//   tools/bench/run monitor [STEPS] [PAIRS]        (default 24 steps a run, 8 pairs of runs: single runs
//   differ by up to 10% on these machines, 3 pairs measured +2.0% where 8 measured +0.2%)
// Metric monitor_overhead = (monitored median - plain median) / plain median, target <= 0.01;
// monitor_step_s = the monitored median, against the plain median as its ceiling.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_report.hpp"
#include "tools/bench/gemm_ceiling.hpp"
#include "tools/bench/token_shard.hpp"
#include "tools/top/monitor_client.hpp"

namespace fs = std::filesystem;
using mt::monitor_client::ClientError;

namespace {

constexpr int kWarmupSteps = 4;  // left out of each run's step times: first allocations, page faults
constexpr double kScrapeHz = 10.0;

pid_t start_node(const std::vector<std::string>& args, const fs::path& log) {
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    if (std::freopen(log.c_str(), "w", stdout) == nullptr || ::dup2(STDOUT_FILENO, STDERR_FILENO) < 0) ::_exit(127);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

struct Watchers {
  std::atomic<bool> done{false};
  std::atomic<long> scrapes{0}, scrape_errors{0}, events{0};
  std::vector<double> scrape_s;  // latency of each GET (scraper thread only)
};

// GET /metrics and GET /status every 100 ms until done.
void scrape(const mt::monitor_client::Endpoint& e, Watchers& w) {
  const auto period = std::chrono::duration<double>(1.0 / kScrapeHz);
  auto next = std::chrono::steady_clock::now();
  while (!w.done) {
    for (const char* path : {"/metrics", "/status"}) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        const auto r = mt::monitor_client::get(e, path, 5.0);
        if (r.status == 200) {
          ++w.scrapes;
          w.scrape_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        } else {
          ++w.scrape_errors;
        }
      } catch (const ClientError&) {
        ++w.scrape_errors;  // the node has finished and closed its endpoint
      }
    }
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
    std::this_thread::sleep_until(next);
  }
}

// One SSE client on /events for the whole run, counting what it receives.
void follow(const mt::monitor_client::Endpoint& e, Watchers& w) {
  try {
    mt::monitor_client::EventStream s(e);
    while (!w.done)
      if (s.next(0.2)) ++w.events;
  } catch (const ClientError&) {
    // the stream ends when the node exits
  }
}

struct RunResult {
  std::vector<double> step_s;  // measured steps (after warm-up)
  long scrapes = 0, scrape_errors = 0, events = 0;
  double scrape_median_s = 0;
};

RunResult run_node(const std::vector<std::string>& base, const fs::path& out, bool monitored) {
  fs::remove_all(out);
  std::vector<std::string> args = base;
  args.push_back("--train.output_dir=" + out.string());
  args.push_back(std::string("--monitor.enabled=") + (monitored ? "true" : "false"));
  fs::create_directories(out);
  const fs::path log = out / "node.log";
  const pid_t pid = start_node(args, log);
  Watchers w;
  std::thread scraper, follower;
  int status = 0;
  if (monitored) {
    // Attach as soon as the node listens; the warm-up steps cover the time this takes.
    while (!fs::exists(out / "monitor.json")) {
      if (::waitpid(pid, &status, WNOHANG) == pid)
        throw std::runtime_error("the node exited before listening; see " + log.string());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto e = mt::monitor_client::attach(out.string(), "");
    follower = std::thread(follow, e, std::ref(w));
    scraper = std::thread(scrape, e, std::ref(w));
  }
  ::waitpid(pid, &status, 0);
  w.done = true;
  if (scraper.joinable()) scraper.join();
  if (follower.joinable()) follower.join();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.size() > 2000) text = text.substr(text.size() - 2000);
    throw std::runtime_error("the node failed (exit status " + std::to_string(status) + "):\n" + text);
  }
  RunResult r;
  std::ifstream jsonl(out / "train.jsonl");
  for (std::string line; std::getline(jsonl, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("step").get<int>() > kWarmupSteps) r.step_s.push_back(j.at("step_s").get<double>());
  }
  r.scrapes = w.scrapes;
  r.scrape_errors = w.scrape_errors;
  r.events = w.events;
  r.scrape_median_s = mt::bench::median(w.scrape_s);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 24;
  const int pairs = argc > 2 ? std::atoi(argv[2]) : 8;
  if (steps <= kWarmupSteps + 2 || pairs < 1) {
    std::fprintf(stderr, "usage: tools/bench/run monitor [STEPS > %d] [PAIRS >= 1]\n", kWarmupSteps + 2);
    return 2;
  }
  const fs::path work = fs::temp_directory_path() / ("mt_bench_monitor_" + std::to_string(::getpid()));
  std::printf("monitor: the demo model (config/demo.ini, random tokens), %d steps a run, %d pairs of runs\n", steps,
              pairs);
  std::printf("  CPU: %s\n  ISA: %s\n", mt::bench::cpu_model().c_str(), mt::bench::cpu_isa_flags().c_str());
  std::printf("  monitored: GET /metrics and GET /status %.0f times a second each, one SSE client on /events\n",
              kScrapeHz);
  std::fflush(stdout);
  int rc = 0;
  try {
    const fs::path shard = mt::bench::write_token_shard(work, 1 << 17);
    const std::vector<std::string> base = {MEGATRAIN_BINARY,
                                           "train",
                                           "--config-file=" + std::string(MEGATRAIN_SOURCE_DIR) + "/config/demo.ini",
                                           "--data.train_files=" + shard.string(),
                                           "--data.validation_files=\"\"",
                                           "--data.tokenizer_file=\"\"",
                                           "--train.warmup_steps=0",
                                           "--train.max_steps=" + std::to_string(steps),
                                           "--train.save_steps=0",
                                           "--train.save_total_limit=1"};
    std::vector<double> plain, monitored;
    long scrapes = 0, errors = 0, events = 0;
    std::vector<double> scrape_latency;
    for (int p = 0; p < pairs; ++p) {
      for (const bool on : {false, true}) {
        const RunResult r = run_node(base, work / (on ? "monitored" : "plain"), on);
        (on ? monitored : plain).insert((on ? monitored : plain).end(), r.step_s.begin(), r.step_s.end());
        std::printf("  run %d %-9s median step %.4f s over %zu steps", p + 1, on ? "monitored" : "plain",
                    mt::bench::median(r.step_s), r.step_s.size());
        if (on) {
          std::printf("; %ld scrapes (median %.2f ms), %ld failed, %ld events", r.scrapes, 1e3 * r.scrape_median_s,
                      r.scrape_errors, r.events);
          scrapes += r.scrapes;
          errors += r.scrape_errors;
          events += r.events;
          scrape_latency.push_back(r.scrape_median_s);
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
    const double plain_s = mt::bench::median(plain), monitored_s = mt::bench::median(monitored);
    const double overhead = (monitored_s - plain_s) / plain_s;
    std::printf("  plain median step %.4f s, monitored %.4f s: overhead %+.2f%% of a step (target <= 1%%)\n", plain_s,
                monitored_s, 100 * overhead);
    std::printf(
        "  %ld scrapes answered (median latency %.2f ms), %ld refused or failed (after the run ended), %ld SSE "
        "events\n",
        scrapes, 1e3 * mt::bench::median(scrape_latency), errors, events);
    if (scrapes == 0 || events == 0) throw std::runtime_error("the monitored runs were never scraped or sent no event");
    mt::bench::Report report("monitor");
    report.add({"monitor_step_s", monitored_s, "s", plain_s, 0, "lower"});
    // The overhead against a target, not a ceiling (a fraction has nothing measured to be compared with).
    report.add({"monitor_overhead", overhead, "fraction of a step", 0, 0.01, "lower"});
    report.print();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "monitor bench: %s\n", e.what());
    rc = 1;
  }
  fs::remove_all(work);
  return rc;
}
