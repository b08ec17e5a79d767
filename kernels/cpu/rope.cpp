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

constexpr double kPi = 3.14159265358979323846;

// x rounded to fp32 where it stands: the compiler may not fuse it into a following add (-march=x86-64-v3
// has FMA, and GCC contracts a * b + c * d into an fma by default in C++), so a sum of two products
// rounds like torch's separate multiply and add kernels.
float rounded(float x) {
  volatile float v = x;
  return v;
}

// yarn's blend of interpolated and extrapolated frequencies, in transformers' order of operations
// (_compute_yarn_parameters): the correction range in double (Python floats), the rest in fp32 tensors.
void yarn_inv_freq(const RopeParams& p, std::int64_t head_dim, float* inv) {
  const std::int64_t half = head_dim / 2;
  const double dim = static_cast<double>(head_dim), base = static_cast<double>(p.theta);
  const double orig = static_cast<double>(p.original_max_position);
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(orig / (rotations * 2 * kPi))) / (2 * std::log(base));
  };
  double low = correction_dim(p.beta_fast), high = correction_dim(p.beta_slow);
  if (p.truncate) {  // transformers 4.46 always; newer ones unless rope_scaling.truncate is false
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // "Prevent singularity"
  const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
  const float factor = static_cast<float>(p.factor);
  for (std::int64_t i = 0; i < half; ++i) {
    const float pos_freq = std::pow(p.theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor * pos_freq);
    const float ramp = std::min(std::max((static_cast<float>(i) - lo) / span, 0.0f), 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    inv[i] = rounded(interpolation * (1.0f - extrapolation_factor)) + rounded(extrapolation * extrapolation_factor);
  }
}

void compute_table(const RopeParams& p, std::int64_t seq, std::int64_t head_dim, float* cos_t, float* sin_t) {
  const std::int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<std::size_t>(half));
  const float scale = rope_inv_freq(p, seq, head_dim, inv.data());
  for (std::int64_t i = 0; i < half; ++i) {
    for (std::int64_t t = 0; t < seq; ++t) {
      const float angle = static_cast<float>(t) * inv[i];
      // transformers multiplies cos and sin by attention_scaling (1 but for yarn: exact then)
      cos_t[t * half + i] = std::cos(angle) * scale;
      sin_t[t * half + i] = std::sin(angle) * scale;
    }
  }
}

}  // namespace

float rope_inv_freq(const RopeParams& p, std::int64_t seq, std::int64_t head_dim, float* inv_freq) {
  const std::int64_t half = head_dim / 2;
  if (p.kind == RopeKind::yarn) {
    yarn_inv_freq(p, head_dim, inv_freq);
    return static_cast<float>(p.attention_scaling);
  }
  float base = p.theta;
  if (p.kind == RopeKind::dynamic && seq > p.original_max_position) {
    // NTK-aware growth of the base, as LlamaRotaryEmbedding runs it past max_position_embeddings: there
    // seq_len is a 0-d int64 tensor (max(position_ids) + 1), so the formula runs in fp32 tensors with the
    // Python floats (factor, factor - 1, dim / (dim - 2)) rounded to fp32.
    const float f = static_cast<float>(p.factor);
    const float grown =
        f * static_cast<float>(seq) / static_cast<float>(p.original_max_position) - static_cast<float>(p.factor - 1.0);
    const double expo = static_cast<double>(head_dim) / static_cast<double>(head_dim - 2);
    base = p.theta * std::pow(grown, static_cast<float>(expo));
  }
  for (std::int64_t i = 0; i < half; ++i) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all fp32
    const float expo = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    float inv = 1.0f / std::pow(base, expo);
    if (p.kind == RopeKind::linear) {
      inv = inv / static_cast<float>(p.factor);  // inv_freq /= factor
    } else if (p.kind == RopeKind::llama3) {
      // Llama-3 rope_scaling: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
      const float factor = static_cast<float>(p.factor);
      const float low_ff = static_cast<float>(p.low_freq_factor), high_ff = static_cast<float>(p.high_freq_factor);
      const float old_len = static_cast<float>(p.original_max_position);
      const float low_wavelen = old_len / low_ff;
      const float high_wavelen = old_len / high_ff;
      const float wavelen = static_cast<float>(2.0 * kPi) / inv;
      if (wavelen > low_wavelen) {
        inv = inv / factor;
      } else if (!(wavelen < high_wavelen)) {
        // Each product rounded on its own, as torch's separate kernels do: left to the compiler, this
        // sum was fused into an fma on FMA targets and came out 1 ulp from transformers' inv_freq.
        const float smooth = (old_len / wavelen - low_ff) / (high_ff - low_ff);
        inv = rounded((1.0f - smooth) * inv / factor) + rounded(smooth * inv);
      }
    }
    inv_freq[i] = inv;
  }
  return 1.0f;
}

void rope_table(const RopeParams& p, std::int64_t seq, std::int64_t head_dim, float* cos_t, float* sin_t) {
  // Every layer's forward and backward asks for the same table: computing it (seq x head_dim / 2
  // sines and cosines, on one thread while the others wait) cost about 1% of the demo's step, so the
  // calling thread keeps its last table and copies it. The table is a function of (params, seq,
  // head_dim) only: dynamic scaling depends on seq, which is the same for every forward of a run.
  struct Cached {
    RopeParams p;
    std::int64_t seq = -1, head_dim = -1;
    std::vector<float> cos_t, sin_t;
  };
  thread_local Cached cache;
  const std::size_t n = static_cast<std::size_t>(seq * (head_dim / 2));
  if (cache.seq != seq || cache.head_dim != head_dim || cache.p != p) {
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
                std::int64_t row_stride, const float* cos_t, const float* sin_t, bool inverse, int threads,
                const std::int32_t* positions) {
  prof::Scope prof_scope(prof::elementwise);
  const std::int64_t half = head_dim / 2;
  const float sgn = inverse ? -1.0f : 1.0f;  // the inverse rotation is the rotation by -angle
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * heads * head_dim > 16384)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = positions ? positions[r] : r % seq;
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
