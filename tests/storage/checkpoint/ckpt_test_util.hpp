// Helpers shared by the storage and tools tests: temporary directories, shell commands, tiny models.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/model_config.hpp"
#include "kernels/param_layout.hpp"

namespace mt::test {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mt-ckpt-test-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& s) const { return path_ / s; }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int status = -1;     // exit status, or -1 when killed by a signal
  std::string output;  // stdout and stderr
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline std::string quote(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

inline ModelConfig tiny_config(Arch arch, std::int64_t layers = 2) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = arch == Arch::gpt2 ? 4 : 2;
  c.head_dim = 8;
  c.intermediate_size = arch == Arch::gpt2 ? 128 : 64;
  c.max_position_embeddings = 64;
  c.attention_bias = arch == Arch::qwen2;
  c.qk_norm = arch == Arch::qwen3;
  c.tie_word_embeddings = arch == Arch::gpt2;
  c.norm_eps = arch == Arch::gpt2 ? 1e-5f : 1e-6f;
  return c;
}

// Deterministic, distinct values per (stage, state): a checkpoint read back must match bit for bit.
inline std::vector<float> stage_values(const ModelConfig& c, std::int64_t stage, int state) {
  const ParamLayout layout = stage_layout(c, stage);
  std::vector<float> v(layout.total_floats, 0.0f);
  std::mt19937 rng(static_cast<unsigned>(stage * 7919 + state * 104729 + 1));
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (const auto& t : layout.tensors)
    for (std::size_t i = 0; i < t.numel; ++i) v[t.offset + i] = nd(rng);
  return v;
}

inline void flip_byte(const std::filesystem::path& file, std::uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char b = 0;
  f.read(&b, 1);
  b = static_cast<char>(b ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&b, 1);
}

}  // namespace mt::test
