#include "tools/bench/gemm_ceiling.hpp"

#include <cblas.h>
#include <omp.h>

#include <dlfcn.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include <oneapi/dnnl/dnnl.hpp>

#include "tools/bench/bench_report.hpp"

namespace mt::bench {

std::string GemmShape::name() const {
  std::ostringstream o;
  o << m << "x" << n << "x" << k << " " << (ta ? 'T' : 'N') << (tb ? 'T' : 'N');
  return o.str();
}

std::vector<GemmShape> transformer_shapes(std::int64_t tokens, std::int64_t d, std::int64_t ff) {
  std::vector<GemmShape> v;
  // (out, in) of each linear layer: QKV, attention output, MLP up, MLP down.
  const std::pair<std::int64_t, std::int64_t> layers[] = {{3 * d, d}, {d, d}, {ff, d}, {d, ff}};
  for (const auto& [out, in] : layers) {
    v.push_back({tokens, out, in, false, true});   // y = x W^T
    v.push_back({tokens, in, out, false, false});  // dx = dy W
    v.push_back({out, in, tokens, true, false});   // dW = dy^T x
  }
  return v;
}

const char* lib_name(GemmLib lib) {
  static const char* names[] = {"openblas",         "onednn_sgemm",    "onednn_matmul_f32", "onednn_matmul_bf16",
                                "onednn_gemm_bf16", "openblas_sbgemm", "bf16_widened_sgemm"};
  return names[static_cast<int>(lib)];
}

bool is_bf16(GemmLib lib) {
  return lib == GemmLib::onednn_matmul_bf16 || lib == GemmLib::onednn_gemm_bf16 || lib == GemmLib::openblas_sbgemm ||
         lib == GemmLib::bf16_widened_sgemm;
}

namespace {

// Thread settings for one measurement, restored afterwards: OpenBLAS's pool and the calling thread's
// OpenMP team size (oneDNN sizes its parallel regions from omp_get_max_threads()).
class ThreadScope {
 public:
  explicit ThreadScope(int threads) : blas_(openblas_get_num_threads()), omp_(omp_get_max_threads()) {
    openblas_set_num_threads(threads);
    omp_set_num_threads(threads);
  }
  ~ThreadScope() {
    openblas_set_num_threads(blas_);
    omp_set_num_threads(omp_);
  }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int blas_, omp_;
};

std::uint16_t to_bf16(float f) {  // round to nearest even (the inputs are finite)
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// Row-major operand [rows, cols] of op(X), stored transposed when `t`.
dnnl::memory::desc md(std::int64_t rows, std::int64_t cols, bool t, dnnl::memory::data_type dt) {
  return t ? dnnl::memory::desc({rows, cols}, dt, {1, rows}) : dnnl::memory::desc({rows, cols}, dt, {cols, 1});
}

// oneDNN 2.x exports this row-major bf16 GEMM (src/common/gemm.cpp) without declaring it in a public
// header; bf16 arguments are raw 16-bit patterns.
extern "C" dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K,
                                               float alpha, const std::uint16_t* A, dnnl_dim_t lda,
                                               const std::uint16_t* B, dnnl_dim_t ldb, float beta, float* C,
                                               dnnl_dim_t ldc);

// OpenBLAS's bf16 GEMM when the loaded library exports it (looked up, so a build without it still links).
using sbgemm_fn = void (*)(int order, int ta, int tb, int m, int n, int k, float alpha, const std::uint16_t* a, int lda,
                           const std::uint16_t* b, int ldb, float beta, float* c, int ldc);
sbgemm_fn openblas_sbgemm_fn() {
  static const auto fn = reinterpret_cast<sbgemm_fn>(dlsym(RTLD_DEFAULT, "cblas_sbgemm"));
  return fn;
}

void widen(const std::vector<std::uint16_t>& x, std::vector<float>& y) {
  const auto n = static_cast<std::int64_t>(x.size());
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(x[static_cast<std::size_t>(i)]) << 16;
    std::memcpy(&y[static_cast<std::size_t>(i)], &u, 4);
  }
}

double cpu_now() {  // user + system seconds of every thread of this process
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

double gemm_rate(GemmLib lib, const GemmShape& s, int threads, int reps, double* cpu_rate) {
  ThreadScope scope(threads);
  // Operands in their stored layout: op(A) is [m, k], op(B) is [k, n].
  const std::int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  mt::bench::AlignedVector<float> a(static_cast<std::size_t>(s.m * s.k)), b(static_cast<std::size_t>(s.k * s.n)),
      c(static_cast<std::size_t>(s.m * s.n));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.02f * static_cast<float>(i % 89) - 0.8f;
  // Wall-clock best of `reps` (bench_report's best_seconds), and the least CPU time of those runs.
  double best_cpu = 1e300;
  auto best_seconds = [&](const std::function<void()>& fn, int n) {
    return mt::bench::best_seconds(
        [&] {
          const double c0 = cpu_now();
          fn();
          best_cpu = std::min(best_cpu, cpu_now() - c0);
        },
        n);
  };
  double t = 0;
  switch (lib) {
    case GemmLib::openblas:
      t = best_seconds(
          [&] {
            cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                        static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a.data(),
                        static_cast<int>(lda), b.data(), static_cast<int>(ldb), 0.0f, c.data(), static_cast<int>(s.n));
          },
          reps);
      break;
    case GemmLib::onednn_sgemm:
      t = best_seconds(
          [&] {
            dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                       c.data(), s.n);
          },
          reps);
      break;
    case GemmLib::onednn_matmul_f32:
    case GemmLib::onednn_matmul_bf16: {
      using dt = dnnl::memory::data_type;
      const bool bf16 = lib == GemmLib::onednn_matmul_bf16;
      const dt in_t = bf16 ? dt::bf16 : dt::f32;
      try {
        dnnl::engine eng(dnnl::engine::kind::cpu, 0);
        dnnl::stream strm(eng);
        const auto a_md = md(s.m, s.k, s.ta, in_t), b_md = md(s.k, s.n, s.tb, in_t),
                   c_md = md(s.m, s.n, false, dt::f32);
        dnnl::matmul prim(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng));
        std::vector<std::uint16_t> a16, b16;
        void* ap = a.data();
        void* bp = b.data();
        if (bf16) {
          a16.resize(a.size());
          b16.resize(b.size());
          for (std::size_t i = 0; i < a.size(); ++i) a16[i] = to_bf16(a[i]);
          for (std::size_t i = 0; i < b.size(); ++i) b16[i] = to_bf16(b[i]);
          ap = a16.data();
          bp = b16.data();
        }
        dnnl::memory am(a_md, eng, ap), bm(b_md, eng, bp), cm(c_md, eng, c.data());
        t = best_seconds(
            [&] {
              prim.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
              strm.wait();
            },
            reps);
      } catch (const dnnl::error&) {
        return 0;  // no implementation for this type on this CPU
      }
      break;
    }
    case GemmLib::onednn_gemm_bf16:
    case GemmLib::openblas_sbgemm:
    case GemmLib::bf16_widened_sgemm: {
      std::vector<std::uint16_t> a16(a.size()), b16(b.size());
      for (std::size_t i = 0; i < a.size(); ++i) a16[i] = to_bf16(a[i]);
      for (std::size_t i = 0; i < b.size(); ++i) b16[i] = to_bf16(b[i]);
      const char ta = s.ta ? 'T' : 'N', tb = s.tb ? 'T' : 'N';
      if (lib == GemmLib::onednn_gemm_bf16) {
        if (dnnl_gemm_bf16bf16f32(ta, tb, s.m, s.n, s.k, 1.0f, a16.data(), lda, b16.data(), ldb, 0.0f, c.data(), s.n) !=
            dnnl_success)
          return 0;  // no bf16 GEMM on this CPU
        t = best_seconds(
            [&] {
              dnnl_gemm_bf16bf16f32(ta, tb, s.m, s.n, s.k, 1.0f, a16.data(), lda, b16.data(), ldb, 0.0f, c.data(), s.n);
            },
            reps);
      } else if (lib == GemmLib::openblas_sbgemm) {
        const sbgemm_fn sbgemm = openblas_sbgemm_fn();
        if (!sbgemm) return 0;
        t = best_seconds(
            [&] {
              sbgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                     static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a16.data(),
                     static_cast<int>(lda), b16.data(), static_cast<int>(ldb), 0.0f, c.data(), static_cast<int>(s.n));
            },
            reps);
      } else {
        std::vector<float> aw(a.size()), bw(b.size());
        t = best_seconds(
            [&] {
              widen(a16, aw);
              widen(b16, bw);
              dnnl_sgemm(ta, tb, s.m, s.n, s.k, 1.0f, aw.data(), lda, bw.data(), ldb, 0.0f, c.data(), s.n);
            },
            reps);
      }
      break;
    }
    case GemmLib::kNum:
      return 0;
  }
  if (cpu_rate) *cpu_rate = s.flops() / (std::max(best_cpu, 1e-9) / threads);
  return s.flops() / t;
}

namespace {
Ceiling best_of(const std::vector<GemmLib>& libs, const std::vector<GemmShape>& shapes, int threads, int reps) {
  Ceiling best;
  for (const GemmLib lib : libs)
    for (const auto& s : shapes) {
      double cpu = 0;
      const double r = gemm_rate(lib, s, threads, reps, &cpu);
      best.cpu_rate = std::max(best.cpu_rate, cpu);
      if (r > best.rate) {
        best.rate = r;
        best.lib = lib;
        best.shape = s;
      }
    }
  return best;
}
}  // namespace

Ceiling best_fp32_gemm(const std::vector<GemmShape>& shapes, int threads, int reps) {
  return best_of({GemmLib::openblas, GemmLib::onednn_sgemm, GemmLib::onednn_matmul_f32}, shapes, threads, reps);
}

Ceiling best_bf16_gemm(const std::vector<GemmShape>& shapes, int threads, int reps) {
  return best_of(
      {GemmLib::onednn_matmul_bf16, GemmLib::onednn_gemm_bf16, GemmLib::openblas_sbgemm, GemmLib::bf16_widened_sgemm},
      shapes, threads, reps);
}

std::string openblas_core() { return openblas_get_corename(); }

}  // namespace mt::bench
