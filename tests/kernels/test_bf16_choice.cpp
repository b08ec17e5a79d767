// The bf16 products' path chosen by measurement (ops_bf16.hpp): the probe times both paths, its choice
// is what the products then run (checked by their bits, not only by name), the path is fixed once per
// process, and MEGATRAIN_BF16_GEMM wins over a request (the hidden cases, run by ctest with the
// variable set: tests/kernels/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/ops_bf16.hpp"
#include "tests/kernels/kernel_test_util.hpp"

using namespace mt;
using std::vector;

namespace {

vector<bf16_t> rounded(const vector<float>& x) {
  vector<bf16_t> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = cpu::bf16_round_reference(x[i]);
  return y;
}

// Whether the process's bf16 forward product ran on the widened path, told by its bits: the widened path
// is the fp32 product of the widened operands bit for bit, oneDNN's bf16 kernels sum in another order
// (pairs of products in vdpbf16ps or AMX tiles), which over K = 700 differs somewhere.
bool runs_widened() {
  const std::int64_t N = 96, in = 700, out = 160;
  const auto x = rounded(test::randn(N * in, 11)), W = rounded(test::randn(out * in, 12, 0.1));
  vector<float> xf(x.size()), wf(W.size()), y(N * out), yf(N * out);
  cpu::from_bf16(x.data(), xf.data(), x.size(), 1);
  cpu::from_bf16(W.data(), wf.data(), W.size(), 1);
  cpu::linear_forward_bf16(x.data(), W.data(), nullptr, y.data(), N, in, out, 2);
  cpu::linear_forward(xf.data(), wf.data(), nullptr, yf.data(), N, in, out, 2);
  vector<double> ref(N * out);
  cpu::linear_forward_bf16_reference(x.data(), W.data(), nullptr, ref.data(), N, in, out);
  CHECK(test::rel_err(y, ref) < 1e-5);  // either way the right product
  return std::memcmp(y.data(), yf.data(), y.size() * sizeof(float)) == 0;
}

cpu::Bf16Gemm other(cpu::Bf16Gemm p) {
  return p == cpu::Bf16Gemm::onednn ? cpu::Bf16Gemm::widened : cpu::Bf16Gemm::onednn;
}

}  // namespace

TEST_CASE("bf16 GEMM probe: both paths timed, the choice by the margin, then fixed and run", "[bf16][choice]") {
  REQUIRE_FALSE(cpu::bf16_gemm_forced());  // run without MEGATRAIN_BF16_GEMM (the [.forced] cases set it)
  REQUIRE_FALSE(cpu::bf16_gemm_fixed());
  const bool onednn = cpu::bf16_gemm_onednn_available();
  INFO("oneDNN bf16 kernels: " << onednn << ", oneDNN " << cpu::onednn_version() << " " << cpu::onednn_isa());
  const cpu::Bf16Probe p = cpu::probe_bf16_gemm({{128, 256, 512}, {128, 512, 256}, {0, 8, 8}}, 2, 0.05);
  INFO("widened " << p.widened_s << " s, onednn " << p.onednn_s << " s, " << p.rounds << " rounds, " << p.wall_s
                  << " s in all");
  CHECK_FALSE(cpu::bf16_gemm_fixed());  // the probe runs both paths itself, fixing neither
  REQUIRE(p.shapes.size() == 2);        // the empty shape is skipped
  CHECK(p.products == 6);
  CHECK(p.threads == 2);
  CHECK(p.rounds >= 1);
  CHECK(p.rounds <= 5);
  CHECK(p.widened_s > 0);
  CHECK(p.onednn_available == onednn);
  if (onednn) {
    CHECK(p.onednn_s > 0);
    CHECK(p.onednn_speedup() == Approx(p.widened_s / p.onednn_s));
  } else {
    CHECK(p.onednn_s == 0);
  }
  const bool by_margin = onednn && p.widened_s >= cpu::kBf16OnednnMargin * p.onednn_s;
  CHECK((p.choice == cpu::Bf16Gemm::onednn) == by_margin);

  // The choice, fixed, is what the products run.
  CHECK(cpu::set_bf16_gemm_path(p.choice) == p.choice);
  CHECK(cpu::bf16_gemm_fixed());
  CHECK(cpu::bf16_gemm_path() == p.choice);
  const std::string impl = cpu::linear_bf16_impl_name(96, 700, 160);
  INFO("implementation: " << impl);
  CHECK((impl.rfind("bf16 widened to fp32", 0) == 0) == (p.choice == cpu::Bf16Gemm::widened));
  CHECK(runs_widened() == (p.choice == cpu::Bf16Gemm::widened));
  // Fixed for the rest of the process: the same request is a no-op, another is refused.
  CHECK(cpu::set_bf16_gemm_path(p.choice) == p.choice);
  if (onednn)
    CHECK_THROWS_AS(cpu::set_bf16_gemm_path(other(p.choice)), std::logic_error);
  else  // onednn cannot run here: asking for it is asking for widened
    CHECK(cpu::set_bf16_gemm_path(cpu::Bf16Gemm::onednn) == cpu::Bf16Gemm::widened);
  CHECK(cpu::bf16_gemm_path() == p.choice);
}

