// h5py (Debian's Python, no megatrain code) reads a checkpoint: self-describing names, attributes and
// values equal to what was written.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "storage/checkpoint/checkpoint_writer.hpp"
#include "tests/storage/checkpoint/ckpt_test_util.hpp"

using namespace mt;
using namespace mt::ckpt;

TEST_CASE("h5py reads every dataset of a checkpoint with its Hugging Face name and shape and values") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::gpt2, 2);
  CheckpointWriterOptions o;
  o.max_shard_bytes = 80'000;
  CheckpointWriter w(tmp.path(), 3, c, o);
  for (std::int64_t s = 0; s < num_stages(c); ++s) {
    const auto p = test::stage_values(c, s, 0), m = test::stage_values(c, s, 1), v = test::stage_values(c, s, 2);
    w.write_stage(s, {p.data(), m.data(), v.data()});
  }
  const auto dir = w.finalize();
  const auto r = test::run_command(std::string(MEGATRAIN_PYTHON) +
                                   " " MEGATRAIN_SOURCE_DIR "/tests/storage/checkpoint/read_checkpoint_h5py.py " +
                                   test::quote(dir));
  INFO(r.output);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.output);
  CHECK(j["step"] == 3);
  const char* states[] = {"params", "exp_avg", "exp_avg_sq"};
  for (std::int64_t s = 0; s < num_stages(c); ++s) {
    const auto layout = stage_layout(c, s);
    const auto& js = j["stages"][std::to_string(s)];
    CHECK(js["prefix"] == layout.prefix);
    CHECK(js["stage"] == s);
    CHECK(js["tensors"].size() == 3 * layout.tensors.size());
    for (int k = 0; k < 3; ++k) {
      const auto values = test::stage_values(c, s, k);
      for (const auto& t : layout.tensors) {
        const auto& jt = js["tensors"][std::string(states[k]) + "/" + t.name];
        CHECK(jt["shape"].get<std::vector<std::int64_t>>() == t.shape);
        const auto read = jt["values"].get<std::vector<double>>();  // every element, C order
        REQUIRE(read.size() == t.numel);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < t.numel; ++i)
          if (static_cast<float>(read[i]) != values[t.offset + i]) ++differ;
        CHECK(differ == 0);
        CHECK(jt["checksum_attr"] == true);
      }
    }
  }
}
