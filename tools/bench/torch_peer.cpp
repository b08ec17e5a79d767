#include "tools/bench/torch_peer.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#ifndef MEGATRAIN_SOURCE_DIR
#error "torch_peer.cpp needs MEGATRAIN_SOURCE_DIR and MEGATRAIN_PYTHON (tools/bench/CMakeLists.txt)"
#endif

namespace mt::bench {
namespace {

std::string source_dir() {
  const char* src = std::getenv("MEGATRAIN_SOURCE_DIR");  // override for out-of-tree builds
  return src ? src : MEGATRAIN_SOURCE_DIR;
}

std::string script() { return source_dir() + "/tools/bench/train_step_torch.py"; }

std::string quote(const std::string& s) {  // for /bin/sh: the paths are ours, but may hold spaces
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct Child {
  int status = -1;  // the shell's exit status: 124 when `timeout` stopped it
  std::string out;  // stdout and stderr together
  double seconds = 0;
};

// Runs `args` under `timeout` (coreutils) so a hung child cannot stall the benchmark.
Child run_child(const std::string& args, double timeout_s) {
  const std::string cmd = "timeout -k 5 " + std::to_string(static_cast<long>(timeout_s)) + " " + args + " 2>&1";
  Child c;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    c.out = "popen failed";
    return c;
  }
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) c.out.append(buf, n);
  const int st = pclose(p);
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  c.status = st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return c;
}

std::string last_lines(const std::string& out, int n) {  // the end of a failed child's output, one line
  std::vector<std::string> lines;
  std::stringstream ss(out);
  for (std::string l; std::getline(ss, l);)
    if (!l.empty()) lines.push_back(l);
  std::string r;
  for (std::size_t i = lines.size() > static_cast<std::size_t>(n) ? lines.size() - n : 0; i < lines.size(); ++i)
    r += (r.empty() ? "" : " | ") + lines[i];
  return r.empty() ? "no output" : r;
}

// Two ways of one choice (bf16 or fp32, SDPA or masked) as the probe measured them: `first` true for
// the first way. Both, the faster first (the first way when unmeasured), or the one alone when the other
// took `cut` x its time (said in `notes` when given) or does not exist here.
std::vector<bool> by_probe(bool has_first, double first_s, double second_s, double cut, const std::string& what,
                           const char* first, const char* second, std::vector<std::string>* notes) {
  if (!has_first) return {false};
  auto cut_note = [&](const char* slow, double ratio) {
    if (notes)
      notes->push_back(what + ": " + slow + " not run (its probe took " + std::to_string(ratio).substr(0, 4) +
                       "x the other's)");
  };
  if (first_s > 0 && second_s > 0) {
    if (first_s > cut * second_s) {
      cut_note(first, first_s / second_s);
      return {false};
    }
    if (second_s > cut * first_s) {
      cut_note(second, second_s / first_s);
      return {true};
    }
    if (second_s < first_s) return {false, true};
  }
  return {true, false};
}

std::vector<bool> precisions(const TorchInterpreter& in, double cut, std::vector<std::string>* notes) {
  return by_probe(in.autocast_bf16, in.probe_bf16_s, in.probe_fp32_s, cut, in.label, "bf16", "fp32", notes);
}

std::vector<bool> attentions(const TorchInterpreter& in, double cut, std::vector<std::string>* notes) {
  return by_probe(in.sdpa, in.probe_sdpa_s, in.probe_masked_s, cut, in.label, "sdpa", "masked", notes);
}

// Every configuration, the likeliest fastest first (most threads, then the precision and attention the
// interpreter's probe measured faster) so that the cut-off for the rest (TorchPeerOptions::cutoff) is
// tight from the start.
std::vector<TorchPeerConfig> configs(const TorchInterpreter& in, const std::vector<int>& threads, double cut,
                                     std::vector<std::string>& notes) {
  std::vector<TorchPeerConfig> cs;
  const std::vector<bool> precision = precisions(in, cut, &notes), attention = attentions(in, cut, &notes);
  const bool runs_bf16 = std::find(precision.begin(), precision.end(), true) != precision.end();
  for (auto t = threads.rbegin(); t != threads.rend(); ++t)
    for (bool bf16 : precision) {
      // Debian's torch 1.13 runs fp32 GEMMs through a slow BLAS path on these CPUs (bf16 goes through
      // oneDNN): at 4 x 64 its fp32 step took 24.7 s on 1 thread and 15.0 s on 2, its bf16 4.3 s and
      // 3.1 s. So its fp32 runs only at the most threads, under the cut-off (where it cannot be the
      // best it costs one cut step), and not on 1 thread, which is slower still.
      if (in.slow && !bf16 && runs_bf16 && *t != threads.back()) {
        notes.push_back(in.label + "_" + std::to_string(*t) + "thr_fp32_masked: not run (torch " + in.torch_version +
                        "'s fp32 is slower than its bf16 and on 1 thread slower than on " +
                        std::to_string(threads.back()) + ")");
        continue;
      }
      for (bool sdpa : attention) cs.push_back({in, *t, bf16, sdpa});
    }
  return cs;
}

// The default-mode compiled configurations of an interpreter at one thread count: the precisions and
// attentions its eager sweep ran, in the same order.
std::vector<TorchPeerConfig> compiled_configs(const TorchInterpreter& in, int threads, double cut,
                                              std::vector<std::string>& notes) {
  std::vector<TorchPeerConfig> cs;
  if (!in.compile) {
    notes.push_back(in.label + ": torch " + in.torch_version +
                    " has no torch.compile (torch >= 2.0): no compiled configurations");
    return cs;
  }
  for (bool bf16 : precisions(in, cut, nullptr))
    for (bool sdpa : attentions(in, cut, nullptr)) cs.push_back({in, threads, bf16, sdpa, TorchCompile::default_mode});
  notes.push_back(in.label + ": compiled at " + std::to_string(threads) +
                  " thread(s) only, where its eager step was fastest (each cold compile takes about a minute)");
  return cs;
}

// The first line of `out` that starts with `key` (without the key), or "" when none does.
std::string line_after(const std::string& out, const std::string& key) {
  std::stringstream ss(out);
  for (std::string l; std::getline(ss, l);)
    if (l.rfind(key, 0) == 0) return l.substr(key.size());
  return "";
}

}  // namespace

