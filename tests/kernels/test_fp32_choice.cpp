// The fp32 products' library per product chosen by measurement (ops.hpp Fp32GemmChoice): the probe times
// oneDNN and OpenBLAS on each product, its choice is what the products then run, the choice is fixed once
// per process, oneDNN is the default without one, and MEGATRAIN_FP32_GEMM wins over a request (the hidden
// cases, run by ctest with the variable set: tests/kernels/CMakeLists.txt). The products on OpenBLAS
// against the references and across thread counts: test_kernels_ops and the layer tests run again with
// MEGATRAIN_FP32_GEMM=openblas (the same CMakeLists.txt).
#include <catch2/catch.hpp>

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/ops.hpp"

using namespace mt;
using cpu::Fp32Gemm;
using cpu::Fp32GemmChoice;
using cpu::LinearProduct;

namespace {

Fp32GemmChoice mixed() {
  Fp32GemmChoice c;
  c[LinearProduct::backward_weight] = Fp32Gemm::openblas;
  return c;
}

}  // namespace

TEST_CASE("fp32 GEMM probe: both libraries timed per product, the choice by the margin", "[fp32][choice]") {
  REQUIRE_FALSE(cpu::fp32_gemm_forced());  // run without MEGATRAIN_FP32_GEMM (the [.forced] cases set it)
  const cpu::Fp32Probe p = cpu::probe_fp32_gemm({{128, 256, 512}, {128, 512, 256}, {0, 8, 8}}, 2, 0.05);
  CHECK_FALSE(cpu::fp32_gemm_fixed());  // the probe runs both libraries itself, fixing neither
  REQUIRE(p.shapes.size() == 2);        // the empty shape is skipped
  CHECK(p.threads == 2);
  CHECK(p.rounds >= 2);
  CHECK(p.rounds <= 5);
  for (int i = 0; i < cpu::kLinearProducts; ++i) {
    const auto product = static_cast<LinearProduct>(i);
    INFO(cpu::linear_product_name(product)
         << ": oneDNN " << p.onednn_s[i] << " s, OpenBLAS " << p.openblas_s[i] << " s");
    CHECK(p.onednn_s[i] > 0);
    CHECK(p.openblas_s[i] > 0);
    CHECK(p.openblas_speedup(product) == Approx(p.onednn_s[i] / p.openblas_s[i]));
    const bool by_margin = p.onednn_s[i] >= cpu::kFp32OpenblasMargin * p.openblas_s[i];
    CHECK((p.choice[product] == Fp32Gemm::openblas) == by_margin);
  }
  // A shape is listed only where it differs from its product's library, and only the layers given.
  for (const auto& s : p.choice.shapes) {
    CHECK(s.lib != p.choice[s.product]);
    CHECK(((s.in == 256 && s.out == 512) || (s.in == 512 && s.out == 256)));
  }
}

TEST_CASE("fp32 GEMM choice: a listed shape runs on its own library", "[fp32][choice]") {
  REQUIRE_FALSE(cpu::fp32_gemm_forced());
  REQUIRE_FALSE(cpu::fp32_gemm_fixed());
  // One tile each (at most 128 rows and columns): the product is one library call, whose bits the test
  // computes with each library directly. K = 700 sums in a different order on each.
  const std::int64_t N = 96, in = 700, out = 120;
  std::vector<float> x(N * in), w(out * in), y(N * out), blas(N * out), dnnl(N * out);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1000) / 997.0f - 0.5f;
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>((i * 104729) % 1000) / 991.0f - 0.5f;
  // On one thread, as the products call it: OpenBLAS's own threads (its default here) sum this product
  // in another order.
  openblas_set_num_threads(1);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, blas.data(),
              out);
  REQUIRE(dnnl_sgemm('N', 'T', N, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, dnnl.data(), out) == dnnl_success);
  REQUIRE(std::memcmp(blas.data(), dnnl.data(), blas.size() * 4) != 0);  // else the check below sees nothing
  Fp32GemmChoice c;  // oneDNN, but OpenBLAS for the forward product of layers [120, 700]
  c.shapes.push_back({LinearProduct::forward, in, out, Fp32Gemm::openblas});
  CHECK(c.of(LinearProduct::forward, in, out) == Fp32Gemm::openblas);
  CHECK(c.of(LinearProduct::forward, out, in) == Fp32Gemm::onednn);
  CHECK(c.of(LinearProduct::backward_weight, in, out) == Fp32Gemm::onednn);
  CHECK(c.str() == "onednn; forward 120x700 openblas");
  REQUIRE(cpu::set_fp32_gemm_choice(c) == c);
  CHECK_THAT(std::string(cpu::gemm_backend_name()),
             Catch::StartsWith("oneDNN ") && Catch::Contains("; forward 120x700 OpenBLAS sgemm (core "));
  cpu::linear_forward(x.data(), w.data(), nullptr, y.data(), N, in, out, 2);
  CHECK(std::memcmp(y.data(), blas.data(), y.size() * 4) == 0);
  // Another shape of the same product: oneDNN (the first 110 of the 120 outputs).
  std::vector<float> y2(N * 110), d2(N * 110);
  REQUIRE(dnnl_sgemm('N', 'T', N, 110, in, 1.0f, x.data(), in, w.data(), in, 0.0f, d2.data(), 110) == dnnl_success);
  cpu::linear_forward(x.data(), w.data(), nullptr, y2.data(), N, in, 110, 2);
  CHECK(std::memcmp(y2.data(), d2.data(), y2.size() * 4) == 0);
}

