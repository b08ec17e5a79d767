// The strongest PyTorch peer of the train-step benchmark on this machine: train_step_torch.py run under
// every interpreter available (Debian's torch at MEGATRAIN_PYTHON; PyPI's in <repo>/.venv-bench, made
// by tools/bench/setup-torch-peer) at 1 and the benchmark's thread count, fp32 and bf16 autocast, with
// F.scaled_dot_product_attention where the version has it. Every configuration's step time is kept, and
// the fastest is the yardstick: comparing against Debian's slow torch 1.13 alone would flatter us.
//
// Debian's torch is slow here (fp32 ~75 s per step at 4 x 256), so it runs only the configurations that
// could plausibly be the best (configs() in torch_peer.cpp) with one timed step, and any configuration
// is stopped once a step runs well past the best so far (TorchPeerOptions::cutoff), which keeps the
// eager sweep at the benchmark's default shapes within about six minutes.
//
// Then torch.compile, which a PyTorch user on a CPU would try: default mode for each precision and
// attention at the thread count of the fastest eager step, and max-autotune for the best of those,
// each with an empty Inductor cache (a cold compile) and a compile budget (TorchPeerOptions). The
// compile happens in the first step; its time is reported apart (TorchPeerRun::compile_seconds), never
// counted in the step. A configuration that fails to compile or run stays in the table with its
// error's first line; the best is taken over those that ran.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tools/bench/bench_report.hpp"

