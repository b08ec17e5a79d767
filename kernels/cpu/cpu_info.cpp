#include "kernels/cpu/cpu_info.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace mt::cpu {

namespace {

// The first value of each /proc/cpuinfo key (the first processor describes them all).
std::unordered_map<std::string, std::string> cpuinfo() {
  std::unordered_map<std::string, std::string> kv;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    kv.emplace(key, colon + 2 <= line.size() ? line.substr(colon + 2) : "");
  }
  return kv;
}

}  // namespace

std::string cpu_model() {
  auto kv = cpuinfo();
  if (kv.count("model name") == 0) return "unknown CPU";
  return kv["model name"] + " (family " + kv["cpu family"] + " model " + kv["model"] + ")";
}

std::string cpu_isa_flags() {
  auto kv = cpuinfo();
  std::istringstream flags(kv["flags"]);
  std::vector<std::string> present;
  for (std::string f; flags >> f;) present.push_back(f);
  std::string out;
  for (const char* w :
       {"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"})
    if (std::find(present.begin(), present.end(), w) != present.end()) out += (out.empty() ? "" : " ") + std::string(w);
  if (out.empty()) out = "(none of avx2/avx512/amx)";
  return avx512_allowed() ? out : out + " held:avx2";
}

bool avx512_allowed() {
  static const bool allowed = [] {
    const char* e = std::getenv("MEGATRAIN_MAX_CPU_ISA");
    std::string v = e ? e : "";
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
    if (v.empty() || v == "avx512") return true;
    if (v == "avx2") return false;
    throw std::invalid_argument("MEGATRAIN_MAX_CPU_ISA=" + v + ": expected avx2 or avx512 (or unset)");
  }();
  return allowed;
}

}  // namespace mt::cpu