TEST_CASE("bf16 GEMM probe: products are bounded on large layers", "[bf16][choice]") {
  // 4096 x 4096 weights at 100k rows would be 3.4 TFLOP a product: rows cut to 0.25 GFLOP (at least 64),
  // out to 8M weight elements.
  const cpu::Bf16Probe p = cpu::probe_bf16_gemm({{100000, 4096, 4096}}, 2, 0.0);
  REQUIRE(p.shapes.size() == 1);
  CHECK(p.shapes[0].in == 4096);
  CHECK(p.shapes[0].out == 2048);
  CHECK(p.shapes[0].rows == 64);
  CHECK(p.rounds == 1);  // no budget: one timed round
  CHECK(p.wall_s < 30);
}

TEST_CASE("bf16 GEMM path names", "[bf16][choice]") {
  CHECK(std::string(cpu::bf16_gemm_name(cpu::Bf16Gemm::onednn)) == "onednn");
  CHECK(std::string(cpu::bf16_gemm_name(cpu::Bf16Gemm::widened)) == "widened");
  CHECK(cpu::parse_bf16_gemm("onednn") == cpu::Bf16Gemm::onednn);
  CHECK(cpu::parse_bf16_gemm("widened") == cpu::Bf16Gemm::widened);
  CHECK_FALSE(cpu::parse_bf16_gemm("ONEDNN"));
  CHECK_FALSE(cpu::parse_bf16_gemm(""));
  CHECK(cpu::onednn_version().find('.') != std::string::npos);
  CHECK_FALSE(cpu::onednn_isa().empty());
}

// Run by ctest with MEGATRAIN_BF16_GEMM=onednn and =widened: the variable wins over a request.
TEST_CASE("MEGATRAIN_BF16_GEMM wins over set_bf16_gemm_path", "[.forced]") {
  const auto forced = cpu::bf16_gemm_forced();
  REQUIRE(forced);
  const cpu::Bf16Gemm runs =
      *forced == cpu::Bf16Gemm::onednn && !cpu::bf16_gemm_onednn_available() ? cpu::Bf16Gemm::widened : *forced;
  CHECK(cpu::bf16_gemm_path() == runs);
  CHECK(cpu::set_bf16_gemm_path(other(*forced)) == runs);
  CHECK(cpu::bf16_gemm_path() == runs);
  CHECK(runs_widened() == (runs == cpu::Bf16Gemm::widened));
}

// Run by ctest with MEGATRAIN_BF16_GEMM=fastest: refused naming the variable.
TEST_CASE("MEGATRAIN_BF16_GEMM with another value is refused", "[.invalid]") {
  REQUIRE(std::getenv("MEGATRAIN_BF16_GEMM") != nullptr);
  try {
    (void)cpu::bf16_gemm_forced();
    FAIL("no error");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(e.what(), Catch::Contains("MEGATRAIN_BF16_GEMM=") && Catch::Contains("onednn or widened"));
  }
}
