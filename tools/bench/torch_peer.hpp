// The strongest PyTorch peer of the train-step benchmark on this machine: train_step_torch.py run under
// every interpreter available (Debian's torch at MEGATRAIN_PYTHON; PyPI's in <repo>/.venv-bench, made
// by tools/bench/setup-torch-peer) at 1 and the benchmark's thread count, fp32 and bf16 autocast, with
// F.scaled_dot_product_attention where the version has it. Every configuration's step time is kept, and
// the fastest is the yardstick: comparing against Debian's slow torch 1.13 alone would flatter us.
//
// Debian's torch is slow here (fp32 ~75 s per step at 4 x 256), so it runs only the configurations that
// could plausibly be the best (configs() in torch_peer.cpp) with one timed step, and any configuration
// is stopped once a step runs well past the best so far (TorchPeerOptions::cutoff), which keeps the
// sweep at the benchmark's default shapes within about six minutes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt::bench {

// One Python interpreter with torch, probed with `train_step_torch.py --info`.
struct TorchInterpreter {
  std::string label;           // "debian" (MEGATRAIN_PYTHON) or "pypi" (<repo>/.venv-bench)
  std::string python;          // path of the interpreter
  std::string torch_version;   // torch.__version__
  bool sdpa = false;           // has F.scaled_dot_product_attention
  bool autocast_bf16 = false;  // has torch.autocast("cpu", dtype=torch.bfloat16)
  bool slow = false;           // Debian's: only the plausible-best configurations are run
};

// One configuration of the peer step.
struct TorchPeerConfig {
  TorchInterpreter interp;
  int threads = 1;
  bool bf16 = false;  // forward and loss under autocast(bf16), fp32 master weights and AdamW
  bool sdpa = false;  // F.scaled_dot_product_attention(is_causal=True) instead of the masked softmax
  // "<label>_<threads>thr_<fp32|bf16>_<masked|sdpa>", e.g. "pypi_2thr_bf16_sdpa": a metric suffix.
  std::string name() const;
};

struct TorchPeerRun {
  TorchPeerConfig config;
  bool ok = false;
  double seconds = 0;         // the fastest timed step (wall clock)
  double cpu_seconds = 0;     // CPU seconds of that step (all threads of the Python process)
  int reps = 0;               // timed steps
  int warmup = 0;             // unmeasured steps before them
  double warmup_seconds = 0;  // the warm-up step (first-touch memory, oneDNN primitives)
  double wall_seconds = 0;    // the whole child process: start-up, model build, every step
  bool stopped = false;       // !ok because a step ran past the cut-off (cannot be the best)
  double stopped_above = 0;
  std::string error;  // why it is not ok: stopped, timed out, or the last lines of its output
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
// when present; an absent or broken one adds a line to `notes` (saying to run setup-torch-peer).
std::vector<TorchInterpreter> torch_interpreters(std::vector<std::string>& notes, const TorchPeerOptions& opt = {});

// Runs one configuration of train_step_torch.py at batch x seq: `warmup` unmeasured steps, then the
// best of `reps`; a timed step past stop_above_s (> 0) or a warm-up step past stop_warmup_above_s (> 0;
// 0: stop_above_s) stops it. Failures come back as !ok with the reason.
TorchPeerRun run_torch_peer(const TorchPeerConfig& config, std::int64_t batch, std::int64_t seq, int reps, int warmup,
                            double stop_above_s, double stop_warmup_above_s, double timeout_s);

// Every configuration of every interpreter at batch x seq, and the best: PyPI's torch first (1 and
// opt.threads threads x bf16/fp32 x SDPA/masked), then Debian's (bf16 at both thread counts, fp32 at
// opt.threads only, one timed step), each under the cut-off. Never throws for a failed configuration
// or interpreter: it is recorded and the sweep goes on.
TorchPeerSweep torch_peer_sweep(std::int64_t batch, std::int64_t seq, const TorchPeerOptions& opt = {});

// A readable table of the sweep (one line per configuration, the best marked, the notes), for stdout.
std::string torch_peer_table(const TorchPeerSweep& sweep);

}  // namespace mt::bench
