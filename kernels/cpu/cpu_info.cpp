#include "kernels/cpu/cpu_info.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
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
  return out.empty() ? "(none of avx2/avx512/amx)" : out;
}

}  // namespace mt::cpu