std::string TorchPeerConfig::name() const {
  const char* mode = compile == TorchCompile::default_mode   ? "_compile"
                     : compile == TorchCompile::max_autotune ? "_autotune"
                                                             : "";
  return interp.label + "_" + std::to_string(threads) + "thr_" + (bf16 ? "bf16" : "fp32") +
         (sdpa ? "_sdpa" : "_masked") + mode;
}

std::string TorchPeerConfig::compile_arg() const {
  return compile == TorchCompile::default_mode   ? "default"
         : compile == TorchCompile::max_autotune ? "max-autotune"
                                                 : "";
}

int fastest_run(const std::vector<TorchPeerRun>& runs) {
  int best = -1;
  for (std::size_t i = 0; i < runs.size(); ++i)
    if (runs[i].ok && (best < 0 || runs[i].seconds < runs[static_cast<std::size_t>(best)].seconds))
      best = static_cast<int>(i);
  return best;
}

std::vector<TorchInterpreter> torch_interpreters(std::vector<std::string>& notes, const TorchPeerOptions& opt) {
  std::vector<TorchInterpreter> found;
  auto probe = [&](const std::string& label, const std::string& python, bool slow) {
    const Child c = run_child(quote(python) + " " + quote(script()) + " --info", 120);
    char ver[128] = {0};
    int sdpa = 0, bf16 = 0, compile = 0;
    const auto at = c.out.find("torch_version ");
    if (c.status != 0 || at == std::string::npos ||
        std::sscanf(c.out.c_str() + at, "torch_version %127s sdpa %d autocast_bf16 %d compile %d", ver, &sdpa, &bf16,
                    &compile) != 4) {
      notes.push_back(label + " (" + python + "): no usable torch: " + last_lines(c.out, 2));
      return;
    }
    TorchInterpreter in{label, python, ver, sdpa != 0, bf16 != 0, compile != 0, slow};
    const Child p = run_child(quote(python) + " " + quote(script()) + " --probe " + std::to_string(opt.threads), 120);
    const auto pat = p.out.find("torch_probe ");
    if (p.status != 0 || pat == std::string::npos ||
        std::sscanf(p.out.c_str() + pat, "torch_probe fp32 %lf bf16 %lf masked %lf sdpa %lf", &in.probe_fp32_s,
                    &in.probe_bf16_s, &in.probe_masked_s, &in.probe_sdpa_s) != 4) {
      in.probe_fp32_s = in.probe_bf16_s = in.probe_masked_s = in.probe_sdpa_s = 0;
      notes.push_back(label + ": the probe failed (" + last_lines(p.out, 1) + "): every configuration run");
    }
    found.push_back(in);
  };
  if (opt.include_debian) probe("debian", MEGATRAIN_PYTHON, true);
  if (opt.include_venv) {
    const std::string venv = source_dir() + "/.venv-bench/bin/python3";
    if (access(venv.c_str(), X_OK) == 0)
      probe("pypi", venv, false);
    else
      notes.push_back("pypi: no " + venv + " (tools/bench/setup-torch-peer makes it): only Debian's torch compared");
  }
  return found;
}