TEST_CASE("fp32 GEMM probe: products are bounded on large layers", "[fp32][choice]") {
  const cpu::Fp32Probe p = cpu::probe_fp32_gemm({{100000, 4096, 4096}}, 2, 0.0);
  REQUIRE(p.shapes.size() == 1);
  CHECK(p.shapes[0].in == 4096);
  CHECK(p.shapes[0].out == 2048);
  CHECK(p.shapes[0].rows == 64);
  CHECK(p.rounds == 2);  // no budget: the least rounds
}

TEST_CASE("fp32 GEMM choice: oneDNN without one and fixed once when set", "[fp32][choice]") {
  REQUIRE_FALSE(cpu::fp32_gemm_forced());
  REQUIRE_FALSE(cpu::fp32_gemm_fixed());
  CHECK(cpu::fp32_gemm_choice() == Fp32GemmChoice::all(Fp32Gemm::onednn));
  CHECK(cpu::set_fp32_gemm_choice(mixed()) == mixed());
  CHECK(cpu::fp32_gemm_fixed());
  CHECK(cpu::fp32_gemm_choice() == mixed());
  const std::string name = cpu::gemm_backend_name();
  INFO(name);
  CHECK_THAT(name, Catch::StartsWith("forward oneDNN ") && Catch::Contains(", backward_input oneDNN ") &&
                       Catch::Contains(", backward_weight OpenBLAS sgemm (core "));
  // Fixed for the rest of the process: the same request is a no-op, another is refused.
  CHECK(cpu::set_fp32_gemm_choice(mixed()) == mixed());
  CHECK_THROWS_AS(cpu::set_fp32_gemm_choice(Fp32GemmChoice::all(Fp32Gemm::onednn)), std::logic_error);
  CHECK(cpu::fp32_gemm_choice() == mixed());
}

TEST_CASE("fp32 GEMM choice: the first product fixes the default", "[fp32][choice]") {
  REQUIRE_FALSE(cpu::fp32_gemm_forced());
  REQUIRE_FALSE(cpu::fp32_gemm_fixed());
  float x[4] = {1, 2, 3, 4}, w[4] = {1, 0, 0, 1}, y[4] = {};
  cpu::linear_forward(x, w, nullptr, y, 2, 2, 2, 1);
  CHECK(y[3] == 4.0f);
  CHECK(cpu::fp32_gemm_fixed());
  CHECK(cpu::fp32_gemm_choice() == Fp32GemmChoice::all(Fp32Gemm::onednn));
  CHECK_THAT(std::string(cpu::gemm_backend_name()), Catch::StartsWith("oneDNN "));
  CHECK_THROWS_AS(cpu::set_fp32_gemm_choice(mixed()), std::logic_error);
}

TEST_CASE("fp32 GEMM names", "[fp32][choice]") {
  CHECK(std::string(cpu::fp32_gemm_name(Fp32Gemm::onednn)) == "onednn");
  CHECK(std::string(cpu::fp32_gemm_name(Fp32Gemm::openblas)) == "openblas");
  CHECK(cpu::parse_fp32_gemm("onednn") == Fp32Gemm::onednn);
  CHECK(cpu::parse_fp32_gemm("openblas") == Fp32Gemm::openblas);
  CHECK_FALSE(cpu::parse_fp32_gemm("OpenBLAS"));
  CHECK_FALSE(cpu::parse_fp32_gemm(""));
  CHECK(Fp32GemmChoice::all(Fp32Gemm::openblas).str() == "openblas");
  CHECK(mixed().str() == "forward onednn, backward_input onednn, backward_weight openblas");
  Fp32GemmChoice shaped = mixed();
  shaped.shapes.push_back({LinearProduct::forward, 256, 1024, Fp32Gemm::openblas});
  CHECK(shaped.str() == "forward onednn, backward_input onednn, backward_weight openblas; forward 1024x256 openblas");
  CHECK(shaped != mixed());
  CHECK_THAT(cpu::openblas_version(), Catch::StartsWith("OpenBLAS ") && Catch::Contains(", core "));
}

// Run by ctest with MEGATRAIN_FP32_GEMM=onednn and =openblas: the variable wins over a request.
TEST_CASE("MEGATRAIN_FP32_GEMM wins over set_fp32_gemm_choice", "[.forced]") {
  const auto forced = cpu::fp32_gemm_forced();
  REQUIRE(forced);
  const Fp32GemmChoice runs = Fp32GemmChoice::all(*forced);
  CHECK(cpu::fp32_gemm_choice() == runs);
  CHECK(cpu::set_fp32_gemm_choice(mixed()) == runs);
  CHECK(cpu::fp32_gemm_choice() == runs);
  CHECK_THAT(std::string(cpu::gemm_backend_name()),
             Catch::StartsWith(*forced == Fp32Gemm::openblas ? "OpenBLAS sgemm" : "oneDNN "));
}

// Run by ctest with MEGATRAIN_FP32_GEMM=fastest: refused naming the variable.
TEST_CASE("MEGATRAIN_FP32_GEMM with another value is refused", "[.invalid]") {
  REQUIRE(std::getenv("MEGATRAIN_FP32_GEMM") != nullptr);
  try {
    (void)cpu::fp32_gemm_forced();
    FAIL("no error");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(e.what(), Catch::Contains("MEGATRAIN_FP32_GEMM=") && Catch::Contains("onednn or openblas"));
  }
}
