#include "plan/kernel_choice.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "kernels/cpu/bf16_pairs.hpp"
#include "kernels/cpu/cpu_info.hpp"
#include "kernels/stage_api.hpp"

namespace mt::plan {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCacheFormat = "megatrain-kernel-choices";
constexpr int kCacheVersion = 1;
constexpr std::size_t kCacheEntries = 64;

std::string fmt(const char* f, double a, double b = 0.0) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

nlohmann::json per_product(const double (&v)[cpu::kLinearProducts]) {
  return nlohmann::json(std::vector<double>(v, v + cpu::kLinearProducts));
}

// Times per product, as written by per_product (0 where missing).
void read_per_product(const nlohmann::json& j, const char* key, double (&v)[cpu::kLinearProducts]) {
  const auto it = j.find(key);
  for (int i = 0; i < cpu::kLinearProducts; ++i)
    v[i] = it != j.end() && it->is_array() && it->size() > static_cast<std::size_t>(i) && (*it)[i].is_number()
               ? (*it)[i].get<double>()
               : 0.0;
}

// {"forward": "onednn", "backward_input": ..., "backward_weight": ..., and where a layer shape differs
// "shapes": [{"product", "in", "out", "lib"}]}: the run state's, the cache's and (with more fields) the
// event's form.
nlohmann::json fp32_json(const cpu::Fp32GemmChoice& c) {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < cpu::kLinearProducts; ++i)
    j[cpu::linear_product_name(static_cast<cpu::LinearProduct>(i))] = cpu::fp32_gemm_name(c.lib[i]);
  for (const auto& s : c.shapes)
    j["shapes"].push_back({{"product", cpu::linear_product_name(s.product)},
                           {"in", s.in},
                           {"out", s.out},
                           {"lib", cpu::fp32_gemm_name(s.lib)}});
  return j;
}

std::optional<cpu::LinearProduct> parse_product(const std::string& name) {
  for (int i = 0; i < cpu::kLinearProducts; ++i)
    if (name == cpu::linear_product_name(static_cast<cpu::LinearProduct>(i))) return static_cast<cpu::LinearProduct>(i);
  return std::nullopt;
}

// The "shapes" of that form into c; false when one is malformed.
bool parse_fp32_shapes(const nlohmann::json& j, cpu::Fp32GemmChoice& c) {
  const auto it = j.find("shapes");
  if (it == j.end()) return true;
  if (!it->is_array()) return false;
  for (const auto& e : *it) {
    if (!e.is_object() || !e.value("product", nlohmann::json()).is_string() ||
        !e.value("in", nlohmann::json()).is_number_integer() || !e.value("out", nlohmann::json()).is_number_integer() ||
        !e.value("lib", nlohmann::json()).is_string())
      return false;
    const auto product = parse_product(e["product"].get<std::string>());
    const auto lib = cpu::parse_fp32_gemm(e["lib"].get<std::string>());
    if (!product || !lib) return false;
    c.shapes.push_back({*product, e["in"].get<std::int64_t>(), e["out"].get<std::int64_t>(), *lib});
  }
  return true;
}

// That form, or one library's name for all three; nullopt for anything else.
std::optional<cpu::Fp32GemmChoice> parse_fp32_choice(const nlohmann::json& j) {
  if (j.is_string()) {
    const auto g = cpu::parse_fp32_gemm(j.get<std::string>());
    return g ? std::optional(cpu::Fp32GemmChoice::all(*g)) : std::nullopt;
  }
  if (!j.is_object()) return std::nullopt;
  cpu::Fp32GemmChoice c;
  for (int i = 0; i < cpu::kLinearProducts; ++i) {
    const auto it = j.find(cpu::linear_product_name(static_cast<cpu::LinearProduct>(i)));
    if (it == j.end() || !it->is_string()) return std::nullopt;
    const auto g = cpu::parse_fp32_gemm(it->get<std::string>());
    if (!g) return std::nullopt;
    c.lib[i] = *g;
  }
  if (!parse_fp32_shapes(j, c)) return std::nullopt;
  return c;
}

