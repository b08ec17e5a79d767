// The backend seam (device/backend.hpp): the CPU backend's device memory, link and stage operations,
// and the selection by device.backend (cuda refused with the key and the reason, never a silent
// fallback to the CPU).
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <vector>

#include "device/backend.hpp"
#include "device/cpu/cpu_backend.hpp"
#include "kernels/param_layout.hpp"
#include "kernels/step_math.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/kernels/model_configs.hpp"

using namespace mt;

namespace {

BackendOptions cpu_options(int threads = 2) {
  BackendOptions o;
  o.kind = "cpu";
  o.compute_threads = threads;
  return o;
}

}  // namespace

TEST_CASE("make_backend picks the backend the key names and refuses what cannot run here", "[kernels][backend]") {
  auto cpu = make_backend(cpu_options());
  CHECK(std::string(cpu->name()) == "cpu");
  CHECK_THAT(cpu->describe(), Catch::Contains("fp32"));

  BackendOptions bad = cpu_options();
  bad.kind = "tpu";
  CHECK_THROWS_WITH(make_backend(bad), Catch::StartsWith("device.backend: 'tpu' is not one of: cpu, cuda"));

  // Without a usable GPU (CI) or in a build without CUDA, cuda must be refused before anything is
  // allocated, with the key and the reason; where check_backend_available accepts it (a GPU and the CUDA
  // backend), make_backend must give that backend, never the CPU one.
  BackendOptions cuda = cpu_options();
  cuda.kind = "cuda";
  bool available = true;
  try {
    check_backend_available(cuda);
  } catch (const BackendUnavailable&) {
    available = false;
  }
  if (available) {
    CHECK(std::string(make_backend(cuda)->name()) == "cuda");
    return;
  }
  try {
    make_backend(cuda);
    FAIL("device.backend=cuda was accepted");
  } catch (const BackendUnavailable& e) {
    INFO(e.what());
    CHECK_THAT(std::string(e.what()), Catch::StartsWith("device.backend: cuda"));
    CHECK_THAT(e.reason(), Catch::Contains("device.backend=cpu"));  // says what to do instead
  }
}

TEST_CASE("device.gpus is checked with the backend: at least 1, and no more GPUs than the machine has",
          "[kernels][backend]") {
  BackendOptions o = cpu_options();
  o.devices = 3;  // the CPU backend runs N arenas in one process
  CHECK_NOTHROW(check_backend_available(o));
  o.devices = 0;
  try {
    check_backend_available(o);
    FAIL("device.gpus = 0 was accepted");
  } catch (const BackendUnavailable& e) {
    CHECK(e.key() == "device.gpus");
    CHECK_THAT(std::string(e.what()), Catch::StartsWith("device.gpus: must be >= 1, got 0"));
  }
  // cuda with more GPUs than any machine has: refused. Where one GPU is usable, the refusal is about
  // device.gpus and says how many GPUs there are; otherwise it is the backend's (no GPU, no CUDA build).
  o.kind = "cuda";
  o.devices = 1;
  bool one_gpu_ok = true;
  try {
    check_backend_available(o);
  } catch (const BackendUnavailable&) {
    one_gpu_ok = false;
  }
  o.devices = 64;
  try {
    check_backend_available(o);
    FAIL("device.gpus = 64 was accepted");
  } catch (const BackendUnavailable& e) {
    INFO(e.what());
    CHECK(e.key() == (one_gpu_ok ? "device.gpus" : "device.backend"));
    if (one_gpu_ok) CHECK_THAT(e.reason(), Catch::StartsWith("64 GPUs"));  // asked for, or needing NCCL
  }
}