TorchPeerRun parse_torch_peer(const TorchPeerConfig& config, int status, const std::string& out,
                              const TorchPeerLimits& limits) {
  TorchPeerRun r;
  r.config = config;
  r.reps = limits.reps;
  r.warmup = limits.warmup;
  const bool compiled = config.compile != TorchCompile::eager;
  const auto at = out.find("torch_step_seconds ");
  const std::string compile_failed = line_after(out, "torch_compile_failed ");
  const std::string step_failed = line_after(out, "torch_step_failed ");
  if (status == 0 && at != std::string::npos &&
      std::sscanf(out.c_str() + at, "torch_step_seconds %lf cpu %lf", &r.seconds, &r.cpu_seconds) == 2 &&
      r.seconds > 0 && (!compiled || out.find("torch_compile_seconds ") != std::string::npos)) {
    r.ok = true;
    const auto w = out.find("torch_warmup_seconds ");
    if (w != std::string::npos) std::sscanf(out.c_str() + w, "torch_warmup_seconds %lf", &r.warmup_seconds);
    const auto cs = out.find("torch_compile_seconds ");
    if (cs != std::string::npos) std::sscanf(out.c_str() + cs, "torch_compile_seconds %lf", &r.compile_seconds);
  } else if (status == 3 && out.find("torch_step_stopped above") != std::string::npos) {
    r.stopped = true;
    int at_step = -1;  // "torch_step_stopped above S at step K": K < warmup is a warm-up step
    std::sscanf(line_after(out, "torch_step_stopped above ").c_str(), "%*f at step %d", &at_step);
    const bool in_warmup = at_step >= 0 && at_step < limits.warmup;
    const double limit = in_warmup && limits.stop_warmup_above_s > 0 ? limits.stop_warmup_above_s : limits.stop_above_s;
    r.stopped_above = limit;
    char why[200];
    if (in_warmup && compiled)  // the compile happens in the first step: it ran past its budget
      std::snprintf(why, sizeof why, "stopped: compile + warm-up step %d ran past its budget of %.0f s", at_step + 1,
                    limit);
    else
      std::snprintf(why, sizeof why, "stopped: its %s step ran past %.1f s, cannot be the best",
                    in_warmup ? "warm-up" : "timed", limit);
    r.error = why;
    double first = 0;  // a compiled run stopped after its compile: the compile's time is still worth a line
    const std::string f = line_after(out, "torch_first_step_seconds ");
    if (compiled && !in_warmup && !f.empty() && std::sscanf(f.c_str(), "%lf", &first) == 1) {
      std::snprintf(why, sizeof why, " (compile + first step %.1f s)", first);
      r.error += why;
    }
  } else if (!compile_failed.empty()) {
    r.compile_failed = true;
    r.error = "failed to compile: " + compile_failed;
  } else if (!step_failed.empty()) {
    r.error = "failed to run: " + step_failed;
  } else if (status == 124 || status == 137) {
    r.error = "timed out after " + std::to_string(static_cast<long>(limits.timeout_s)) + " s";
  } else {
    r.error = "exit " + std::to_string(status) + ": " + last_lines(out, 2);
  }
  return r;
}

TorchPeerRun run_torch_peer(const TorchPeerConfig& config, std::int64_t batch, std::int64_t seq,
                            const TorchPeerLimits& limits) {
  std::string cmd = quote(config.interp.python) + " " + quote(script()) + " " + std::to_string(config.threads) + " " +
                    std::to_string(batch) + " " + std::to_string(seq) + " " + std::to_string(limits.reps) +
                    " --warmup " + std::to_string(limits.warmup);
  if (config.bf16) cmd += " --bf16";
  if (config.sdpa) cmd += " --sdpa";
  if (limits.stop_above_s > 0 || limits.stop_warmup_above_s > 0)
    cmd += " --stop-above " + std::to_string(limits.stop_above_s) +
           (limits.stop_warmup_above_s > 0 ? " " + std::to_string(limits.stop_warmup_above_s) : std::string());
  // A compiled run gets an empty Inductor cache of its own: its compile is cold, as a user's first run,
  // whatever ran before it, and what it leaves behind is removed.
  std::string cache;
  if (!config.compile_arg().empty()) {
    cmd += " --compile " + config.compile_arg();
    std::string tmpl = (std::filesystem::temp_directory_path() / "megatrain-inductor-XXXXXX").string();
    if (mkdtemp(tmpl.data()) != nullptr) {
      cache = tmpl;
      cmd = "env TORCHINDUCTOR_CACHE_DIR=" + quote(cache) + " " + cmd;  // under `timeout`: env sets it
    }
  }
  const Child c = run_child(cmd, limits.timeout_s);
  if (!cache.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(cache, ec);
  }
  TorchPeerRun r = parse_torch_peer(config, c.status, c.out, limits);
  r.wall_seconds = c.seconds;
  return r;
}

