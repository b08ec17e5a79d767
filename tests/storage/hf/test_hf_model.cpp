// Hugging Face directories <-> stages: names, GPT-2 transposition, tied heads, shards, bad directories.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "storage/hf/hf_config.hpp"
#include "storage/hf/hf_model.hpp"
#include "storage/hf/safetensors_reader.hpp"
#include "storage/hf/safetensors_writer.hpp"
#include "tests/storage/checkpoint/ckpt_test_util.hpp"

using namespace mt;
using namespace mt::hf;
namespace fs = std::filesystem;

namespace {

void export_model(const fs::path& dir, const ModelConfig& c, const HfExportOptions& o = {}) {
  std::vector<float> buf;
  write_hf_model(
      dir, c,
      [&](std::int64_t s) -> const float* {
        buf = test::stage_values(c, s, 0);
        return buf.data();
      },
      o);
}

std::string reader_error(const fs::path& dir) {
  try {
    HfModelReader r(dir);
  } catch (const HfError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("every architecture exports and loads back bit for bit") {
  for (Arch arch : {Arch::llama, Arch::qwen2, Arch::qwen3, Arch::mistral, Arch::gpt2}) {
    INFO(arch_name(arch));
    test::TempDir tmp;
    const ModelConfig c = test::tiny_config(arch, 2);
    export_model(tmp.path(), c);
    const HfModelReader r(tmp.path());
    CHECK(r.config().arch == arch);
    for (std::int64_t s = 0; s < num_stages(c); ++s) {
      const auto want = test::stage_values(c, s, 0);
      std::vector<float> got(want.size(), 1.0f);
      r.read_stage(s, got.data());
      CHECK(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
    }
  }
}

TEST_CASE("GPT-2 decoder matrices are stored in-by-out in the file as Conv1D holds them") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::gpt2, 1);
  export_model(tmp.path(), c);
  SafetensorsReader f(tmp / "model.safetensors");
  const auto* e = f.find("transformer.h.0.attn.c_attn.weight");
  REQUIRE(e);
  CHECK(e->shape == std::vector<std::int64_t>{32, 96});
  CHECK(f.find("transformer.wte.weight")->shape == std::vector<std::int64_t>{96, 32});
  CHECK(f.find("lm_head.weight") == nullptr);  // tied
  std::vector<float> file(32 * 96);
  f.read_f32("transformer.h.0.attn.c_attn.weight", {32, 96}, file.data());
  const auto stage = test::stage_values(c, 1, 0);
  const ParamLayout layout = stage_layout(c, 1);
  const auto& spec = layout.at("attn.c_attn.weight");
  CHECK(file[5 * 96 + 17] == stage[spec.offset + 17 * 32 + 5]);  // file[in][out] == ours[out][in]
}

TEST_CASE("sharded export writes the index and bf16 export converts") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::llama, 3);
  HfExportOptions o;
  o.max_shard_bytes = 20'000;
  o.dtype = DType::bf16;
  export_model(tmp.path(), c, o);
  CHECK(fs::exists(tmp / "model.safetensors.index.json"));
  CHECK_FALSE(fs::exists(tmp / "model.safetensors"));
  const auto cfg = nlohmann::json::parse(std::ifstream(tmp / "config.json"));
  CHECK(cfg["torch_dtype"] == "bfloat16");
  CHECK(cfg["architectures"][0] == "LlamaForCausalLM");
  const HfModelReader r(tmp.path());
  const auto want = test::stage_values(c, 2, 0);
  std::vector<float> got(want.size());
  r.read_stage(2, got.data());
  for (std::size_t i = 0; i < want.size(); ++i) REQUIRE(got[i] == Approx(want[i]).epsilon(1.0 / 256).margin(1e-30));
}