nlohmann::json entry_json(const KernelCacheEntry& e) {
  nlohmann::json j{
      {"cpu", e.key.cpu},         {"isa", e.key.isa},       {"onednn", e.key.onednn},      {"blas", e.key.blas},
      {"threads", e.key.threads}, {"shapes", e.key.shapes}, {"probed_unix", e.probed_unix}};
  if (e.fp32_gemm)
    j.update({{"fp32_gemm", fp32_json(*e.fp32_gemm)},
              {"fp32_onednn_s", per_product(e.fp32_onednn_s)},
              {"fp32_openblas_s", per_product(e.fp32_openblas_s)}});
  if (e.bf16_gemm)
    j.update({{"bf16_gemm", cpu::bf16_gemm_name(*e.bf16_gemm)}, {"onednn_s", e.onednn_s}, {"widened_s", e.widened_s}});
  if (e.bf16_attention)
    j.update({{"bf16_attention", cpu::attn_products_name(*e.bf16_attention)},
              {"attention_fp32_s", e.attention_fp32_s},
              {"attention_pairs_s", e.attention_pairs_s}});
  return j;
}

KernelCacheEntry entry_from_json(const nlohmann::json& j) {
  KernelCacheEntry e;
  e.key.cpu = j.at("cpu").get<std::string>();
  e.key.isa = j.at("isa").get<std::string>();
  e.key.onednn = j.at("onednn").get<std::string>();
  e.key.blas = j.value("blas", "");
  e.key.threads = j.at("threads").get<int>();
  e.key.shapes = j.at("shapes").get<std::string>();
  if (j.contains("fp32_gemm")) {
    const auto c = parse_fp32_choice(j.at("fp32_gemm"));
    if (!c)
      throw std::runtime_error("an entry's fp32_gemm is " + j.at("fp32_gemm").dump() + ", not onednn or openblas");
    e.fp32_gemm = *c;
    read_per_product(j, "fp32_onednn_s", e.fp32_onednn_s);
    read_per_product(j, "fp32_openblas_s", e.fp32_openblas_s);
  }
  if (j.contains("bf16_gemm")) {
    const auto p = cpu::parse_bf16_gemm(j.at("bf16_gemm").get<std::string>());
    if (!p) throw std::runtime_error("an entry's bf16_gemm is " + j.at("bf16_gemm").dump() + ", not onednn or widened");
    e.bf16_gemm = *p;
    e.onednn_s = j.value("onednn_s", 0.0);
    e.widened_s = j.value("widened_s", 0.0);
  }
  if (j.contains("bf16_attention")) {
    const auto p = cpu::parse_attn_products(j.at("bf16_attention").get<std::string>());
    if (!p)
      throw std::runtime_error("an entry's bf16_attention is " + j.at("bf16_attention").dump() + ", not pairs or fp32");
    e.bf16_attention = *p;
    e.attention_fp32_s = j.value("attention_fp32_s", 0.0);
    e.attention_pairs_s = j.value("attention_pairs_s", 0.0);
  }
  e.probed_unix = j.value("probed_unix", 0.0);
  return e;
}

// Every entry of the file; throws naming what is wrong. A missing file has none.
std::vector<KernelCacheEntry> read_entries(const fs::path& file) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return {};
  std::ifstream in(file);
  if (!in) throw std::runtime_error("cannot open it");
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot read it");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("not JSON (") + e.what() + ")");
  }
  if (!j.is_object() || j.value("format", "") != kCacheFormat || j.value("format_version", 0) != kCacheVersion ||
      !j.contains("entries") || !j["entries"].is_array())
    throw std::runtime_error(std::string("not a ") + kCacheFormat + " version " + std::to_string(kCacheVersion) +
                             " file");
  std::vector<KernelCacheEntry> out;
  try {
    for (const auto& e : j["entries"]) out.push_back(entry_from_json(e));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("a malformed entry (") + e.what() + ")");
  }
  return out;
}

double unix_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string probe_words(const cpu::Bf16Probe& p) {
  std::string s = "probe: oneDNN's bf16 matmul at " + fmt("%.2fx", p.onednn_speedup()) +
                  " the widened path's speed on " + std::to_string(p.shapes.size()) + " shapes (" +
                  std::to_string(p.products) + " products) at " + std::to_string(p.threads) + " thread" +
                  (p.threads == 1 ? "" : "s") + ", " + fmt("%.0f ms", 1e3 * p.wall_s);
  if (p.choice == cpu::Bf16Gemm::widened) s += "; oneDNN needs " + fmt("%.2fx", cpu::kBf16OnednnMargin);
  return s;
}

