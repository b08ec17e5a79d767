// The run's pinning of the host tiles (node/host_pinning.hpp): every tile is handed to the backend
// at its exact size when HostModel allocates it and taken back when it goes, in both precisions and
// with the masters on the tier; the CPU backend gets no hook at all. And the engine's pinning of the
// buffers its link copies into (device/host_registration.hpp: boundaries, gradient landing buffers).
#include <catch2/catch.hpp>

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

#include "device/host_registration.hpp"
#include "node/host_pinning.hpp"
#include "tests/actors/engine_fixture.hpp"

using namespace mt;
using namespace mt::actors;
using namespace mt::plan;
using namespace mt::node;
using namespace mt::actors::test;

TEST_CASE("the CPU backend pins nothing: no hook", "[host_pinning]") {
  const TrainConfig cfg = tiny_config(Tiny{});
  CHECK(host_pinning_for(cfg, plan_engine(cfg, cfg.model_config_from_keys())) == nullptr);
}

TEST_CASE("every tile is pinned at its exact size while the host model lives, and unpinned after", "[host_pinning]") {
  for (const bool bf16 : {false, true}) {
    INFO("bf16 " << bf16);
    Tiny t;
    t.bf16 = bf16;
    const TrainConfig cfg = tiny_config(t);
    const ModelConfig model = cfg.model_config_from_keys();
    BackendOptions o;  // the CPU backend's register_host accepts the ranges: the hook's accounting is tested
    BackendPinning pinning(make_backend(o));
    {
      const HostTileOptions tiles = host_tile_options(cfg);
      HostModel host(model, tiles, &pinning);
      std::size_t sum = 0;
      for (std::int64_t s = 0; s < host.num_stages(); ++s) sum += host.tile(s).bytes();
      CHECK(pinning.pinned_bytes() == sum);
      CHECK(pinning.pinned_bytes() == host_model_bytes(model, tiles));
    }
    CHECK(pinning.pinned_bytes() == 0);
  }
}

namespace {

// A backend that only records what it is asked to pin (every other call refused).
class RecordingBackend final : public Backend {
 public:
  std::vector<std::pair<void*, std::size_t>> pinned;
  bool refuse = false;
  const char* name() const override { return "recording"; }
  std::string describe() const override { return "recording"; }
  Precision precision() const override { return Precision::fp32; }
  std::byte* allocate_device(std::size_t) override { throw std::logic_error("unused"); }
  std::byte* allocate_mapped_host(std::size_t) override { throw std::logic_error("unused"); }
  void register_host(void* data, std::size_t bytes) override {
    if (refuse) throw std::runtime_error("cudaHostRegister failed: cudaErrorMemoryAllocation");
    pinned.emplace_back(data, bytes);
  }
  void unregister_host(void* data, std::size_t bytes) override {
    const auto it = std::find(pinned.begin(), pinned.end(), std::pair<void*, std::size_t>{data, bytes});
    if (it == pinned.end()) throw std::logic_error("unregistering a range never registered");
    pinned.erase(it);
  }
  void copy_async(LinkDirection, const void*, void*, std::size_t, std::function<void()>) override {}
  void wait_link_idle() override {}
  LinkStats link_stats() const override { return {}; }
  void fill_zero(void*, std::size_t) override {}
  void copy_on_device(void*, const void*, std::size_t) override {}
  void synchronize() override {}
  Ops& ops() override { throw std::logic_error("unused"); }
  const token_t* upload_tokens(const token_t*, std::size_t, int) override { return nullptr; }
  const float* upload_floats(const float*, std::size_t, int) override { return nullptr; }

 protected:
  void check_ids(const ModelConfig&, const token_t*, std::int64_t, bool, const char*) override {}
};

}  // namespace

TEST_CASE("a host buffer the link copies into is pinned at its exact size while it lives", "[host_pinning]") {
  RecordingBackend b;
  std::vector<float> boundaries(1000), landing(333);
  {
    HostRegistration r1(b, boundaries.data(), boundaries.size() * sizeof(float), "the layer boundaries");
    HostRegistration r2(b, landing.data(), landing.size() * sizeof(float), "a landing buffer");
    HostRegistration none(b, nullptr, 0, "nothing");  // an empty buffer pins nothing
    REQUIRE(b.pinned.size() == 2);
    CHECK(b.pinned[0] == std::pair<void*, std::size_t>{boundaries.data(), 4000});
    CHECK(b.pinned[1] == std::pair<void*, std::size_t>{landing.data(), 1332});
    std::vector<HostRegistration> moved;
    moved.push_back(std::move(r2));  // a move keeps one registration
    CHECK(moved.back().bytes() == 1332);
    CHECK(r2.bytes() == 0);  // NOLINT(bugprone-use-after-move): the moved-from one holds nothing
    CHECK(b.pinned.size() == 2);
  }
  CHECK(b.pinned.empty());  // every range unpinned, once, by the same range
  b.refuse = true;
  CHECK_THROWS_WITH(HostRegistration(b, landing.data(), 1332, "a stage gradient landing buffer"),
                    Catch::Contains("pinning a stage gradient landing buffer (1332 bytes) for the recording backend") &&
                        Catch::Contains("cudaErrorMemoryAllocation"));
}
