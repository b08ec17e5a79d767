// safetensors in and out: round trips in F32/BF16/F16, sharding with the index, and headers that lie.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "storage/hf/dtype.hpp"
#include "storage/hf/hf_config.hpp"
#include "storage/hf/safetensors_reader.hpp"
#include "storage/hf/safetensors_writer.hpp"
#include "tests/storage/checkpoint/ckpt_test_util.hpp"

using namespace mt;
using namespace mt::hf;
namespace fs = std::filesystem;

namespace {

// A safetensors file with the given header text and `data_bytes` zero bytes of data.
fs::path make_file(const fs::path& dir, const std::string& header, std::size_t data_bytes,
                   const std::string& name = "bad.safetensors") {
  fs::path p = dir / name;
  std::ofstream out(p, std::ios::binary);
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << std::string(data_bytes, '\0');
  return p;
}

std::string open_error(const fs::path& p) {
  try {
    SafetensorsReader r(p);
  } catch (const HfError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("fp32 <-> bf16 / f16 conversions round to nearest even and keep specials") {
  const std::vector<float> x = {0.0f, -0.0f, 1.0f, -2.5f, 3.14159265f, 65504.0f, 1e-7f, 6.1e-5f, 1e30f, INFINITY};
  std::vector<std::uint16_t> h(x.size());
  std::vector<float> back(x.size());
  from_f32(DType::bf16, x.data(), h.data(), x.size());
  to_f32(DType::bf16, h.data(), back.data(), x.size());
  CHECK(h[2] == 0x3f80);
  CHECK(h[3] == 0xc020);
  CHECK(h[4] == 0x4049);  // 3.14159 -> 3.140625
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(back[i] == Approx(x[i]).epsilon(1.0 / 128));
  from_f32(DType::f16, x.data(), h.data(), x.size());
  to_f32(DType::f16, h.data(), back.data(), x.size());
  CHECK(h[2] == 0x3c00);
  CHECK(h[5] == 0x7bff);  // 65504, the largest half
  CHECK(h[6] == 0x0002);  // 1e-7 is subnormal: 1.68 x 2^-24 rounds to 2
  CHECK(h[8] == 0x7c00);  // overflow -> inf
  CHECK(std::isinf(back[9]));
  CHECK(back[4] == Approx(3.140625f));
  // Every half value survives f16 -> f32 -> f16 exactly.
  std::vector<std::uint16_t> all(65536), again(65536);
  std::vector<float> f(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  to_f32(DType::f16, all.data(), f.data(), all.size());
  from_f32(DType::f16, f.data(), again.data(), all.size());
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i] != again[i] && !std::isnan(f[i])) ++mismatches;
  CHECK(mismatches == 0);
}

TEST_CASE("the writer shards past the size limit with an index and the reader reads it back") {
  test::TempDir tmp;
  std::vector<PlannedTensor> plan = {
      {"a.weight", {10, 100}}, {"b.weight", {1000}}, {"c.weight", {20, 50}}, {"d.bias", {7}}};
  std::vector<std::vector<float>> data;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    std::size_t n = 1;
    for (auto d : plan[i].shape) n *= static_cast<std::size_t>(d);
    data.emplace_back(n);
    for (std::size_t k = 0; k < n; ++k) data.back()[k] = static_cast<float>(i) + 0.001f * static_cast<float>(k);
  }
  SafetensorsModelWriter w(tmp.path(), plan, DType::f32, 8100);
  REQUIRE(w.num_shards() == 2);
  for (std::size_t i = 0; i < plan.size(); ++i) w.write(plan[i].name, data[i].data());
  w.finish();
  const auto index = nlohmann::json::parse(std::ifstream(tmp / "model.safetensors.index.json"));
  CHECK(index["weight_map"]["a.weight"] == "model-00001-of-00002.safetensors");
  CHECK(index["weight_map"]["c.weight"] == "model-00002-of-00002.safetensors");
  CHECK(index["metadata"]["total_size"] == (1000 + 1000 + 1000 + 7) * 4);
  SafetensorsReader r1(tmp / "model-00001-of-00002.safetensors");
  SafetensorsReader r2(tmp / "model-00002-of-00002.safetensors");
  CHECK(r1.metadata().at("format") == "pt");
  std::vector<float> out(1000);
  r1.read_f32("b.weight", {1000}, out.data());
  CHECK(out == data[1]);
  r2.read_f32("c.weight", {20, 50}, out.data());
  CHECK(std::equal(data[2].begin(), data[2].end(), out.begin()));
  r1.read_f32_transposed("a.weight", {10, 100}, out.data());
  CHECK(out[3 * 10 + 7] == data[0][7 * 100 + 3]);
  CHECK_THROWS_WITH(r2.read_f32("c.weight", {50, 20}, out.data()),
                    Catch::Contains("model-00002-of-00002.safetensors") &&
                        Catch::Contains("'c.weight' has shape [20, 50], expected [50, 20]"));
  CHECK_THROWS_WITH(w.write("e", data[0].data()), Catch::Contains("past the end of the plan"));
}

TEST_CASE("bf16 and f16 files convert to fp32 on read") {
  test::TempDir tmp;
  std::vector<float> v = {1.0f, -0.5f, 0.333333f, 1000.0f};
  for (DType t : {DType::bf16, DType::f16}) {
    SafetensorsModelWriter w(tmp.path(), {{"x", {2, 2}}}, t, 1u << 30);
    w.write("x", v.data());
    w.finish();
    SafetensorsReader r(tmp / "model.safetensors");
    CHECK(r.find("x")->dtype == dtype_name(t));
    std::vector<float> out(4);
    r.read_f32("x", {2, 2}, out.data());
    for (int i = 0; i < 4; ++i) CHECK(out[i] == Approx(v[i]).epsilon(1.0 / 256));
  }
}

TEST_CASE("safetensors headers that lie are errors naming the tensor and the file") {
  test::TempDir tmp;
  auto err = [&](const std::string& header, std::size_t data) {
    return open_error(make_file(tmp.path(), header, data));
  };
  const std::string file = (tmp / "bad.safetensors").string();

  CHECK_THAT(err(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8),
             Catch::Contains(file) && Catch::Contains("'w'") && Catch::Contains("past the end"));
  CHECK_THAT(err(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}})", 16),
             Catch::Contains("'w'") && Catch::Contains("need 16"));
  CHECK_THAT(err(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                     "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                 24),
             Catch::Contains(file) && Catch::Contains("'a'") && Catch::Contains("'b'") && Catch::Contains("overlap"));
  CHECK_THAT(err(R"({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}})", 16),
             Catch::Contains("'w'") && Catch::Contains("unknown dtype 'Q4'"));
  CHECK_THAT(err(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}})", 16), Catch::Contains("reversed"));
  CHECK_THAT(err(R"({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", 16),
             Catch::Contains("bad shape"));
  CHECK_THAT(err(R"({"w": {"dtype": "F32", "shape": [4]}})", 16), Catch::Contains("data_offsets"));
  CHECK_THAT(err(R"({"w": )", 16), Catch::Contains(file) && Catch::Contains("not valid JSON"));
  CHECK_THAT(err(R"([1, 2])", 16), Catch::Contains("not a JSON object"));

  {  // header length larger than the file
    std::ofstream out(tmp / "long.safetensors", std::ios::binary);
    const char len[8] = {0x00, 0x10, 0, 0, 0, 0, 0, 0};
    out.write(len, 8);
    out << "{}";
  }
  CHECK_THAT(open_error(tmp / "long.safetensors"),
             Catch::Contains("long.safetensors") && Catch::Contains("exceeds the file size"));
  {
    std::ofstream out(tmp / "tiny.safetensors", std::ios::binary);
    out << "abc";
  }
  CHECK_THAT(open_error(tmp / "tiny.safetensors"),
             Catch::Contains("tiny.safetensors") && Catch::Contains("not a safetensors file"));
  CHECK_THAT(open_error(tmp / "absent.safetensors"),
             Catch::Contains("absent.safetensors") && Catch::Contains("cannot open"));

  // A valid header with an unsupported element type for the engine: an error when read.
  SafetensorsReader r(make_file(tmp.path(), R"({"w": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}})", 16,
                                "f64.safetensors"));
  std::vector<float> out(2);
  CHECK_THROWS_WITH(
      r.read_f32("w", {2}, out.data()),
      Catch::Contains("f64.safetensors") && Catch::Contains("'w' has dtype F64 (supported: F32, BF16, F16)"));
  CHECK_THROWS_WITH(r.read_f32("v", {2}, out.data()), Catch::Contains("no tensor 'v'"));
}