std::string attention_probe_words(const cpu::AttnProbe& p) {
  std::string s = "probe: bf16 pairs at " + fmt("%.2fx", p.pairs_speedup()) + " fp32's speed on an attention of " +
                  std::to_string(p.shape.q_heads) + " heads (" + std::to_string(p.shape.kv_heads) + " kv, head_dim " +
                  std::to_string(p.shape.head_dim) + ") over " + std::to_string(p.shape.seq) + " positions at " +
                  std::to_string(p.threads) + " thread" + (p.threads == 1 ? "" : "s") + ", " +
                  fmt("%.0f ms", 1e3 * p.wall_s);
  if (p.choice == cpu::AttnProducts::fp32) s += "; pairs need " + fmt("%.2fx", cpu::kBf16PairsMargin);
  return s;
}

// A recorded choice's name: a string (the run state's form) or an object's "path" (the kernel_choice
// event's form, which rank 0 sends the other ranks).
std::optional<std::string> recorded_name(const nlohmann::json& ck, const char* key, std::string& shown) {
  if (!ck.is_object() || !ck.contains(key)) return std::nullopt;
  const auto& v = ck[key];
  shown = v.dump();
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("path") && v["path"].is_string()) return v["path"].get<std::string>();
  return std::string();
}

std::optional<cpu::Bf16Gemm> checkpoint_path(const nlohmann::json& ck, std::vector<std::string>& notes) {
  std::string shown;
  const auto name = recorded_name(ck, "bf16_gemm", shown);
  if (!name) return std::nullopt;
  const auto p = cpu::parse_bf16_gemm(*name);
  if (!p)
    notes.push_back("the checkpoint's kernel_choices.bf16_gemm is " + shown +
                    ", not onednn or widened: ignored (the path is measured again)");
  return p;
}

std::optional<cpu::AttnProducts> checkpoint_attention(const nlohmann::json& ck, std::vector<std::string>& notes) {
  std::string shown;
  const auto name = recorded_name(ck, "bf16_attention", shown);
  // A checkpoint that records the products' path but not this was written before the pair products
  // existed: its attention ran on fp32.
  if (!name) return ck.is_object() && ck.contains("bf16_gemm") ? std::optional(cpu::AttnProducts::fp32) : std::nullopt;
  const auto p = cpu::parse_attn_products(*name);
  if (!p)
    notes.push_back("the checkpoint's kernel_choices.bf16_attention is " + shown +
                    ", not pairs or fp32: ignored (the attention's products are measured again)");
  return p;
}

// The cache's entry for the run's key, read once and only when a choice gets that far.
class CacheLookup {
 public:
  CacheLookup(const KernelChoiceInputs& in, std::vector<std::string>& notes) : in_(in), notes_(notes) {}
  const std::optional<KernelCacheEntry>& entry() {
    if (!read_ && !in_.cache_file.empty()) {
      std::string warning;
      hit_ = read_kernel_cache(in_.cache_file, in_.key, warning);
      if (!warning.empty()) notes_.push_back(warning);
    }
    read_ = true;
    return hit_;
  }

 private:
  const KernelChoiceInputs& in_;
  std::vector<std::string>& notes_;
  bool read_ = false;
  std::optional<KernelCacheEntry> hit_;
};

std::string fp32_probe_words(const cpu::Fp32Probe& p) {
  std::string s = "probe: OpenBLAS at";
  for (int i = 0; i < cpu::kLinearProducts; ++i) {
    const auto product = static_cast<cpu::LinearProduct>(i);
    s += std::string(i ? "," : "") + " " + fmt("%.2fx", p.openblas_speedup(product)) + " " +
         cpu::linear_product_name(product);
  }
  return s + " of oneDNN's speed on " + std::to_string(p.shapes.size()) + " shapes at " + std::to_string(p.threads) +
         " thread" + (p.threads == 1 ? "" : "s") + ", " + fmt("%.0f ms", 1e3 * p.wall_s) + "; OpenBLAS needs " +
         fmt("%.2fx", cpu::kFp32OpenblasMargin);
}

std::optional<cpu::Fp32GemmChoice> checkpoint_fp32(const nlohmann::json& ck, std::vector<std::string>& notes) {
  if (!ck.is_object() || !ck.contains("fp32_gemm")) return std::nullopt;
  const auto c = parse_fp32_choice(ck["fp32_gemm"]);
  if (!c)
    notes.push_back("the checkpoint's kernel_choices.fp32_gemm is " + ck["fp32_gemm"].dump() +
                    ", not onednn or openblas per product: ignored (the libraries are measured again)");
  return c;
}