namespace {

void print_progress(const TorchPeerRun& r, std::int64_t seq) {
  const TorchPeerConfig& c = r.config;
  if (r.ok) {
    std::printf("  torch-peer t%lld %-32s torch %-14s %7.2f s/step (cpu %.2f s, %d+%d steps, %.0f s in all)",
                static_cast<long long>(seq), c.name().c_str(), c.interp.torch_version.c_str(), r.seconds, r.cpu_seconds,
                r.warmup, r.reps, r.wall_seconds);
    if (c.compile != TorchCompile::eager) std::printf(", compile %.1f s (cold, not in the step)", r.compile_seconds);
    std::printf("\n");
  } else {
    std::printf("  torch-peer t%lld %-32s torch %-14s %s (%.0f s in all)\n", static_cast<long long>(seq),
                c.name().c_str(), c.interp.torch_version.c_str(), r.error.c_str(), r.wall_seconds);
  }
  std::fflush(stdout);
}

}  // namespace

std::vector<TorchPeerConfig> eager_configs(const TorchInterpreter& in, const std::vector<int>& threads,
                                           double probe_cut, std::vector<std::string>& notes) {
  return configs(in, threads, probe_cut, notes);
}

TorchPeerSweep torch_peer_sweep(std::int64_t batch, std::int64_t seq, const TorchPeerOptions& opt) {
  TorchPeerSweep s;
  s.batch = batch;
  s.seq = seq;
  s.interpreters = torch_interpreters(s.notes, opt);
  // The fast interpreter first: its best sets a tight cut-off for the slow one's long steps.
  std::stable_sort(s.interpreters.begin(), s.interpreters.end(),
                   [](const TorchInterpreter& a, const TorchInterpreter& b) { return !a.slow && b.slow; });
  auto run = [&](const TorchPeerConfig& c, TorchPeerLimits lim) {
    TorchPeerRun r = run_torch_peer(c, batch, seq, lim);
    if (opt.progress) print_progress(r, seq);
    s.runs.push_back(std::move(r));
    s.best = fastest_run(s.runs);
    return s.runs.back();
  };
  // The timed-step cut-off against the best so far (eager or compiled: a step is a step).
  auto stop_above = [&] {
    const TorchPeerRun* best = s.best_run();
    return best && opt.cutoff > 0 ? opt.cutoff * best->seconds + opt.cutoff_slack_s : 0.0;
  };
  std::vector<int> threads{1};
  if (opt.threads > 1) threads.push_back(opt.threads);
  // Eager, every interpreter first: the warm-up cut-off compares warm-up steps without a compile in them.
  for (const TorchInterpreter& in : s.interpreters) {
    for (const TorchPeerConfig& c : configs(in, threads, opt.probe_cut, s.notes)) {
      const TorchPeerRun* best = s.best_run();
      TorchPeerLimits lim;
      // One timed step where steps are long (Debian's): best-of-2 would double minutes of runtime.
      lim.reps = in.slow ? 1 : opt.reps;
      lim.stop_above_s = stop_above();
      // Warm-up steps against the best's warm-up step: they can be several times a steady step.
      lim.stop_warmup_above_s =
          lim.stop_above_s > 0 && best->warmup_seconds > 0 ? opt.cutoff * best->warmup_seconds + opt.cutoff_slack_s : 0;
      lim.timeout_s = opt.timeout_s;
      run(c, lim);
    }
  }
  if (!opt.compile) return s;
  // Compiled: the first step holds the compile, so its limit is the compile budget; the timed steps
  // are under the usual cut-off. The timeout only catches a hung child past both.
  auto compiled = [&](const TorchPeerConfig& c, double budget) {
    TorchPeerLimits lim;
    lim.reps = opt.reps;
    // Two warm-up steps: after the compile (the first) the second still ran 2.7x the steady step
    // (4 x 64, bf16, masked: 11.1 s, then 4.0-4.7 s), and a timed step that slow is cut off.
    lim.warmup = 2;
    lim.stop_above_s = stop_above();
    lim.stop_warmup_above_s = budget;
    lim.timeout_s = budget + opt.timeout_s;
    return run(c, lim);
  };
  for (const TorchInterpreter& in : s.interpreters) {
    // The thread count of this interpreter's fastest eager step (the most threads when none ran).
    int thr = opt.threads;
    double thr_s = 0;
    for (const TorchPeerRun& r : s.runs)
      if (r.ok && r.config.interp.python == in.python && (thr_s == 0 || r.seconds < thr_s)) {
        thr = r.config.threads;
        thr_s = r.seconds;
      }
    std::vector<TorchPeerConfig> cs = compiled_configs(in, thr, opt.probe_cut, s.notes);
    const TorchPeerRun* fastest = nullptr;
    std::vector<TorchPeerRun> done;
    for (const TorchPeerConfig& c : cs) done.push_back(compiled(c, opt.compile_budget_s));
    for (const TorchPeerRun& r : done)
      if (r.ok && (!fastest || r.seconds < fastest->seconds)) fastest = &r;
    if (!opt.autotune || cs.empty()) continue;
    if (!fastest) {
      s.notes.push_back(in.label + ": max-autotune not tried: no default-mode compiled configuration ran");
      continue;
    }
    // max-autotune benchmarks GEMM candidates while it compiles (several times a default compile), so
    // only the precision and attention where default mode was fastest.
    TorchPeerConfig c = fastest->config;
    c.compile = TorchCompile::max_autotune;
    compiled(c, opt.autotune_budget_s);
  }
  return s;
}

