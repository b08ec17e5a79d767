// Rotary position embeddings in the Hugging Face layout: each head's vector is split in two halves,
// out = x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1]. The tables are computed in
// fp32 exactly as transformers computes them, so positions agree to the last bit where it matters.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/profile.hpp"

namespace mt::cpu {

namespace {

void compute_table(const RopeParams& p, std::int64_t seq, std::int64_t head_dim, float* cos_t, float* sin_t) {
  const std::int64_t half = head_dim / 2;
  constexpr double kPi = 3.14159265358979323846;
  for (std::int64_t i = 0; i < half; ++i) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all fp32
    const float expo = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    float inv = 1.0f / std::pow(p.theta, expo);
    if (p.scaling_factor != 0.0f) {
      // Llama-3 rope_scaling: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
      const float old_len = static_cast<float>(p.original_max_position);
      const float low_wavelen = old_len / p.low_freq_factor;
      const float high_wavelen = old_len / p.high_freq_factor;
      const float wavelen = static_cast<float>(2.0 * kPi) / inv;
      if (wavelen > low_wavelen) {
        inv = inv / p.scaling_factor;
      } else if (!(wavelen < high_wavelen)) {
        const float smooth = (old_len / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
        inv = (1.0f - smooth) * inv / p.scaling_factor + smooth * inv;
      }
    }
    for (std::int64_t t = 0; t < seq; ++t) {
      const float angle = static_cast<float>(t) * inv;
      cos_t[t * half + i] = std::cos(angle);
      sin_t[t * half + i] = std::sin(angle);
    }
  }
}

bool same(const RopeParams& a, const RopeParams& b) {
  return a.theta == b.theta && a.scaling_factor == b.scaling_factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor && a.original_max_position == b.original_max_position;
}

}  // namespace

void rope_table(const RopeParams& p, std::int64_t seq, std::int64_t head_dim, float* cos_t, float* sin_t) {
  // Every layer's forward and backward asks for the same table: computing it (seq x head_dim / 2
  // sines and cosines, on one thread while the others wait) cost about 1% of the demo's step, so the
  // calling thread keeps its last table and copies it.
  struct Cached {
    RopeParams p;
    std::int64_t seq = -1, head_dim = -1;
    std::vector<float> cos_t, sin_t;
  };
  thread_local Cached cache;
  const std::size_t n = static_cast<std::size_t>(seq * (head_dim / 2));
  if (cache.seq != seq || cache.head_dim != head_dim || !same(cache.p, p)) {
    cache.cos_t.resize(n);
    cache.sin_t.resize(n);
    compute_table(p, seq, head_dim, cache.cos_t.data(), cache.sin_t.data());
    cache.p = p;
    cache.seq = seq;
    cache.head_dim = head_dim;
  }
  std::copy(cache.cos_t.begin(), cache.cos_t.end(), cos_t);
  std::copy(cache.sin_t.begin(), cache.sin_t.end(), sin_t);
}

void rope_apply(float* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                std::int64_t row_stride, const float* cos_t, const float* sin_t, bool inverse, int threads) {
  prof::Scope prof_scope(prof::elementwise);
  const std::int64_t half = head_dim / 2;
  const float sgn = inverse ? -1.0f : 1.0f;  // the inverse rotation is the rotation by -angle
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * heads * head_dim > 16384)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = r % seq;
    const float* c = cos_t + t * half;
    const float* s = sin_t + t * half;
    for (std::int64_t h = 0; h < heads; ++h) {
      float* v = x + r * row_stride + h * head_dim;
      for (std::int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half], si = sgn * s[i];
        v[i] = a * c[i] - b * si;
        v[i + half] = b * c[i] + a * si;
      }
    }
  }
}

}  // namespace mt::cpu