// One kernel choice's candidates, in the order they win: forced by the environment, fixed earlier in
// this process, the checkpoint's, nothing to choose on this CPU, the cache's, a probe. A value this CPU
// cannot run (runs_here false) falls back to `fallback`, and says so.
template <class V>
struct ChoiceRule {
  std::function<std::string(V)> name;         // the value in the notes
  std::function<std::string(V)> computed_on;  // "<what> on <value>", the checkpoint's in the notes
  std::function<bool(V)> runs_here = [](V) { return true; };
  V fallback{};
  std::optional<V> forced;
  std::string forced_detail, forced_why, forced_cannot_detail;
  std::optional<V> process;
  std::string process_detail;
  std::optional<V> recorded;
  std::string recorded_detail = "from the checkpoint", recorded_cannot_detail, recorded_cannot_note;
  std::string unavailable_detail;  // not empty: nothing to choose on this CPU, the fallback it is
  std::function<std::optional<std::pair<V, std::string>>()> cached;  // (value, detail) of the cache's entry
  std::function<std::pair<V, std::string>()> probe;                  // runs the probe: (value, detail)
};

template <class V>
struct Chosen {
  V value;
  std::string source, detail;
};

template <class V>
Chosen<V> decide(const ChoiceRule<V>& r, std::vector<std::string>& notes) {
  // A kept value that is not the checkpoint's changes the continued run's bits: say so.
  auto differs_from_checkpoint = [&](const Chosen<V>& c, const std::string& why) {
    if (r.recorded && *r.recorded != c.value)
      notes.push_back("the checkpoint's run computed its " + r.computed_on(*r.recorded) + "; " + why + " " +
                      r.name(c.value) + ", so the continued run's bits differ from an uninterrupted one");
    return c;
  };
  if (r.forced) {
    const bool runs = r.runs_here(*r.forced);
    return differs_from_checkpoint(
        {runs ? *r.forced : r.fallback, "forced", runs ? r.forced_detail : r.forced_cannot_detail}, r.forced_why);
  }
  if (r.process) return differs_from_checkpoint({*r.process, "process", r.process_detail}, "this process already runs");
  if (r.recorded) {
    if (r.runs_here(*r.recorded)) return {*r.recorded, "checkpoint", r.recorded_detail};
    notes.push_back(r.recorded_cannot_note);
    return {r.fallback, "checkpoint", r.recorded_cannot_detail};
  }
  if (!r.unavailable_detail.empty()) return {r.fallback, "unavailable", r.unavailable_detail};
  if (r.cached)
    if (auto hit = r.cached()) return {hit->first, "cache", hit->second};
  if (!r.probe) throw std::logic_error("decide_kernel_choice: no probe to run");
  auto [value, detail] = r.probe();
  return {value, "probe", detail};
}

const char* const kBitsDiffer = ", so the continued run's bits differ from an uninterrupted one";

void decide_fp32(const KernelChoiceInputs& in, KernelChoice& c, CacheLookup& cache) {
  ChoiceRule<cpu::Fp32GemmChoice> r;
  r.name = [](const cpu::Fp32GemmChoice& v) { return v.str(); };
  r.computed_on = [](const cpu::Fp32GemmChoice& v) { return "fp32 products on " + v.str(); };
  if (in.fp32_forced) r.forced = cpu::Fp32GemmChoice::all(*in.fp32_forced);
  r.forced_detail = "forced by MEGATRAIN_FP32_GEMM";
  r.forced_why = "MEGATRAIN_FP32_GEMM forces";
  r.process = in.fp32_process;
  r.process_detail = "fixed earlier in this process";
  r.recorded = checkpoint_fp32(in.checkpoint, c.notes);
  // A resumed run state without the choice was written before it existed: those runs ran oneDNN.
  if (!r.recorded && in.resuming && !(in.checkpoint.is_object() && in.checkpoint.contains("fp32_gemm"))) {
    r.recorded = cpu::Fp32GemmChoice{};
    r.recorded_detail = "from the checkpoint, written before the fp32 choice existed: oneDNN";
  }
  r.cached = [&]() -> std::optional<std::pair<cpu::Fp32GemmChoice, std::string>> {
    const auto& hit = cache.entry();
    if (!hit || !hit->fp32_gemm) return std::nullopt;
    c.cache_file = in.cache_file.string();
    return std::pair{*hit->fp32_gemm, "measured earlier on this machine; cached in " + c.cache_file};
  };
  if (in.fp32_probe)
    r.probe = [&] {
      c.fp32_probe = in.fp32_probe();
      return std::pair{c.fp32_probe->choice, fp32_probe_words(*c.fp32_probe)};
    };
  const auto chosen = decide(r, c.notes);
  c.fp32_gemm = chosen.value, c.fp32_source = chosen.source, c.fp32_detail = chosen.detail;
}

