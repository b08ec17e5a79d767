// The key table (config/keys.hpp): each key described once, its own checks name it, and
// config/README.md's table is its rendering.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "config/keys.hpp"

using namespace mt;

namespace {

std::string first_error(const TrainConfig& c) {
  try {
    c.validate_values();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the key table in config/README.md is the rendering of config/keys.cpp", "[config][keys]") {
  std::ifstream in(MEGATRAIN_SOURCE_DIR "/config/README.md");
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  REQUIRE_THAT(readme, Catch::Contains("<!-- key table: generated") && Catch::Contains("<!-- end of key table -->"));
  INFO(
      "config/README.md's key table should read as follows "
      "(build/release/config/megatrain-key-table --update config/README.md writes it):\n"
      << key_table_markdown());
  CHECK(with_key_table(readme) == readme);
  CHECK(with_key_table("no markers") == "no markers");
}

TEST_CASE("each key is described once, and key_of finds it by its member", "[config][keys]") {
  std::set<std::string> names;
  std::set<const void*> members;
  TrainConfig c;
  for (const KeyDesc& k : config_keys()) {
    INFO(k.qualified());
    CHECK(names.insert(k.qualified()).second);
    CHECK(members.insert(std::visit([&](auto get) -> const void* { return &get(c); }, k.field)).second);
    CHECK(std::string(k.help).size() > 3);
    CHECK(find_key(k.qualified()) == &k);
  }
  CHECK(names.size() == 103);  // issue 54: one budget key; the link model and fault injection not keys
  CHECK(config_sections() == std::vector<std::string>{"train", "model", "data", "device", "threads", "log", "monitor",
                                                      "restart", "plan", "cluster"});
  CHECK(key_of(c, c.train.max_steps) == "train.max_steps");
  CHECK(key_of(c, c.data.tokenizer_file) == "data.tokenizer_file");
  CHECK(key_of(c, c.plan.enforce) == "plan.enforce");
  CHECK(key_of(c, c.cluster.collective_timeout_s) == "cluster.collective_timeout_s");
  const TrainConfig other;  // any config: the name comes from the member's place in it
  CHECK(key_of(other, other.device.gpus) == "device.gpus");
  const std::string stray;
  CHECK_THROWS_AS(key_of(c, stray), std::logic_error);
  CHECK(find_key("train.max_stepz") == nullptr);
}

TEST_CASE("every range and choice in the table is checked, naming its key", "[config][keys]") {
  CHECK(first_error(TrainConfig{}).empty());  // the defaults pass every rule
  int checked = 0;
  for (const KeyDesc& k : config_keys()) {
    TrainConfig c;
    bool spoiled = true;
    if (const auto* integer = std::get_if<IntegerField>(&k.field)) {
      if (k.min != std::numeric_limits<std::int64_t>::min())
        (*integer)(c) = k.auto_zero && k.min - 1 == 0 ? -1 : k.min - 1;
      else
        spoiled = false;
    } else if (const auto* real = std::get_if<RealField>(&k.field)) {
      (*real)(c) = k.lo_open ? k.lo : k.lo - 1;
    } else if (const auto* text = std::get_if<StringField>(&k.field)) {
      if (!k.choices.empty())
        (*text)(c) = "bogus";
      else if (k.empty_error != nullptr)
        (*text)(c) = "";
      else
        spoiled = false;
    } else {
      spoiled = false;
    }
    if (!spoiled) continue;
    INFO(k.qualified());
    CHECK_THAT(first_error(c), Catch::StartsWith(k.qualified() + ": "));
    ++checked;
  }
  CHECK(checked >= 60);
}

TEST_CASE("the checks' messages and the README's allowed column come from the same rule", "[config][keys]") {
  const KeyDesc& slots = *find_key("device.weight_slots");
  CHECK(slots.allowed_text() == "auto (0) or 2 to 64");
  CHECK(find_key("device.grad_slots")->allowed_text() == "auto (0) or 1 to 64");
  CHECK(find_key("train.adam_beta1")->allowed_text() == "[0, 1)");
  CHECK(find_key("train.learning_rate")->allowed_text() == "> 0");
  CHECK(find_key("train.resume_fallback")->allowed_text() == "none, previous_good");
  TrainConfig c;
  c.train.resume_fallback = "always";
  CHECK(first_error(c) == "train.resume_fallback: 'always' is not one of: none, previous_good");
  c = TrainConfig{};
  c.device.weight_slots = 65;
  CHECK(first_error(c) == "device.weight_slots: must be <= 64, got 65");
  c.device.weight_slots = 0;  // auto
  CHECK(first_error(c).empty());
  CHECK(find_key("train.adam_epsilon")->value_text(c) == "1e-08");
  CHECK(find_key("train.output_dir")->value_text(c) == "\"run/out\"");
  CHECK(find_key("model.rope_theta")->value_text(c) == "10000.0");
}

TEST_CASE("naming_key puts the key in front of an error about its value", "[config][keys]") {
  CHECK_THROWS_WITH(
      naming_key("data.tokenizer_file", []() -> int { throw std::runtime_error("/etc/passwd: not valid JSON"); }),
      "data.tokenizer_file: /etc/passwd: not valid JSON");
  CHECK_THROWS_WITH(
      naming_key("data.tokenizer_file", []() -> int { throw ConfigError("model.vocab_size", "too small"); }),
      "model.vocab_size: too small");  // already names its key
  CHECK(naming_key("data.tokenizer_file", [] { return 7; }) == 7);
}