namespace mt::bench {

// One Python interpreter with torch, probed with `train_step_torch.py --info`.
struct TorchInterpreter {
  std::string label;           // "debian" (MEGATRAIN_PYTHON) or "pypi" (<repo>/.venv-bench)
  std::string python;          // path of the interpreter
  std::string torch_version;   // torch.__version__
  bool sdpa = false;           // has F.scaled_dot_product_attention
  bool autocast_bf16 = false;  // has torch.autocast("cpu", dtype=torch.bfloat16)
  bool compile = false;        // has torch.compile (torch >= 2.0)
  bool slow = false;           // Debian's: only the plausible-best configurations are run
  // Its probe (train_step_torch.py --probe at the sweep's thread count): one MLP block's forward +
  // backward in fp32 and under autocast bf16, one attention masked and through SDPA, in seconds (0: not
  // measured, or not in this torch). The sweep orders and cuts configurations by it.
  double probe_fp32_s = 0, probe_bf16_s = 0, probe_masked_s = 0, probe_sdpa_s = 0;
};

// How the model runs: eagerly, or torch.compile'd (Inductor) in default mode or max-autotune.
enum class TorchCompile { eager, default_mode, max_autotune };

// One configuration of the peer step.
struct TorchPeerConfig {
  TorchInterpreter interp;
  int threads = 1;
  bool bf16 = false;  // forward and loss under autocast(bf16), fp32 master weights and AdamW
  bool sdpa = false;  // F.scaled_dot_product_attention(is_causal=True) instead of the masked softmax
  TorchCompile compile = TorchCompile::eager;
  // "<label>_<threads>thr_<fp32|bf16>_<masked|sdpa>[_compile|_autotune]", e.g. "pypi_2thr_bf16_sdpa" or
  // "pypi_2thr_bf16_masked_compile": a metric suffix.
  std::string name() const;
  // train_step_torch.py's --compile value: "" (eager), "default" or "max-autotune".
  std::string compile_arg() const;
};

struct TorchPeerRun {
  TorchPeerConfig config;
  bool ok = false;
  double seconds = 0;          // the fastest timed step (wall clock)
  double cpu_seconds = 0;      // CPU seconds of that step (all threads of the Python process)
  int reps = 0;                // timed steps
  int warmup = 0;              // unmeasured steps before them
  double warmup_seconds = 0;   // the warm-up step (first-touch memory, oneDNN primitives)
  double wall_seconds = 0;     // the whole child process: start-up, model build, every step
  double compile_seconds = 0;  // compiled: the warm-up steps (the compile is in the first) beyond as many
                               // timed steps
  bool stopped = false;        // !ok because a step ran past the cut-off (cannot be the best) or the
                               // compile ran past its budget
  double stopped_above = 0;
  bool compile_failed = false;  // !ok because torch.compile raised (error: its first line)
  std::string error;  // why it is not ok: stopped, failed to compile / run, timed out, or the end of its output
};

// The limits one run of the peer script is given.
struct TorchPeerLimits {
  int reps = 2;                    // timed steps
  int warmup = 1;                  // unmeasured steps before them (a compiled run compiles in the first)
  double stop_above_s = 0;         // > 0: a timed step running past this is stopped
  double stop_warmup_above_s = 0;  // > 0: a warm-up step past this is stopped (0: stop_above_s)
  double timeout_s = 420;          // the whole child
};

struct TorchPeerOptions {
  int threads = 2;  // configurations run at 1 and at this many threads
  int reps = 2;     // timed steps per configuration (after one warm-up) for the fast interpreter
  // A configuration is stopped once a timed step has run cutoff x the best step so far + cutoff_slack_s
  // (a warm-up step: cutoff x the best's warm-up step + slack): it cannot be the best, and the sweep
  // stays within minutes. 0: no cut-off (every configuration measured in full; slow).
  double cutoff = 1.5;
  double cutoff_slack_s = 1.0;
  double timeout_s = 420;  // per configuration: a hung or pathological child is stopped and reported
  // torch.compile: default mode for every precision and attention at the thread count where the
  // interpreter's eager step was fastest (each cold compile costs about a minute on 2 cores), then
  // max-autotune for the precision and attention of the fastest compiled one. A compile (the first step)
  // running past its budget is stopped and reported as such. A cold compile + first step of this model
  // took 40-80 s on 2 cores (AMD EPYC family 25 model 17, torch 2.15), max-autotune's 50-80 s, at
  // 4 x 64 and 4 x 256: the budgets leave room for a slower machine, not for a pathological compile.
  bool compile = true;
  bool autotune = true;
  double compile_budget_s = 300;
  double autotune_budget_s = 420;
  // A precision or attention whose probe took this many times the other's is not run: it cannot be the
  // best (autocast bf16 on a CPU without native bf16 ran 60x fp32's step). Within it the faster goes first.
  double probe_cut = 4.0;
  bool include_debian = true;
  bool include_venv = true;
  bool progress = true;  // print one line per configuration to stdout as it finishes
};

struct TorchPeerSweep {
  std::int64_t batch = 0, seq = 0;
  std::vector<TorchInterpreter> interpreters;  // those found and working
  std::vector<std::string> notes;              // interpreters absent or broken, configurations skipped
  std::vector<TorchPeerRun> runs;              // every configuration tried, in order (failed ones too)
  int best = -1;                               // index into runs of the fastest ok step; -1 when none
  const TorchPeerRun* best_run() const { return best >= 0 ? &runs[static_cast<std::size_t>(best)] : nullptr; }
};

// The interpreters available: MEGATRAIN_PYTHON (Debian's torch) and <repo>/.venv-bench/bin/python3
// when present, each probed at opt.threads; an absent or broken one adds a line to `notes` (saying to
// run setup-torch-peer).
std::vector<TorchInterpreter> torch_interpreters(std::vector<std::string>& notes, const TorchPeerOptions& opt = {});

// Runs one configuration of train_step_torch.py at batch x seq under `limits` (a compiled one with an
// empty Inductor cache of its own, removed afterwards). Failures come back as !ok with the reason.
TorchPeerRun run_torch_peer(const TorchPeerConfig& config, std::int64_t batch, std::int64_t seq,
                            const TorchPeerLimits& limits);

// What one run of the script says: its exit status (124/137: `timeout` stopped it) and output, read
// under the limits it was given. The result lines are documented in train_step_torch.py.
TorchPeerRun parse_torch_peer(const TorchPeerConfig& config, int status, const std::string& out,
                              const TorchPeerLimits& limits);

// Every configuration of every interpreter at batch x seq, and the best: the eager ones first, PyPI's
// torch (1 and opt.threads threads x bf16/fp32 x SDPA/masked), then Debian's (fp32 at opt.threads only
// where bf16 runs, one timed step), each under the cut-off, in the order the interpreter's probe
// measured fastest and without what it measured far slower (TorchPeerOptions::probe_cut); then the
// compiled ones (TorchPeerOptions::compile). Never throws for a failed configuration or interpreter: it is recorded
// and the sweep goes on.
TorchPeerSweep torch_peer_sweep(std::int64_t batch, std::int64_t seq, const TorchPeerOptions& opt = {});

// The eager configurations the sweep runs for one interpreter at `threads` (ascending), in its order:
// the most threads first, then the precision and attention the interpreter's probe measured faster;
// without one that took probe_cut x the other's (a line in `notes` for each left out).
std::vector<TorchPeerConfig> eager_configs(const TorchInterpreter& in, const std::vector<int>& threads,
                                           double probe_cut, std::vector<std::string>& notes);

// The index of the fastest ok run (-1 when none ran): failed and stopped ones never count.
int fastest_run(const std::vector<TorchPeerRun>& runs);

// One figure per compiled configuration that ran: `torch_compile_s_<config><tag>`, its cold compile in
// seconds (no ceiling; lower is better). A configuration that failed to compile has its line in the table.
void add_compile_figures(Report& report, const TorchPeerSweep& sweep, const std::string& tag);

// A readable table of the sweep (one line per configuration, the best marked, the notes), for stdout.
std::string torch_peer_table(const TorchPeerSweep& sweep);

}  // namespace mt::bench
