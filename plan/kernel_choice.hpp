// The run's kernel choices, made by measurement on the machine that runs, on the CPU backend: the library
// of the fp32 linear products, per product (kernels/cpu/ops.hpp Fp32GemmChoice: oneDNN's or OpenBLAS's
// sgemm for the forward, backward-input and backward-weight products), and for bf16 runs the path of the
// bf16 linear products (kernels/cpu/ops_bf16.hpp: oneDNN's bf16 matmul or the operands widened to fp32
// and the fp32 products) and the attention's block products (kernels/cpu/ops.hpp AttnProducts: fp32, or
// bf16 pairs on vdpbf16ps). Each is decided once, before the first product, in this order:
//   1. MEGATRAIN_FP32_GEMM=onednn|openblas, MEGATRAIN_BF16_GEMM=onednn|widened,
//      MEGATRAIN_BF16_ATTENTION=pairs|fp32 force them (comparisons, tests);
//   2. (the products' libraries and path) a choice already fixed in this process (an earlier run of the
//      Python module, or products run before the run) stays;
//   3. a resumed checkpoint's recorded choice ("kernel_choices" in its run state), so the bits continue;
//      one this CPU cannot run is said and the other taken; a checkpoint written before the fp32 choice
//      existed ran oneDNN, and keeps it;
//   4. the cache file, keyed by CPU model, ISA flags, oneDNN and OpenBLAS versions (OpenBLAS's core
//      included), thread count and the run's shapes;
//   5. the probe (cpu::probe_fp32_gemm and cpu::probe_bf16_gemm on the run's own linear shapes, ~0.2 s
//      each; cpu::probe_bf16_attention on its heads, ~0.1 s), then cached. The fp32 choice is made first:
//      the bf16 probe's widened path runs on it.
// The cache is a small JSON file, $XDG_CACHE_HOME/megatrain/kernel_choices.json (or
// ~/.cache/megatrain/...); a corrupt or unreadable one is ignored with a warning. No CAF here.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/train_config.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/ops_bf16.hpp"
#include "kernels/model_config.hpp"
#include "plan/engine_plan.hpp"

