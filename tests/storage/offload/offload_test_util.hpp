// Shared by the offload tests: a temporary directory, moments that look like a training run's.
#pragma once
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace mt::test {

class OffloadTempDir {
 public:
  OffloadTempDir() {
    char tmpl[] = "/tmp/mt-offload-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~OffloadTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// m ~ N(0, 1e-3) with a heavy tail, v ~ m^2 scaled, some exact zeros (rows that saw no gradient).
inline void fake_moments(std::size_t n, std::uint32_t seed, float* m, float* v) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) {
    const float scale = (i % 97 == 0) ? 30.0f : 1.0f;
    m[i] = (i % 251 == 7) ? 0.0f : 1e-3f * scale * g(rng);
    const float a = g(rng);
    v[i] = (i % 251 == 7) ? 0.0f : 1e-6f * scale * scale * (0.1f + a * a);
  }
}

}  // namespace mt::test