TEST_CASE("the CPU backend's device memory is zeroed, aligned, and its link copies both ways", "[kernels][backend]") {
  CpuBackend be(cpu_options());
  const std::size_t n = (std::size_t{3} << 20) + 40;  // spans several copy chunks
  std::byte* dev = be.allocate_device(n);
  REQUIRE(reinterpret_cast<std::uintptr_t>(dev) % 256 == 0);
  for (std::size_t i = 0; i < n; i += 4093) REQUIRE(dev[i] == std::byte{0});

  std::vector<unsigned char> host(n), back(n, 0);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<unsigned char>((i * 131) ^ (i >> 9));
  std::promise<void> in, out;
  std::atomic<int> callbacks{0};
  be.copy_async(LinkDirection::host_to_device, host.data(), dev, n, [&] {
    ++callbacks;
    in.set_value();
  });
  in.get_future().get();
  CHECK(std::memcmp(dev, host.data(), n) == 0);
  be.copy_async(LinkDirection::device_to_host, dev, back.data(), n, [&] {
    ++callbacks;
    out.set_value();
  });
  be.wait_link_idle();  // returns only after the callback ran
  CHECK(callbacks == 2);
  CHECK(back == host);
  const LinkStats s = be.link_stats();
  CHECK(s.of(LinkDirection::host_to_device).bytes == n);
  CHECK(s.of(LinkDirection::device_to_host).bytes == n);
  CHECK(s.of(LinkDirection::host_to_device).copies == 1);

  be.fill_zero(dev + 8, 1000);
  CHECK(dev[7] != std::byte{0});
  for (std::size_t i = 8; i < 1008; ++i) REQUIRE(dev[i] == std::byte{0});
  be.copy_on_device(dev, dev + 2048, 512);
  CHECK(std::memcmp(dev, host.data() + 2048, 512) == 0);
}

TEST_CASE("the CPU backend shares host memory unless a link is modelled, and adds gradients in one pass",
          "[kernels][backend]") {
  CpuBackend be(cpu_options());
  CHECK(be.shares_host_memory());
  BackendOptions linked = cpu_options();
  linked.link_bytes_per_s = 1e9;
  CpuBackend with_link(linked);
  CHECK_FALSE(with_link.shares_host_memory());
  std::vector<float> acc(3), g = {-0.0f, 2.5f, -1.0f};
  CHECK_THROWS_AS(with_link.accumulate_to_host(g.data(), acc.data(), 3, true, 1), std::logic_error);

  // Against the copy path's calls: zero + accumulate (first), accumulate (later); -0 becomes +0.
  const std::size_t n = 100003;
  const auto a = test::randn<float>(n, 11, 1.0), b = test::randn<float>(n, 12, 1.0);
  std::vector<float> src = a, host(n, 7.0f), expect(n);
  src[5] = -0.0f;
  cpu::zero(expect.data(), n, 1);
  cpu::accumulate(expect.data(), src.data(), n, 1);
  be.accumulate_to_host(src.data(), host.data(), n, /*first=*/true, 2);
  CHECK(std::memcmp(host.data(), expect.data(), n * sizeof(float)) == 0);
  CHECK_FALSE(std::signbit(host[5]));
  cpu::accumulate(expect.data(), b.data(), n, 1);
  be.accumulate_to_host(b.data(), host.data(), n, /*first=*/false, 2);
  CHECK(std::memcmp(host.data(), expect.data(), n * sizeof(float)) == 0);
}

TEST_CASE("the CPU backend's stage operations are the stage templates, bit for bit", "[kernels][backend]") {
  const ModelConfig c = test::tiny_llama();
  const std::int64_t B = 2, T = 8, D = c.hidden_size;
  CpuBackend be(cpu_options(2));
  ComputeCtx ctx;
  ctx.threads = 2;
  const ParamLayout l = stage_layout(c, 1);
  std::vector<float> w(l.total_floats);
  init_stage_params(c, 1, 7, w.data());
  const auto x = test::randn<float>(static_cast<std::size_t>(B * T * D), 3, 1.0);
  const auto dy = test::randn<float>(x.size(), 4, 1.0);
  std::vector<float> ws(layer_workspace_floats(c, B, T, ActivationMode::recompute));
  std::vector<float> y1(x.size()), y2(x.size()), dx1(x.size()), dx2(x.size());
  std::vector<float> g1(l.total_floats, 0.0f), g2(l.total_floats, 0.0f);
  LayerBuffers b1;  // through the stage API
  b1.x_in = x.data();
  b1.x_out = y1.data();
  b1.dy = dy.data();
  b1.dx = dx1.data();
  b1.grads = g1.data();
  b1.workspace = ws.data();
  LayerBuffers b2 = b1;  // through the backend
  b2.x_out = y2.data();
  b2.dx = dx2.data();
  b2.grads = g2.data();
  layer_forward(c, w.data(), {B, T}, b1, ctx);
  be.layer_forward(c, w.data(), {B, T}, b2);
  CHECK(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)) == 0);
  layer_backward(c, w.data(), {B, T}, b1, ctx);
  be.layer_backward(c, w.data(), {B, T}, b2);
  CHECK(std::memcmp(dx1.data(), dx2.data(), dx1.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)) == 0);
}
