// The run's kernel choices, made by measurement on the machine that runs: today two, both for bf16 runs
// on the CPU backend: the path of the bf16 linear products (kernels/cpu/ops_bf16.hpp: oneDNN's bf16 matmul
// or the operands widened to fp32) and the attention's block products (kernels/cpu/ops.hpp AttnProducts:
// fp32, or bf16 pairs on vdpbf16ps). Each is decided once, before the first product, in this order:
//   1. MEGATRAIN_BF16_GEMM=onednn|widened, MEGATRAIN_BF16_ATTENTION=pairs|fp32 force them (comparisons, tests);
//   2. (the products' path only) a path already fixed in this process (an earlier run of the Python module) stays;
//   3. a resumed checkpoint's recorded choice ("kernel_choices" in its run state), so the bits continue;
//      one this CPU cannot run is said and the other taken;
//   4. the cache file, keyed by CPU model, ISA flags, oneDNN version, thread count and the run's shapes;
//   5. the probe (cpu::probe_bf16_gemm on the run's own linear shapes, ~0.2 s; cpu::probe_bf16_attention
//      on its heads, ~0.1 s), then cached.
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

#include "actors/engine.hpp"
#include "config/train_config.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/ops_bf16.hpp"
#include "kernels/model_config.hpp"

namespace mt::actors {

// What a cached choice is keyed by: the machine, the library and the work.
struct KernelCacheKey {
  std::string cpu;     // /proc/cpuinfo: model name, family, model
  std::string isa;     // cpuinfo's avx2 / avx512 / amx flags, and the ISA oneDNN dispatches to
  std::string onednn;  // oneDNN's version
  int threads = 0;     // compute threads
  std::string shapes;  // the run's probed shapes: "rows x in x out" each, then the attention's
  bool operator==(const KernelCacheKey& o) const {
    return cpu == o.cpu && isa == o.isa && onednn == o.onednn && threads == o.threads && shapes == o.shapes;
  }
};

// Either choice may be missing (it was forced or recorded when the entry was written): a missing one is
// measured and added.
struct KernelCacheEntry {
  KernelCacheKey key;
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
  bool applies = false;  // bf16 compute on the CPU backend; otherwise nothing was chosen
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
  // "bf16 products: onednn (probe: ...)"
  std::string line() const;
  // "attention products: pairs (probe: ...)"
  std::string attention_line() const;
  // {"bf16_gemm": {"path", "source", "detail", "probe": {...}, "cache_file"}, "bf16_attention": {"path",
  // "source", "detail", "probe": {...}}} ({} when !applies): the monitor's /status run.kernel_choices and
  // the events.jsonl "kernel_choice" event.
  nlohmann::json json() const;
};

struct KernelChoiceInputs {
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

// The decision alone (no process state touched), in the order of the file comment.
KernelChoice decide_kernel_choice(const KernelChoiceInputs& in);

// The linear products of one layer of `model` at `rows` tokens (attention and MLP projections), and the
// LM head's at `head_rows`.
std::vector<cpu::Bf16ProbeShape> bf16_probe_shapes(const ModelConfig& model, std::int64_t rows, std::int64_t head_rows);
// The attention the probe times: the run's heads at its sequence length (batch 1, plain causal).
AttnShape attention_probe_shape(const ModelConfig& model, std::int64_t seq);
// This machine's key for `threads`, the linear `shapes` and the attention's.
KernelCacheKey kernel_cache_key(int threads, const std::vector<cpu::Bf16ProbeShape>& shapes,
                                const AttnShape& attention);

// For a run: the inputs from the environment, this process, the resumed run state (`run_state`, {} when
// not resuming), the cache and the probes; the choices are then set (cpu::set_bf16_gemm_path,
// cpu::set_bf16_attention_products). Nothing applies (applies = false) without bf16 compute on the CPU
// backend. Throws std::invalid_argument for a malformed MEGATRAIN_BF16_GEMM or MEGATRAIN_BF16_ATTENTION.
KernelChoice choose_kernels(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan,
                            const nlohmann::json& run_state);

}  // namespace mt::actors
