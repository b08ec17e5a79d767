// Helpers shared by the kernel tests: seeded random buffers, norm-wise relative errors, and a
// central-difference gradient checker in double.
#pragma once
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/param_layout.hpp"

namespace mt::test {

// Raw little-endian values to a file (the oracles' inputs).
template <class T>
void write_bin(const std::filesystem::path& p, const std::vector<T>& v) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

template <class T = float>
std::vector<T> randn(std::size_t n, unsigned seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(d(rng));
  return v;
}

template <class A, class B>
double rel_err(const A* a, const B* b, std::size_t n) {  // |a - b| / |b|, norm-wise
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
template <class A, class B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
  return rel_err(a.data(), b.data(), std::min(a.size(), b.size()));
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Central differences of loss() with respect to every element of x (perturbed in place, restored).
inline std::vector<double> numeric_grad(std::vector<double>& x, const std::function<double()>& loss, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    const double step = h * std::max(1.0, std::abs(keep));
    x[i] = keep + step;
    const double up = loss();
    x[i] = keep - step;
    const double down = loss();
    x[i] = keep;
    g[i] = (up - down) / (2 * step);
  }
  return g;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Random parameters for a stage layout in double: N(0, 0.3), norm weights around 1 (so every path of
// the layer carries signal, as the fp64 and finite-difference checks need).
inline std::vector<double> random_stage_params(const ParamLayout& l, unsigned seed) {
  std::vector<double> p(l.total_floats, 0.0);
  auto r = randn<double>(l.total_floats, seed, 0.3);
  for (const auto& t : l.tensors) {
    const bool norm = t.name.find("norm") != std::string::npos || t.name.find("ln_") != std::string::npos;
    for (std::size_t i = 0; i < t.numel; ++i)
      p[t.offset + i] = (norm && t.name.find(".weight") != std::string::npos) ? 1.0 + r[t.offset + i] : r[t.offset + i];
  }
  return p;
}

}  // namespace mt::test