void decide_gemm(const KernelChoiceInputs& in, KernelChoice& c, CacheLookup& cache) {
  using cpu::Bf16Gemm;
  ChoiceRule<Bf16Gemm> r;
  r.name = [](Bf16Gemm v) { return std::string(cpu::bf16_gemm_name(v)); };
  r.computed_on = [](Bf16Gemm v) { return std::string("bf16 products on the ") + cpu::bf16_gemm_name(v) + " path"; };
  r.runs_here = [&](Bf16Gemm v) { return v != Bf16Gemm::onednn || in.onednn_available; };
  r.fallback = Bf16Gemm::widened;
  r.forced = in.forced;
  r.forced_detail = "forced by MEGATRAIN_BF16_GEMM";
  r.forced_why = "MEGATRAIN_BF16_GEMM forces";
  r.forced_cannot_detail = "MEGATRAIN_BF16_GEMM=onednn, but oneDNN has no bf16 kernels on this CPU";
  r.process = in.process;
  r.process_detail = "fixed by an earlier run in this process";
  r.recorded = checkpoint_path(in.checkpoint, c.notes);
  r.recorded_cannot_detail =
      "the checkpoint's run used onednn, which this CPU cannot run: oneDNN has no bf16 kernels here";
  r.recorded_cannot_note = std::string(
                               "the checkpoint's run computed its bf16 products with oneDNN's bf16 matmul, which this "
                               "CPU cannot run (no oneDNN bf16 kernels); continuing on the widened path") +
                           kBitsDiffer;
  if (!in.onednn_available) r.unavailable_detail = "oneDNN has no bf16 kernels on this CPU";
  r.cached = [&]() -> std::optional<std::pair<Bf16Gemm, std::string>> {
    const auto& hit = cache.entry();
    if (!hit || !hit->bf16_gemm) return std::nullopt;
    c.cache_file = in.cache_file.string();
    return std::pair{*hit->bf16_gemm, "measured earlier on this machine: oneDNN at " +
                                          fmt("%.2fx", hit->onednn_s > 0 ? hit->widened_s / hit->onednn_s : 0.0) +
                                          " the widened path's speed; cached in " + c.cache_file};
  };
  if (in.probe)
    r.probe = [&] {
      c.probe = in.probe();
      return std::pair{c.probe->choice, probe_words(*c.probe)};
    };
  const auto chosen = decide(r, c.notes);
  c.bf16_gemm = chosen.value, c.source = chosen.source, c.detail = chosen.detail;
}

void decide_attention(const KernelChoiceInputs& in, KernelChoice& c, CacheLookup& cache) {
  using cpu::AttnProducts;
  ChoiceRule<AttnProducts> r;
  r.name = [](AttnProducts v) { return std::string(cpu::attn_products_name(v)); };
  r.computed_on = [](AttnProducts v) {
    return std::string("attention on ") + cpu::attn_products_name(v) + " products";
  };
  r.runs_here = [&](AttnProducts v) { return v != AttnProducts::bf16_pairs || in.pairs_available; };
  r.fallback = AttnProducts::fp32;
  r.forced = in.attention_forced;
  r.forced_detail = "forced by MEGATRAIN_BF16_ATTENTION";
  r.forced_why = "MEGATRAIN_BF16_ATTENTION forces";
  r.forced_cannot_detail = "MEGATRAIN_BF16_ATTENTION=pairs, but this CPU has no AVX512-BF16";
  r.recorded = checkpoint_attention(in.checkpoint, c.notes);
  r.recorded_cannot_detail = "the checkpoint's run used pairs, which this CPU cannot run: no AVX512-BF16 here";
  r.recorded_cannot_note = std::string(
                               "the checkpoint's run computed its attention on bf16 pair products, which this CPU "
                               "cannot run (no AVX512-BF16); continuing on fp32 products") +
                           kBitsDiffer;
  if (!in.pairs_available) r.unavailable_detail = "no AVX512-BF16 on this CPU";
  r.cached = [&]() -> std::optional<std::pair<AttnProducts, std::string>> {
    const auto& hit = cache.entry();
    if (!hit || !hit->bf16_attention) return std::nullopt;
    c.cache_file = in.cache_file.string();
    return std::pair{
        *hit->bf16_attention,
        "measured earlier on this machine: bf16 pairs at " +
            fmt("%.2fx", hit->attention_pairs_s > 0 ? hit->attention_fp32_s / hit->attention_pairs_s : 0.0) +
            " fp32's speed; cached in " + c.cache_file};
  };
  if (in.attention_probe)
    r.probe = [&] {
      c.attention_probe = in.attention_probe();
      return std::pair{c.attention_probe->choice, attention_probe_words(*c.attention_probe)};
    };
  const auto chosen = decide(r, c.notes);
  c.attention = chosen.value, c.attention_source = chosen.source, c.attention_detail = chosen.detail;
}

