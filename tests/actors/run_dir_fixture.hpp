// Helpers for the actor tests that write runs to disk: a scratch directory per test process, and
// checkpoints compared bit for bit. Includes no CAF.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kernels/param_layout.hpp"
#include "storage/checkpoint/checkpoint_reader.hpp"

namespace mt::test {

// TMPDIR/mt_TAG_PID, emptied when made and removed when done: the pid keeps tests that ctest runs in
// parallel (each test case is its own process) apart.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    path = std::filesystem::temp_directory_path() / ("mt_" + tag + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// The two checkpoints hold the same bits in every state of every stage.
inline bool same_checkpoints(const std::filesystem::path& a, const std::filesystem::path& b) {
  const ckpt::CheckpointReader ra(a), rb(b);
  const ModelConfig& m = ra.model_config();
  for (std::int64_t s = 0; s < num_stages(m); ++s) {
    const std::size_t n = static_cast<std::size_t>(stage_layout(m, s).total_floats);
    std::vector<float> x(3 * n), y(3 * n);
    ra.read_stage(s, x.data(), x.data() + n, x.data() + 2 * n);
    rb.read_stage(s, y.data(), y.data() + n, y.data() + 2 * n);
    if (std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

}  // namespace mt::test