namespace mt::plan {

// What a cached choice is keyed by: the machine, the library and the work.
struct KernelCacheKey {
  std::string cpu;     // /proc/cpuinfo: model name, family, model
  std::string isa;     // cpuinfo's avx2 / avx512 / amx flags, and the ISA oneDNN dispatches to
  std::string onednn;  // oneDNN's version
  std::string blas;    // OpenBLAS's build and core (cpu::openblas_version; "" in entries written before it)
  int threads = 0;     // compute threads
  std::string shapes;  // the run's probed shapes: "rows x in x out" each, then the attention's
  bool operator==(const KernelCacheKey& o) const {
    return cpu == o.cpu && isa == o.isa && onednn == o.onednn && blas == o.blas && threads == o.threads &&
           shapes == o.shapes;
  }
};

// Any choice may be missing (it was forced or recorded when the entry was written, or the run was fp32):
// a missing one is measured and added.
struct KernelCacheEntry {
  KernelCacheKey key;
  std::optional<cpu::Fp32GemmChoice> fp32_gemm;
  double fp32_onednn_s[cpu::kLinearProducts] = {}, fp32_openblas_s[cpu::kLinearProducts] = {};  // its probe
  std::optional<cpu::Bf16Gemm> bf16_gemm;
  double onednn_s = 0.0, widened_s = 0.0;  // the products' probe, totals
  std::optional<cpu::AttnProducts> bf16_attention;
  double attention_fp32_s = 0.0, attention_pairs_s = 0.0;  // the attention's probe
  double probed_unix = 0.0;
};

// $XDG_CACHE_HOME/megatrain/kernel_choices.json when XDG_CACHE_HOME is absolute, else
// $HOME/.cache/megatrain/kernel_choices.json; empty when neither is set.
std::filesystem::path kernel_cache_file();

// The entry for `key`, or nullopt: no file, no such entry, or a file that cannot be read or parsed (then
// `warning` says so in one line, naming the file).
std::optional<KernelCacheEntry> read_kernel_cache(const std::filesystem::path& file, const KernelCacheKey& key,
                                                  std::string& warning);
// Adds or replaces the entry (keeping the file's other entries, up to 64), written to a temporary file
// and renamed. false, with `warning`, when it cannot.
bool write_kernel_cache(const std::filesystem::path& file, const KernelCacheEntry& entry, std::string& warning);

// The choices and why.
struct KernelChoice {
  bool applies = false;  // the CPU backend; otherwise nothing was chosen
  cpu::Fp32GemmChoice fp32_gemm;
  std::string fp32_source;  // forced | process | checkpoint | cache | probe
  std::string fp32_detail;
  std::optional<cpu::Fp32Probe> fp32_probe;
  bool bf16 = false;  // bf16 compute: the choices below were made too
  cpu::Bf16Gemm bf16_gemm = cpu::Bf16Gemm::widened;
  std::string source;  // forced | process | checkpoint | cache | probe | unavailable
  std::string detail;  // why, in words (the printed line's parenthesis)
  std::optional<cpu::Bf16Probe> probe;
  cpu::AttnProducts attention = cpu::AttnProducts::fp32;
  std::string attention_source;  // forced | checkpoint | cache | probe | unavailable
  std::string attention_detail;
  std::optional<cpu::AttnProbe> attention_probe;
  std::string cache_file;          // where it was read from or written to ("" = none)
  std::vector<std::string> notes;  // warnings: the cache unreadable, the checkpoint's path not kept, ...
  // "fp32 products: onednn (probe: ...)", or per product when they differ
  std::string fp32_line() const;
  // "bf16 products: onednn (probe: ...)"
  std::string line() const;
  // "attention products: pairs (probe: ...)"
  std::string attention_line() const;
  // {"fp32_gemm": {"path", "forward", "backward_input", "backward_weight", "source", "detail", "probe": {...},
  // "cache_file"}, and with bf16: "bf16_gemm": {"path", "source", "detail", "probe": {...}, "cache_file"},
  // "bf16_attention": {"path", "source", "detail", "probe": {...}}} ({} when !applies): the monitor's
  // /status run.kernel_choices and the events.jsonl "kernel_choice" event.
  nlohmann::json json() const;
};

struct KernelChoiceInputs {
  bool fp32 = true;                                 // choose the fp32 products' libraries
  std::optional<cpu::Fp32Gemm> fp32_forced;         // MEGATRAIN_FP32_GEMM
  std::optional<cpu::Fp32GemmChoice> fp32_process;  // already fixed in this process
  bool resuming = false;                            // a checkpoint's run state (checkpoint may still lack a choice)
  std::function<cpu::Fp32Probe()> fp32_probe;
  // Fixes the fp32 choice and returns the one in effect, before the bf16 choices (the bf16 probe's
  // widened path runs on it); null: nothing fixed.
  std::function<cpu::Fp32GemmChoice(const cpu::Fp32GemmChoice&)> fix_fp32;
  bool bf16 = true;                      // bf16 compute: choose the bf16 products' path and the attention's
  std::optional<cpu::Bf16Gemm> forced;   // MEGATRAIN_BF16_GEMM
  std::optional<cpu::Bf16Gemm> process;  // already fixed in this process
  nlohmann::json checkpoint;             // the resumed run state's "kernel_choices" (null / {}: none)
  bool onednn_available = false;
  std::optional<cpu::AttnProducts> attention_forced;  // MEGATRAIN_BF16_ATTENTION
  bool pairs_available = false;                       // AVX512-BF16: the attention's pair products run here
  std::filesystem::path cache_file;                   // "" = no cache
  KernelCacheKey key;
  std::function<cpu::Bf16Probe()> probe;
  std::function<cpu::AttnProbe()> attention_probe;
  std::function<double()> now_unix;  // the cache entry's time (null: the clock)
};

// The decision, in the order of the file comment; no process state touched but through in.fix_fp32.
KernelChoice decide_kernel_choice(const KernelChoiceInputs& in);

// The linear products of one layer of `model` at `rows` tokens (attention and MLP projections; with
// experts, one expert's at its share of the rows), and the LM head's at `head_rows`.
std::vector<cpu::Bf16ProbeShape> bf16_probe_shapes(const ModelConfig& model, std::int64_t rows, std::int64_t head_rows);
// The attention the probe times: the run's heads at its sequence length (batch 1, plain causal).
AttnShape attention_probe_shape(const ModelConfig& model, std::int64_t seq);
// This machine's key for `threads`, the linear `shapes` and the attention's (one key for fp32 and bf16
// runs of a model: their entries hold what each measured).
KernelCacheKey kernel_cache_key(int threads, const std::vector<cpu::Bf16ProbeShape>& shapes,
                                const AttnShape& attention);

// For a run: the inputs from the environment, this process, the resumed run state (`run_state`, {} when
// not resuming; a rank's state may carry only rank 0's "kernel_choices"), the cache and the probes; the
// choices are then set (cpu::set_fp32_gemm_choice, cpu::set_bf16_gemm_path,
// cpu::set_bf16_attention_products). Nothing applies (applies = false) off the CPU backend; the bf16
// choices only with bf16 compute. Throws std::invalid_argument for a malformed MEGATRAIN_FP32_GEMM,
// MEGATRAIN_BF16_GEMM or MEGATRAIN_BF16_ATTENTION.
KernelChoice choose_kernels(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan,
                            const nlohmann::json& run_state);

}  // namespace mt::plan