// What was probed, added to the key's entry (its other choices kept), and said in the probed details.
void cache_probed(const KernelChoiceInputs& in, KernelChoice& c, CacheLookup& cache) {
  if (!c.fp32_probe && !c.probe && !c.attention_probe) return;
  auto append = [&](const std::string& words) {
    if (c.fp32_probe) c.fp32_detail += words;
    if (c.probe) c.detail += words;
    if (c.attention_probe) c.attention_detail += words;
  };
  if (in.cache_file.empty()) {
    append("; not cached: neither XDG_CACHE_HOME nor HOME is set");
    return;
  }
  KernelCacheEntry e = cache.entry().value_or(KernelCacheEntry{});
  e.key = in.key;
  if (c.fp32_probe) {
    e.fp32_gemm = c.fp32_gemm;
    std::copy(c.fp32_probe->onednn_s, c.fp32_probe->onednn_s + cpu::kLinearProducts, e.fp32_onednn_s);
    std::copy(c.fp32_probe->openblas_s, c.fp32_probe->openblas_s + cpu::kLinearProducts, e.fp32_openblas_s);
  }
  if (c.probe) {
    e.bf16_gemm = c.bf16_gemm;
    e.onednn_s = c.probe->onednn_s;
    e.widened_s = c.probe->widened_s;
  }
  if (c.attention_probe) {
    e.bf16_attention = c.attention;
    e.attention_fp32_s = c.attention_probe->fp32_s;
    e.attention_pairs_s = c.attention_probe->pairs_s;
  }
  e.probed_unix = in.now_unix ? in.now_unix() : unix_now();
  std::string warning;
  if (write_kernel_cache(in.cache_file, e, warning)) {
    c.cache_file = in.cache_file.string();
    append("; cached in " + c.cache_file);
  } else {
    c.notes.push_back(warning);
    append("; not cached");
  }
}

}  // namespace

fs::path kernel_cache_file() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg == '/') return fs::path(xdg) / "megatrain" / "kernel_choices.json";
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != 0) return fs::path(home) / ".cache" / "megatrain" / "kernel_choices.json";
  return {};
}

std::optional<KernelCacheEntry> read_kernel_cache(const fs::path& file, const KernelCacheKey& key,
                                                  std::string& warning) {
  warning.clear();
  try {
    for (const auto& e : read_entries(file))
      if (e.key == key) return e;
  } catch (const std::exception& e) {
    warning = "ignoring the kernel choice cache " + file.string() + ": " + e.what();
  }
  return std::nullopt;
}

bool write_kernel_cache(const fs::path& file, const KernelCacheEntry& entry, std::string& warning) {
  warning.clear();
  std::vector<KernelCacheEntry> entries;
  try {
    entries = read_entries(file);
  } catch (const std::exception&) {
    // A damaged file is replaced (reading it already warned).
  }
  entries.erase(std::remove_if(entries.begin(), entries.end(), [&](const auto& e) { return e.key == entry.key; }),
                entries.end());
  entries.push_back(entry);
  if (entries.size() > kCacheEntries)
    entries.erase(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(entries.size() - kCacheEntries));
  nlohmann::json j{{"format", kCacheFormat}, {"format_version", kCacheVersion}, {"entries", nlohmann::json::array()}};
  for (const auto& e : entries) j["entries"].push_back(entry_json(e));
  const fs::path tmp = file.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << '\n';
    out.close();
    if (!out) {
      fs::remove(tmp, ec);
      warning = "cannot write the kernel choice cache " + file.string() + " (writing " + tmp.string() + " failed)";
      return false;
    }
  }
  fs::rename(tmp, file, ec);
  if (ec) {
    fs::remove(tmp, ec);
    warning = "cannot write the kernel choice cache " + file.string() + ": " + ec.message();
    return false;
  }
  return true;
}

std::string KernelChoice::fp32_line() const { return "fp32 products: " + fp32_gemm.str() + " (" + fp32_detail + ")"; }

