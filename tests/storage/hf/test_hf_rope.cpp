// rope_scaling against transformers itself: each config.json is imported (parse_config), exported
// (config_to_json) and imported again (equal), then transformers loads the exported directory
// (AutoConfig) and runs its LlamaRotaryEmbedding over the same positions (tests/kernels/hf_rope.py).
//
// What must agree, and how closely:
//  - inv_freq and the attention scaling: bit for bit. Both are computed in fp32 in the same order of
//    operations (cpu::rope_inv_freq mirrors modeling_rope_utils.py; the yarn correction range in
//    double, as Python floats); dynamic at T above its length as LlamaRotaryEmbedding runs it (fp32).
//    One exception, not of the formulas: torch's fp32 pow (vectorised, within 1 ulp) and glibc's powf
//    round theta^(2i/d) differently for some (theta, d, i) (e.g. theta 150000, d 64, i 6 and 10; at
//    theta 10000 / 500000 with d <= 32 they agree). Where the two pows differ (the test computes both),
//    inv_freq may differ by that 1 ulp; everywhere else it must be bit-equal (llama3 included: its
//    medium-band sum rounds each product on its own, as torch does: before, GCC fused it into an fma
//    and it came out 1 ulp off at index 1 of the llama3 case).
//  - the cos / sin tables: within 1e-6 x the attention scaling, absolute (measured up to 4.7e-7, about
//    8 ulp of 1): the angles are the same fp32 products, but we take glibc's cosf / sinf of them and
//    torch its own vectorised cos / sin, which differ in the last bits for arguments of tens of radians.
// Needs the venv's transformers (MEGATRAIN_VENV_PYTHON); without it the test exits 77 (skipped).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/ops.hpp"
#include "kernels/ops.hpp"
#include "storage/hf/hf_config.hpp"

using namespace mt;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kVenv = MEGATRAIN_VENV_PYTHON;

json llama_with(json rope_scaling, std::int64_t max_positions, std::int64_t head_dim, double theta) {
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", 64},
            {"hidden_size", head_dim * 2},
            {"intermediate_size", 32},
            {"num_hidden_layers", 1},
            {"num_attention_heads", 2},
            {"num_key_value_heads", 1},
            {"head_dim", head_dim},
            {"max_position_embeddings", max_positions},
            {"rope_theta", theta},
            {"rms_norm_eps", 1e-5}};
  j["rope_scaling"] = std::move(rope_scaling);
  return j;
}

std::vector<float> read_floats(const fs::path& p, std::size_t n) {
  std::vector<float> v(n);
  std::ifstream f(p, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  REQUIRE(static_cast<std::size_t>(f.gcount()) == n * sizeof(float));
  return v;
}

struct Case {
  const char* name;
  json config;
  std::int64_t seq;
};

}  // namespace