void add_compile_figures(Report& report, const TorchPeerSweep& sweep, const std::string& tag) {
  for (const TorchPeerRun& r : sweep.runs)
    if (r.ok && r.config.compile != TorchCompile::eager)
      report.add({"torch_compile_s_" + r.config.name() + tag, r.compile_seconds, "s", 0, 0, "lower"});
}

std::string torch_peer_table(const TorchPeerSweep& s) {
  std::string t;
  char line[768];
  std::snprintf(line, sizeof line, "  PyTorch peer, GPT-2 124M, batch %lld x seq %lld:\n",
                static_cast<long long>(s.batch), static_cast<long long>(s.seq));
  t += line;
  std::snprintf(line, sizeof line, "    %-32s %-14s %4s %-5s %-7s %-8s %10s %10s %10s %10s\n", "config", "torch", "thr",
                "prec", "attn", "mode", "s/step", "tokens/s", "cpu s", "compile s");
  t += line;
  const double tokens = static_cast<double>(s.batch * s.seq);
  for (std::size_t i = 0; i < s.runs.size(); ++i) {
    const TorchPeerRun& r = s.runs[i];
    const TorchPeerConfig& c = r.config;
    const char* mode = c.compile == TorchCompile::default_mode   ? "compile"
                       : c.compile == TorchCompile::max_autotune ? "autotune"
                                                                 : "eager";
    const int n = std::snprintf(line, sizeof line, "    %-32s %-14s %4d %-5s %-7s %-8s ", c.name().c_str(),
                                c.interp.torch_version.c_str(), c.threads, c.bf16 ? "bf16" : "fp32",
                                c.sdpa ? "sdpa" : "masked", mode);
    char* rest = line + n;
    const std::size_t room = sizeof line - static_cast<std::size_t>(n);
    if (r.ok) {
      char compile[32] = "-";
      if (c.compile != TorchCompile::eager) std::snprintf(compile, sizeof compile, "%.1f", r.compile_seconds);
      std::snprintf(rest, room, "%10.2f %10.1f %10.2f %10s%s\n", r.seconds, tokens / r.seconds, r.cpu_seconds, compile,
                    static_cast<int>(i) == s.best ? "  <- best" : "");
    } else if (r.stopped) {  // a lower bound: it was stopped mid-step (or mid-compile)
      std::snprintf(rest, room, "%9s%-.2f   (%s)\n", "> ", r.stopped_above, r.error.c_str());
    } else {
      // "failed to compile: ..." / "failed to run: ..." say it themselves; a timeout or a crash does not
      std::snprintf(rest, room, "%s%s\n", r.error.rfind("failed", 0) == 0 ? "" : "failed: ", r.error.c_str());
    }
    t += line;
  }
  for (const std::string& n : s.notes) t += "    note: " + n + "\n";
  if (s.best < 0) t += "    no PyTorch configuration ran\n";
  return t;
}

}  // namespace mt::bench