std::string KernelChoice::line() const {
  return std::string("bf16 products: ") + cpu::bf16_gemm_name(bf16_gemm) + " (" + detail + ")";
}

std::string KernelChoice::attention_line() const {
  return std::string("attention products: ") + cpu::attn_products_name(attention) + " (" + attention_detail + ")";
}

nlohmann::json KernelChoice::json() const {
  if (!applies) return nlohmann::json::object();
  nlohmann::json f = fp32_json(fp32_gemm);
  f.update({{"path", fp32_gemm.str()}, {"source", fp32_source}, {"detail", fp32_detail}});
  if (fp32_probe)
    f["probe"] = {{"onednn_s", per_product(fp32_probe->onednn_s)},
                  {"openblas_s", per_product(fp32_probe->openblas_s)},
                  {"shapes", fp32_probe->shapes.size()},
                  {"rounds", fp32_probe->rounds},
                  {"threads", fp32_probe->threads},
                  {"wall_s", fp32_probe->wall_s}};
  if (!cache_file.empty() && (fp32_source == "cache" || fp32_probe)) f["cache_file"] = cache_file;
  if (!bf16) return {{"fp32_gemm", f}};
  nlohmann::json g{{"path", cpu::bf16_gemm_name(bf16_gemm)}, {"source", source}, {"detail", detail}};
  if (probe)
    g["probe"] = {{"onednn_s", probe->onednn_s},        {"widened_s", probe->widened_s},
                  {"speedup", probe->onednn_speedup()}, {"shapes", probe->shapes.size()},
                  {"products", probe->products},        {"rounds", probe->rounds},
                  {"threads", probe->threads},          {"wall_s", probe->wall_s}};
  if (!cache_file.empty()) g["cache_file"] = cache_file;
  nlohmann::json a{
      {"path", cpu::attn_products_name(attention)}, {"source", attention_source}, {"detail", attention_detail}};
  if (!cache_file.empty() && (attention_source == "cache" || attention_probe)) a["cache_file"] = cache_file;
  if (attention_probe)
    a["probe"] = {{"fp32_s", attention_probe->fp32_s},
                  {"pairs_s", attention_probe->pairs_s},
                  {"speedup", attention_probe->pairs_speedup()},
                  {"seq", attention_probe->shape.seq},
                  {"rounds", attention_probe->rounds},
                  {"threads", attention_probe->threads},
                  {"wall_s", attention_probe->wall_s}};
  return {{"fp32_gemm", f}, {"bf16_gemm", g}, {"bf16_attention", a}};
}

KernelChoice decide_kernel_choice(const KernelChoiceInputs& in) {
  KernelChoice c;
  c.applies = true;
  c.bf16 = in.bf16;
  CacheLookup cache(in, c.notes);
  if (in.fp32) {
    decide_fp32(in, c, cache);
    const cpu::Fp32GemmChoice got = in.fix_fp32 ? in.fix_fp32(c.fp32_gemm) : c.fp32_gemm;
    if (got != c.fp32_gemm) {  // not expected: the decision saw what the kernels see
      c.notes.push_back("the fp32 products run on " + got.str() + ", not " + c.fp32_gemm.str());
      c.fp32_gemm = got;
    }
  }
  if (in.bf16) {
    decide_gemm(in, c, cache);
    decide_attention(in, c, cache);
  }
  cache_probed(in, c, cache);
  return c;
}

std::vector<cpu::Bf16ProbeShape> bf16_probe_shapes(const ModelConfig& m, std::int64_t rows, std::int64_t head_rows) {
  const std::int64_t d = m.hidden_size, ff = m.intermediate_size;
  std::vector<cpu::Bf16ProbeShape> s;
  if (m.arch == Arch::gpt2) {
    s.push_back({rows, d, 3 * d});  // fused q, k, v
    s.push_back({rows, d, d});      // attention output
  } else {
    s.push_back({rows, d, m.q_dim()});  // q (k and v are the same shape, narrower)
    s.push_back({rows, m.q_dim(), d});  // attention output
  }
  if (m.is_moe()) {  // one expert's products: its share of the rows, its width
    const std::int64_t expert_rows = std::max<std::int64_t>(1, rows * m.num_experts_per_tok / m.num_experts);
    s.push_back({expert_rows, d, m.moe_intermediate_size});
    s.push_back({expert_rows, m.moe_intermediate_size, d});
  } else {
    s.push_back({rows, d, ff});  // MLP up (and Llama's gate)
    s.push_back({rows, ff, d});  // MLP down
  }
  if (head_rows > 0) s.push_back({head_rows, d, m.vocab_size});
  return s;
}