TEST_CASE("bad model directories are errors naming the file and the tensor") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::llama, 3);
  HfExportOptions o;
  o.max_shard_bytes = 20'000;
  export_model(tmp.path(), c, o);
  REQUIRE(reader_error(tmp.path()).empty());
  const auto weight_map = nlohmann::json::parse(std::ifstream(tmp / "model.safetensors.index.json"))["weight_map"];
  const std::string layer1_file = weight_map["model.layers.1.mlp.up_proj.weight"],
                    embed_file = weight_map["model.embed_tokens.weight"];
  REQUIRE(layer1_file != embed_file);

  SECTION("a shard listed in the index is missing") {
    fs::remove(tmp / layer1_file);
    CHECK_THAT(reader_error(tmp.path()), Catch::Contains(layer1_file) && Catch::Contains("missing"));
  }
  SECTION("the index promises a tensor the shard lacks") {
    auto index = nlohmann::json::parse(std::ifstream(tmp / "model.safetensors.index.json"));
    index["weight_map"]["model.norm.weight"] = embed_file;
    std::ofstream(tmp / "model.safetensors.index.json") << index.dump();
    CHECK_THAT(reader_error(tmp.path()), Catch::Contains(embed_file) && Catch::Contains("'model.norm.weight'"));
  }
  SECTION("config.json disagrees with the tensor shapes") {
    auto cfg = nlohmann::json::parse(std::ifstream(tmp / "config.json"));
    cfg["intermediate_size"] = 80;
    std::ofstream(tmp / "config.json") << cfg.dump();
    CHECK_THAT(reader_error(tmp.path()), Catch::Contains(".safetensors") && Catch::Contains("mlp.gate_proj.weight") &&
                                             Catch::Contains("expected [80, 32]"));
  }
  SECTION("a tensor is missing") {
    auto cfg = nlohmann::json::parse(std::ifstream(tmp / "config.json"));
    cfg["num_hidden_layers"] = 4;
    std::ofstream(tmp / "config.json") << cfg.dump();
    CHECK_THAT(reader_error(tmp.path()),
               Catch::Contains("'model.layers.3.input_layernorm.weight'") && Catch::Contains("none of the"));
  }
  SECTION("an unexpected tensor (another architecture)") {
    auto cfg = nlohmann::json::parse(std::ifstream(tmp / "config.json"));
    cfg["num_hidden_layers"] = 2;
    std::ofstream(tmp / "config.json") << cfg.dump();
    CHECK_THAT(reader_error(tmp.path()), Catch::Contains("unexpected tensor 'model.layers.2."));
  }
  SECTION("no weights at all") {
    for (const auto& e : fs::directory_iterator(tmp.path()))
      if (e.path().filename() != "config.json") fs::remove(e.path());
    CHECK_THAT(reader_error(tmp.path()), Catch::Contains("neither model.safetensors nor model.safetensors.index.json"));
  }
  SECTION("no config.json") {
    fs::remove(tmp / "config.json");
    CHECK_THAT(reader_error(tmp.path()), Catch::Contains("config.json") && Catch::Contains("cannot open"));
  }
}

TEST_CASE("a tied lm_head copy and GPT-2 attention-mask buffers are ignored on load and GPT2Model names load") {
  test::TempDir tmp;
  const ModelConfig c = test::tiny_config(Arch::gpt2, 1);
  std::vector<PlannedTensor> plan;
  std::vector<std::vector<float>> data;
  for (std::int64_t s = 0; s < num_stages(c); ++s) {
    const auto layout = stage_layout(c, s);
    const auto v = test::stage_values(c, s, 0);
    for (const auto& t : layout.tensors) {
      const HfTensorName hn = hf_tensor(c, layout, t);
      std::string name = hn.name.substr(12);  // GPT2Model spelling: no "transformer."
      plan.push_back({name, hn.file_shape});
      std::vector<float> d(v.begin() + static_cast<long>(t.offset), v.begin() + static_cast<long>(t.offset + t.numel));
      if (hn.transposed) {
        std::vector<float> tr(d.size());
        const auto rows = static_cast<std::size_t>(t.shape[0]), cols = static_cast<std::size_t>(t.shape[1]);
        for (std::size_t i = 0; i < rows; ++i)
          for (std::size_t j = 0; j < cols; ++j) tr[j * rows + i] = d[i * cols + j];
        d = tr;
      }
      data.push_back(d);
    }
  }
  plan.push_back({"h.0.attn.bias", {1, 1, 4, 4}});
  data.emplace_back(16, 1.0f);
  plan.push_back({"lm_head.weight", {96, 32}});
  data.emplace_back(96 * 32, 0.0f);
  SafetensorsModelWriter w(tmp.path(), plan, DType::f32, 1u << 30);
  for (std::size_t i = 0; i < plan.size(); ++i) w.write(plan[i].name, data[i].data());
  w.finish();
  std::ofstream(tmp / "config.json") << config_to_json(c).dump();
  const HfModelReader r(tmp.path());
  for (std::int64_t s = 0; s < num_stages(c); ++s) {
    const auto want = test::stage_values(c, s, 0);
    std::vector<float> got(want.size());
    r.read_stage(s, got.data());
    CHECK(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
  }
}
