// The run's pinning of the host tiles (node/host_pinning.hpp): every tile is handed to the backend
// at its exact size when HostModel allocates it and taken back when it goes, in both precisions and
// with the masters on the tier; the CPU backend gets no hook at all.
#include <catch2/catch.hpp>

#include "node/host_pinning.hpp"
#include "tests/actors/engine_fixture.hpp"

using namespace mt;
using namespace mt::actors;
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