AttnShape attention_probe_shape(const ModelConfig& m, std::int64_t seq) {
  AttnShape a;
  a.batch = 1;
  a.seq = std::max<std::int64_t>(1, std::min<std::int64_t>(seq, 1024));
  a.q_heads = m.num_attention_heads;
  a.kv_heads = m.num_key_value_heads > 0 ? m.num_key_value_heads : m.num_attention_heads;
  a.head_dim = m.head_dim;
  a.q_stride = a.o_stride = a.q_heads * a.head_dim;
  a.kv_stride = a.kv_heads * a.head_dim;
  return a;
}

KernelCacheKey kernel_cache_key(int threads, const std::vector<cpu::Bf16ProbeShape>& shapes,
                                const AttnShape& attention) {
  KernelCacheKey k;
  k.cpu = cpu::cpu_model();
  k.isa = cpu::cpu_isa_flags() + " ";
  k.isa += "onednn:" + cpu::onednn_isa();
  k.onednn = cpu::onednn_version();
  k.blas = cpu::openblas_version();
  k.threads = threads;
  for (const auto& s : shapes)
    k.shapes += (k.shapes.empty() ? "" : ", ") + std::to_string(s.rows) + "x" + std::to_string(s.in) + "x" +
                std::to_string(s.out);
  k.shapes += (k.shapes.empty() ? "" : ", ") + std::string("attention ") + std::to_string(attention.q_heads) + "x" +
              std::to_string(attention.kv_heads) + "x" + std::to_string(attention.head_dim) + " at " +
              std::to_string(attention.seq);
  return k;
}

namespace {

void set_bf16(KernelChoice& c) {
  const cpu::Bf16Gemm got = cpu::set_bf16_gemm_path(c.bf16_gemm);
  if (got != c.bf16_gemm) {
    c.notes.push_back(std::string("the bf16 products run on the ") + cpu::bf16_gemm_name(got) + " path, not " +
                      cpu::bf16_gemm_name(c.bf16_gemm));
    c.bf16_gemm = got;
  }
  const cpu::AttnProducts products = cpu::set_bf16_attention_products(c.attention);
  if (products != c.attention) {
    c.notes.push_back(std::string("the attention runs on ") + cpu::attn_products_name(products) + " products, not " +
                      cpu::attn_products_name(c.attention));
    c.attention = products;
  }
}

}  // namespace

KernelChoice choose_kernels(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan,
                            const nlohmann::json& run_state) {
  if (cfg.device.backend != "cpu") return {};
  KernelChoiceInputs in;
  in.bf16 = cfg.precision() == Precision::bf16;
  in.fp32_forced = cpu::fp32_gemm_forced();
  if (cpu::fp32_gemm_fixed()) in.fp32_process = cpu::fp32_gemm_choice();
  if (in.bf16) {
    in.forced = cpu::bf16_gemm_forced();
    if (cpu::bf16_gemm_fixed()) in.process = cpu::bf16_gemm_path();
  }
  if (run_state.is_object()) {
    if (run_state.contains("kernel_choices")) in.checkpoint = run_state["kernel_choices"];
    in.resuming = run_state.size() > (run_state.contains("kernel_choices") ? 1u : 0u);
  }
  in.onednn_available = cpu::bf16_gemm_onednn_available();
  in.cache_file = kernel_cache_file();
  const int threads = std::max(1, plan.threads.blas);
  const std::int64_t rows = plan.batch * plan.seq;
  const auto shapes = bf16_probe_shapes(model, rows, head_chunk_tokens(model, plan.batch, plan.seq));
  in.attention_forced = cpu::bf16_attention_forced();
  in.pairs_available = cpu::bf16_pairs_available();
  const AttnShape attention = attention_probe_shape(model, plan.seq);
  in.key = kernel_cache_key(threads, shapes, attention);
  in.fp32_probe = [&] { return cpu::probe_fp32_gemm(shapes, threads); };
  in.probe = [&] { return cpu::probe_bf16_gemm(shapes, threads); };
  in.attention_probe = [&] { return cpu::probe_bf16_attention(attention, threads); };
  in.fix_fp32 = [](const cpu::Fp32GemmChoice& want) { return cpu::set_fp32_gemm_choice(want); };
  KernelChoice c = decide_kernel_choice(in);
  if (c.bf16) set_bf16(c);
  return c;
}

}  // namespace mt::plan