TEST_CASE("every rope_scaling type: import, export, import, and transformers' own tables bit for bit",
          "[hf][rope][oracle]") {
  if (std::system((kVenv + " -c 'import transformers' 2>/dev/null").c_str()) != 0) {
    std::fprintf(stderr, "venv with transformers not found at %s (tools/install-deps --test): skipped\n",
                 kVenv.c_str());
    std::exit(77);
  }
  const json gpt_oss = {{"rope_type", "yarn"}, {"factor", 32.0},    {"beta_fast", 32.0},
                        {"beta_slow", 1.0},    {"truncate", false}, {"original_max_position_embeddings", 4096}};
  const std::vector<Case> cases = {
      {"default", llama_with(nullptr, 64, 16, 10000.0), 40},
      {"llama3",
       llama_with({{"rope_type", "llama3"},
                   {"factor", 8.0},
                   {"low_freq_factor", 1.0},
                   {"high_freq_factor", 4.0},
                   {"original_max_position_embeddings", 16}},
                  64, 32, 500000.0),
       40},
      {"linear", llama_with({{"rope_type", "linear"}, {"factor", 4.0}}, 64, 32, 10000.0), 40},
      {"linear_bc_type", llama_with({{"type", "linear"}, {"factor", 2.5}}, 64, 16, 10000.0), 20},
      {"dynamic_above", llama_with({{"rope_type", "dynamic"}, {"factor", 2.0}}, 32, 32, 10000.0), 77},
      {"dynamic_above_odd", llama_with({{"rope_type", "dynamic"}, {"factor", 3.0}}, 24, 64, 500000.0), 50},
      {"dynamic_below", llama_with({{"rope_type", "dynamic"}, {"factor", 2.0}}, 32, 32, 10000.0), 20},
      {"dynamic_equal", llama_with({{"rope_type", "dynamic"}, {"factor", 2.0}}, 32, 32, 10000.0), 32},
      {"yarn", llama_with({{"rope_type", "yarn"}, {"factor", 4.0}}, 64, 32, 10000.0), 40},
      {"yarn_betas",
       llama_with({{"rope_type", "yarn"},
                   {"factor", 8.0},
                   {"beta_fast", 16.0},
                   {"beta_slow", 2.0},
                   {"attention_factor", 1.25}},
                  512, 64, 500000.0),
       30},
      {"yarn_gpt_oss", llama_with(gpt_oss, 131072, 64, 150000.0), 50},
      {"yarn_gpt_oss_truncated",
       llama_with({{"rope_type", "yarn"}, {"factor", 32.0}, {"original_max_position_embeddings", 4096}}, 131072, 64,
                  150000.0),
       50},
      {"yarn_mscale",
       llama_with({{"rope_type", "yarn"},
                   {"factor", 40.0},
                   {"mscale", 1.0},
                   {"mscale_all_dim", 0.5},
                   {"original_max_position_embeddings", 4096}},
                  163840, 64, 10000.0),
       30},
  };
  const fs::path root = fs::temp_directory_path() / ("mt_hf_rope_" + std::to_string(::getpid()));
  std::string args;
  std::vector<ModelConfig> configs;
  for (const Case& k : cases) {
    INFO(k.name);
    const ModelConfig c = hf::parse_config(k.config, k.name);
    const json exported = hf::config_to_json(c);
    const ModelConfig back = hf::parse_config(exported, std::string(k.name) + " (exported)");
    CHECK(back.rope_scaling == c.rope_scaling);
    CHECK(back.max_position_embeddings == c.max_position_embeddings);
    CHECK(back.rope_theta == c.rope_theta);
    CHECK(hf::config_to_json(back) == exported);
    fs::create_directories(root / k.name);
    std::ofstream(root / k.name / "config.json") << exported.dump(1);
    args += " '" + (root / k.name).string() + "' " + std::to_string(k.seq);
    configs.push_back(c);
  }
  const std::string cmd = kVenv + " " + MEGATRAIN_SOURCE_DIR + "/tests/kernels/hf_rope.py" + args;
  REQUIRE(std::system(cmd.c_str()) == 0);

  for (std::size_t n = 0; n < cases.size(); ++n) {
    const Case& k = cases[n];
    const ModelConfig& c = configs[n];
    INFO(k.name << " T=" << k.seq);
    const fs::path d = root / k.name;
    const std::int64_t half = c.head_dim / 2, T = k.seq;
    json seen;
    std::ifstream(d / "rope.json") >> seen;
    // transformers read the exported rope_scaling as we wrote it
    CHECK(seen["rope_scaling"] == hf::rope_scaling_json(c.rope_scaling));
    CHECK(seen["rope_type"] == rope_type_name(c.rope_scaling.type));

    const RopeParams p = rope_params_of(c);
    std::vector<float> inv(half);
    const float scale = cpu::rope_inv_freq(p, T, c.head_dim, inv.data());
    const auto theirs = read_floats(d / "inv_freq.bin", half), their_pow = read_floats(d / "pow.bin", half);
    for (std::int64_t i = 0; i < half; ++i) {
      const float our_pow = std::pow(c.rope_theta, static_cast<float>(2 * i) / static_cast<float>(c.head_dim));
      INFO("inv_freq[" << i << "] ours " << inv[i] << " transformers " << theirs[i] << "; pow ours " << our_pow
                       << " torch " << their_pow[i]);
      if (std::memcmp(&our_pow, &their_pow[i], sizeof(float)) == 0) {
        CHECK(std::memcmp(&inv[i], &theirs[i], sizeof(float)) == 0);
      } else {  // torch's pow and glibc's powf round theta^(2i/d) differently here: 1 ulp
        CHECK(std::abs(double(inv[i]) - theirs[i]) <= std::abs(double(std::nextafter(theirs[i], 0.0f)) - theirs[i]));
      }
    }
    const float their_scale = static_cast<float>(seen["attention_scaling"].get<double>());
    CHECK(scale == their_scale);

    // The tables: transformers' cos/sin are [T, head_dim] (both halves the same).
    std::vector<float> cs(T * half), sn(T * half);
    cpu::rope_table(p, T, c.head_dim, cs.data(), sn.data());
    const auto tc = read_floats(d / "cos.bin", T * c.head_dim), ts = read_floats(d / "sin.bin", T * c.head_dim);
    double worst = 0;
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t i = 0; i < half; ++i) {
        const std::size_t o = static_cast<std::size_t>(t * c.head_dim + i);
        REQUIRE(tc[o] == tc[o + half]);
        worst = std::max(worst, std::abs(double(cs[t * half + i]) - tc[o]));
        worst = std::max(worst, std::abs(double(sn[t * half + i]) - ts[o]));
      }
    INFO("worst |ours - transformers| over cos and sin: " << worst);
    CHECK(worst <= 1e-6 * scale);
  }
  fs::remove_all(root);
}
