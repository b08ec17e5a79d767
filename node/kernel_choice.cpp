#include "node/kernel_choice.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include "kernels/cpu/cpu_info.hpp"
#include "kernels/stage_api.hpp"

namespace mt::actors {

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

nlohmann::json entry_json(const KernelCacheEntry& e) {
  return {{"cpu", e.key.cpu},         {"isa", e.key.isa},         {"onednn", e.key.onednn},
          {"threads", e.key.threads}, {"shapes", e.key.shapes},   {"bf16_gemm", cpu::bf16_gemm_name(e.bf16_gemm)},
          {"onednn_s", e.onednn_s},   {"widened_s", e.widened_s}, {"probed_unix", e.probed_unix}};
}

KernelCacheEntry entry_from_json(const nlohmann::json& j) {
  KernelCacheEntry e;
  e.key.cpu = j.at("cpu").get<std::string>();
  e.key.isa = j.at("isa").get<std::string>();
  e.key.onednn = j.at("onednn").get<std::string>();
  e.key.threads = j.at("threads").get<int>();
  e.key.shapes = j.at("shapes").get<std::string>();
  const auto p = cpu::parse_bf16_gemm(j.at("bf16_gemm").get<std::string>());
  if (!p) throw std::runtime_error("an entry's bf16_gemm is " + j.at("bf16_gemm").dump() + ", not onednn or widened");
  e.bf16_gemm = *p;
  e.onednn_s = j.value("onednn_s", 0.0);
  e.widened_s = j.value("widened_s", 0.0);
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

std::optional<cpu::Bf16Gemm> checkpoint_path(const nlohmann::json& ck, std::vector<std::string>& notes) {
  if (!ck.is_object() || !ck.contains("bf16_gemm")) return std::nullopt;
  const auto& v = ck["bf16_gemm"];
  const auto p = v.is_string() ? cpu::parse_bf16_gemm(v.get<std::string>()) : std::nullopt;
  if (!p)
    notes.push_back("the checkpoint's kernel_choices.bf16_gemm is " + v.dump() +
                    ", not onednn or widened: ignored (the path is measured again)");
  return p;
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

std::string KernelChoice::line() const {
  return std::string("bf16 products: ") + cpu::bf16_gemm_name(bf16_gemm) + " (" + detail + ")";
}

nlohmann::json KernelChoice::json() const {
  if (!applies) return nlohmann::json::object();
  nlohmann::json g{{"path", cpu::bf16_gemm_name(bf16_gemm)}, {"source", source}, {"detail", detail}};
  if (probe)
    g["probe"] = {{"onednn_s", probe->onednn_s},        {"widened_s", probe->widened_s},
                  {"speedup", probe->onednn_speedup()}, {"shapes", probe->shapes.size()},
                  {"products", probe->products},        {"rounds", probe->rounds},
                  {"threads", probe->threads},          {"wall_s", probe->wall_s}};
  if (!cache_file.empty()) g["cache_file"] = cache_file;
  return {{"bf16_gemm", g}};
}

KernelChoice decide_kernel_choice(const KernelChoiceInputs& in) {
  using cpu::Bf16Gemm;
  KernelChoice c;
  c.applies = true;
  const std::optional<Bf16Gemm> recorded = checkpoint_path(in.checkpoint, c.notes);
  // A kept path that is not the checkpoint's changes the continued run's bits: say so.
  auto differs_from_checkpoint = [&](const char* why) {
    if (recorded && *recorded != c.bf16_gemm)
      c.notes.push_back(std::string("the checkpoint's run computed its bf16 products on the ") +
                        cpu::bf16_gemm_name(*recorded) + " path; " + why + " " + cpu::bf16_gemm_name(c.bf16_gemm) +
                        ", so the continued run's bits differ from an uninterrupted one");
  };
  if (in.forced) {
    c.source = "forced";
    c.bf16_gemm = *in.forced == Bf16Gemm::onednn && !in.onednn_available ? Bf16Gemm::widened : *in.forced;
    c.detail = c.bf16_gemm == *in.forced ? "forced by MEGATRAIN_BF16_GEMM"
                                         : "MEGATRAIN_BF16_GEMM=onednn, but oneDNN has no bf16 kernels on this CPU";
    differs_from_checkpoint("MEGATRAIN_BF16_GEMM forces");
    return c;
  }
  if (in.process) {
    c.source = "process";
    c.bf16_gemm = *in.process;
    c.detail = "fixed by an earlier run in this process";
    differs_from_checkpoint("this process already runs");
    return c;
  }
  if (recorded) {
    c.source = "checkpoint";
    if (*recorded == Bf16Gemm::onednn && !in.onednn_available) {
      c.bf16_gemm = Bf16Gemm::widened;
      c.detail = "the checkpoint's run used onednn, which this CPU cannot run: oneDNN has no bf16 kernels here";
      c.notes.push_back(
          "the checkpoint's run computed its bf16 products with oneDNN's bf16 matmul, which this CPU cannot run "
          "(no oneDNN bf16 kernels); continuing on the widened path, so the continued run's bits differ from an "
          "uninterrupted one");
    } else {
      c.bf16_gemm = *recorded;
      c.detail = "from the checkpoint";
    }
    return c;
  }
  if (!in.onednn_available) {
    c.source = "unavailable";
    c.bf16_gemm = Bf16Gemm::widened;
    c.detail = "oneDNN has no bf16 kernels on this CPU";
    return c;
  }
  if (!in.cache_file.empty()) {
    std::string warning;
    if (const auto hit = read_kernel_cache(in.cache_file, in.key, warning)) {
      c.source = "cache";
      c.bf16_gemm = hit->bf16_gemm;
      c.cache_file = in.cache_file.string();
      c.detail = "measured earlier on this machine: oneDNN at " +
                 fmt("%.2fx", hit->onednn_s > 0 ? hit->widened_s / hit->onednn_s : 0.0) +
                 " the widened path's speed; cached in " + c.cache_file;
      return c;
    }
    if (!warning.empty()) c.notes.push_back(warning);
  }
  if (!in.probe) throw std::logic_error("decide_kernel_choice: no probe to run");
  c.source = "probe";
  c.probe = in.probe();
  c.bf16_gemm = c.probe->choice;
  c.detail = probe_words(*c.probe);
  if (in.cache_file.empty()) {
    c.detail += "; not cached: neither XDG_CACHE_HOME nor HOME is set";
    return c;
  }
  KernelCacheEntry e;
  e.key = in.key;
  e.bf16_gemm = c.bf16_gemm;
  e.onednn_s = c.probe->onednn_s;
  e.widened_s = c.probe->widened_s;
  e.probed_unix = in.now_unix ? in.now_unix() : unix_now();
  std::string warning;
  if (write_kernel_cache(in.cache_file, e, warning)) {
    c.cache_file = in.cache_file.string();
    c.detail += "; cached in " + c.cache_file;
  } else {
    c.notes.push_back(warning);
    c.detail += "; not cached";
  }
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
  s.push_back({rows, d, ff});  // MLP up (and Llama's gate)
  s.push_back({rows, ff, d});  // MLP down
  if (head_rows > 0) s.push_back({head_rows, d, m.vocab_size});
  return s;
}

KernelCacheKey kernel_cache_key(int threads, const std::vector<cpu::Bf16ProbeShape>& shapes) {
  KernelCacheKey k;
  k.cpu = cpu::cpu_model();
  k.isa = cpu::cpu_isa_flags() + " ";
  k.isa += "onednn:" + cpu::onednn_isa();
  k.onednn = cpu::onednn_version();
  k.threads = threads;
  for (const auto& s : shapes)
    k.shapes += (k.shapes.empty() ? "" : ", ") + std::to_string(s.rows) + "x" + std::to_string(s.in) + "x" +
                std::to_string(s.out);
  return k;
}

KernelChoice choose_kernels(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan,
                            const nlohmann::json& run_state) {
  if (cfg.precision() != Precision::bf16 || cfg.device.backend != "cpu") return {};
  KernelChoiceInputs in;
  in.forced = cpu::bf16_gemm_forced();
  if (cpu::bf16_gemm_fixed()) in.process = cpu::bf16_gemm_path();
  if (run_state.is_object() && run_state.contains("kernel_choices")) in.checkpoint = run_state["kernel_choices"];
  in.onednn_available = cpu::bf16_gemm_onednn_available();
  in.cache_file = kernel_cache_file();
  const int threads = std::max(1, plan.threads.blas);
  const std::int64_t rows = plan.batch * plan.seq;
  const auto shapes = bf16_probe_shapes(model, rows, head_chunk_tokens(model, plan.batch, plan.seq));
  in.key = kernel_cache_key(threads, shapes);
  in.probe = [&] { return cpu::probe_bf16_gemm(shapes, threads); };
  KernelChoice c = decide_kernel_choice(in);
  const cpu::Bf16Gemm got = cpu::set_bf16_gemm_path(c.bf16_gemm);
  if (got != c.bf16_gemm) {  // not expected: the decision saw what the kernels see
    c.notes.push_back(std::string("the bf16 products run on the ") + cpu::bf16_gemm_name(got) + " path, not " +
                      cpu::bf16_gemm_name(c.bf16_gemm));
    c.bf16_gemm = got;
  }
  return c;
}

}  // namespace mt::actors
