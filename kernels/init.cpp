// Seedable, deterministic parameter initialisation following Hugging Face's _init_weights, one
// independent random stream per stage (so the engine can initialise stages in any order, in parallel).
// The generator is our own (splitmix64 + Box-Muller in double) so the bits are the same on every
// platform and standard library.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/stage_api.hpp"

namespace mt {

namespace {

struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }  // (0, 1)
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void init_stage_params(const ModelConfig& c, std::int64_t stage, std::uint64_t seed, float* params, int threads) {
  c.validate();
  const ParamLayout layout = stage_layout(c, stage);
  std::memset(params, 0, layout.total_floats * sizeof(float));
  // Stream per stage: the seed and the stage index mixed through splitmix64; within the stage, every
  // tensor and every kChunk-element piece of it gets its own sub-stream, so the pieces can be drawn in
  // parallel and the result depends on nothing but (seed, stage, tensor, position).
  SplitMix64 mix{seed ^ (0xD1B54A32D192ED03ull * static_cast<std::uint64_t>(stage + 1))};
  const std::uint64_t stage_key = mix.next();
  constexpr std::size_t kChunk = 1 << 16;
  const double gpt2_proj_std = c.initializer_range / std::sqrt(2.0 * static_cast<double>(c.num_hidden_layers));
  for (std::size_t ti = 0; ti < layout.tensors.size(); ++ti) {
    const TensorSpec& t = layout.tensors[ti];
    float* p = params + t.offset;
    const bool is_norm = t.name.find("norm") != std::string::npos || t.name.rfind("ln_", 0) == 0 ||
                         t.name.find(".ln_") != std::string::npos;
    if (ends_with(t.name, ".bias")) continue;  // zeros
    if (is_norm) {
      if (ends_with(t.name, ".weight"))
        for (std::size_t i = 0; i < t.numel; ++i) p[i] = 1.0f;
      continue;
    }
    double stddev = c.initializer_range;
    if (c.is_gpt2() && ends_with(t.name, "c_proj.weight")) stddev = gpt2_proj_std;
    const std::int64_t chunks = static_cast<std::int64_t>((t.numel + kChunk - 1) / kChunk);
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(static) if (chunks > 1)
    for (std::int64_t ch = 0; ch < chunks; ++ch) {
      SplitMix64 sub{stage_key ^ (0x9E3779B97F4A7C15ull * (ti + 1)) ^
                     (0xBF58476D1CE4E5B9ull * static_cast<std::uint64_t>(ch + 1))};
      SplitMix64 rng{sub.next()};
      const std::size_t begin = static_cast<std::size_t>(ch) * kChunk, end = std::min(t.numel, begin + kChunk);
      for (std::size_t i = begin; i < end; i += 2) {  // Box-Muller: two normals per pair of uniforms
        const double r = std::sqrt(-2.0 * std::log(rng.uniform())), a = 6.283185307179586 * rng.uniform();
        p[i] = static_cast<float>(stddev * r * std::cos(a));
        if (i + 1 < end) p[i + 1] = static_cast<float>(stddev * r * std::sin(a));
      }
    }
  }
}

}  // namespace mt
