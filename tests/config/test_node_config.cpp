// The CAF binding of the node config: every key from an INI file and the command line, strictly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <caf/settings.hpp>

#include "config/keys.hpp"
#include "config/node_config.hpp"
#include "temp_dir.hpp"

using namespace mt;

namespace {

const std::string kDemoIni = MEGATRAIN_SOURCE_DIR "/config/demo.ini";

// Command-line arguments that point the data keys at files that exist.
std::vector<std::string> with_data(const test::TempDir& dir, std::vector<std::string> args) {
  dir.file("demo_train_000.bin", "x");
  dir.file("demo_val_000.bin", "x");
  dir.file("tokenizer.json", "{}");
  args.push_back("--data.train_files=\"" + dir.path() + "/*train*.bin\"");
  args.push_back("--data.validation_files=\"" + dir.path() + "/*val*.bin\"");
  args.push_back("--data.tokenizer_file=\"" + dir.path() + "/tokenizer.json\"");
  args.push_back("--train.output_dir=\"" + dir.path() + "/out\"");
  return args;
}

NodeConfigLoad load_text(NodeConfig& cfg, const test::TempDir& dir, const std::string& ini,
                         std::vector<std::string> args = {}) {
  return cfg.load(with_data(dir, std::move(args)), ini);
}

}  // namespace

TEST_CASE("the demo config loads, and the command line overrides it", "[node_config]") {
  test::TempDir dir;
  NodeConfig cfg;
  const auto r =
      cfg.load(with_data(dir, {"--config-file=" + kDemoIni, "--train.max_steps=70", "--device.max_vram_gb=0.03125"}));
  INFO(r.error);
  REQUIRE(r.outcome == NodeConfigLoad::Outcome::run);
  CHECK(r.exit_code() == 0);
  CHECK(cfg.config_file == kDemoIni);
  const TrainConfig& v = cfg.values;
  CHECK(v.train.max_steps == 70);                // command line
  CHECK(v.device.max_vram_gb == 0.03125);        // command line (32 MiB)
  CHECK(v.train.learning_rate == 1e-3);          // file
  CHECK(v.train.warmup_steps == 30);             // file
  CHECK(v.train.lr_scheduler_type == "cosine");  // file
  CHECK(v.model.kv_heads == 2);
  CHECK(v.data.seq_length == 128);
  CHECK(v.threads.total == 2);
  CHECK(v.train.output_dir == dir.path() + "/out");
  CHECK(caf::get_or(cfg.content, "scheduler.max-threads", caf::config_value::integer{0}) == 1);
}

TEST_CASE("every key is registered under its section", "[node_config]") {
  NodeConfig cfg;
  const auto keys = cfg.registered_keys();
  for (const char* k : {"train.output_dir",
                        "train.per_device_train_batch_size",
                        "train.gradient_accumulation_steps",
                        "train.learning_rate",
                        "train.weight_decay",
                        "train.warmup_steps",
                        "train.max_steps",
                        "train.max_grad_norm",
                        "train.bf16",
                        "train.tf32",
                        "train.seed",
                        "train.offload_dir",
                        "train.optimizer_compression",
                        "train.offload_staging_stages",
                        "train.offload_io_threads",
                        "train.offload_params",
                        "train.eval_steps",
                        "train.eval_max_batches",
                        "train.lr_scheduler_type",
                        "train.adam_beta1",
                        "train.adam_beta2",
                        "train.adam_epsilon",
                        "device.max_vram_gb",
                        "device.weight_slots",
                        "device.keep_intermediates",
                        "device.schedule",
                        "device.gpus",
                        "device.seq_tile",
                        "device.attention_kv",
                        "threads.total",
                        "threads.blas",
                        "threads.optimizer",
                        "threads.copy",
                        "threads.scheduler",
                        "data.train_files",
                        "data.seq_length",
                        "model.config_file",
                        "model.arch",
                        "model.hidden_size",
                        "model.layers",
                        "model.heads",
                        "model.kv_heads",
                        "model.intermediate_size",
                        "model.vocab_size",
                        "model.max_position_embeddings",
                        "model.rope_theta",
                        "model.tie_word_embeddings",
                        "log.train_jsonl",
                        "log.events_jsonl",
                        "train.resume_fallback",
                        "train.save_minutes",
                        "train.stop_after_steps",
                        "train.export_hf_dir",
                        "monitor.enabled",
                        "monitor.bind",
                        "monitor.port",
                        "monitor.token_file",
                        "monitor.watchdog_warn_s",
                        "monitor.watchdog_dump_s",
                        "monitor.watchdog_restart_s",
                        "restart.max_restarts",
                        "restart.window_s",
                        "restart.backoff_s",
                        "restart.per_actor",
                        "plan.hardware",
                        "plan.hardware_file",
                        "plan.host_ram_gb",
                        "plan.disk_gb",
                        "plan.enforce",
                        "plan.ranks",
                        "cluster.mode",
                        "cluster.collective_timeout_s",
                        "cluster.shard_state",
                        "cluster.gpu_transport",
                        "cluster.checkpoint_writers"}) {
    INFO(k);
    CHECK(std::find(keys.begin(), keys.end(), k) != keys.end());
  }
  // model: 15 + num_experts, num_experts_per_tok + 4 qwen3_moe keys + sliding_window + 2 load-balancing keys; train: 24
  // + eval_steps, eval_max_batches + 3 offload keys + tf32 + save_snapshot_mib + master_weights; device: 7 + gpus
  // + seq_tile, attention_kv (one budget key, the link model not a key); threads: 5 + adapt_to_load; monitor: 7
  // (fault injection not a key); plan: 6; cluster: 5
  CHECK(keys.size() == 33 + 24 + 5 + 10 + 6 + 3 + 7 + 4 + 6 + 5);
}

TEST_CASE("an unknown INI key is an error naming it, with a suggestion", "[node_config]") {
  test::TempDir dir;
  NodeConfig cfg;
  const auto r = load_text(cfg, dir, "[train]\nlearning_rat = 1e-3\n");
  CHECK(r.outcome == NodeConfigLoad::Outcome::exit_failure);
  CHECK(r.exit_code() == 1);
  CHECK_THAT(r.error, Catch::Contains("unknown key 'train.learning_rat'") &&
                          Catch::Contains("did you mean 'train.learning_rate'"));
}

TEST_CASE("removed keys are unknown keys, in a file and on the command line", "[node_config]") {
  // One device budget (device.max_vram_gb, fractions for small ones); the link model and fault injection
  // are set through the C++ API by tests and benchmarks only, not by a config the binary reads.
  test::TempDir dir;
  const std::pair<const char*, const char*> removed[] = {{"device", "device_memory_mb = 64"},
                                                         {"device", "copy_bandwidth_gbps = 5.0"},
                                                         {"monitor", "allow_fault_injection = true"}};
  for (const auto& [section, line] : removed) {
    const std::string text(line);
    const std::string key = std::string(section) + "." + text.substr(0, text.find(' '));
    INFO(key);
    NodeConfig file;
    const auto r = load_text(file, dir, "[" + std::string(section) + "]\n" + text + "\n");
    CHECK(r.outcome == NodeConfigLoad::Outcome::exit_failure);
    CHECK_THAT(r.error, Catch::Contains("unknown key '" + key + "'"));
    NodeConfig cli;
    const std::string arg = "--" + key + "=" + text.substr(text.rfind(' ') + 1);
    const auto c = load_text(cli, dir, "", {arg});
    CHECK(c.outcome == NodeConfigLoad::Outcome::exit_failure);
    CHECK_THAT(c.error, Catch::Contains("unknown option") && Catch::Contains(arg));
  }
}

TEST_CASE("an unknown INI section is an error", "[node_config]") {
  test::TempDir dir;
  NodeConfig cfg;
  CHECK_THAT(load_text(cfg, dir, "[trian]\nmax_steps = 3\n").error,
             Catch::Contains("unknown key 'trian.max_steps'") && Catch::Contains("did you mean 'train.max_steps'"));
  NodeConfig cfg2;
  CHECK_THAT(load_text(cfg2, dir, "max_steps = 3\n").error, Catch::Contains("unknown key 'max_steps'"));
  NodeConfig cfg3;
  CHECK_THAT(load_text(cfg3, dir, "[train.sub]\nx = 3\n").error, Catch::Contains("unknown section '[train.sub]'"));
}

TEST_CASE("a value of the wrong type in an INI file is an error naming the key", "[node_config]") {
  test::TempDir dir;
  struct Case {
    const char* ini;
    const char* key;
  };
  for (const Case& c : {Case{"[train]\nmax_steps = \"ten\"\n", "train.max_steps"},
                        Case{"[train]\nmax_steps = 1.5\n", "train.max_steps"},
                        Case{"[model]\ntie_word_embeddings = 1\n", "model.tie_word_embeddings"},
                        Case{"[train]\nlearning_rate = \"fast\"\n", "train.learning_rate"},
                        Case{"[train]\noutput_dir = 5\n", "train.output_dir"}}) {
    NodeConfig cfg;
    const auto r = load_text(cfg, dir, c.ini);
    INFO(c.ini);
    CHECK(r.outcome == NodeConfigLoad::Outcome::exit_failure);
    CHECK_THAT(r.error, Catch::Contains(std::string(c.key) + " = ") && Catch::Contains("is not a valid"));
  }
}

TEST_CASE("an integer is accepted where a real is declared", "[node_config]") {
  test::TempDir dir;
  NodeConfig cfg;
  const auto r = load_text(cfg, dir, "[train]\nlearning_rate = 1\nmax_grad_norm = 0\n");
  INFO(r.error);
  CHECK(r.outcome == NodeConfigLoad::Outcome::run);
  CHECK(cfg.values.train.learning_rate == 1.0);
  CHECK(cfg.values.train.max_grad_norm == 0.0);
}

TEST_CASE("boolean keys take a bare flag or =true/=false on the command line, over the INI file", "[node_config]") {
  test::TempDir dir;
  NodeConfig a;
  REQUIRE(load_text(a, dir, "", {"--train.bf16"}).outcome == NodeConfigLoad::Outcome::run);
  CHECK(a.values.train.bf16);
  NodeConfig b;
  REQUIRE(load_text(b, dir, "", {"--train.bf16=true", "--model.tie_word_embeddings=1"}).outcome ==
          NodeConfigLoad::Outcome::run);
  CHECK(b.values.train.bf16);
  CHECK(b.values.model.tie_word_embeddings);
  NodeConfig c;  // the command line overrides the file, both ways
  REQUIRE(load_text(c, dir, "[train]\nbf16 = true\n", {"--train.bf16=false"}).outcome == NodeConfigLoad::Outcome::run);
  CHECK_FALSE(c.values.train.bf16);
  NodeConfig d;
  const auto r = load_text(d, dir, "", {"--train.bf16=maybe"});
  CHECK(r.outcome == NodeConfigLoad::Outcome::exit_failure);
  CHECK_THAT(r.error, Catch::Contains("train.bf16 takes true or false, got 'maybe'"));
}

TEST_CASE("unknown options and bad values on the command line are errors", "[node_config]") {
  test::TempDir dir;
  NodeConfig a;
  CHECK_THAT(load_text(a, dir, "", {"--train.bogus=1"}).error,
             Catch::Contains("unknown option") && Catch::Contains("--train.bogus=1"));
  NodeConfig b;
  const auto r = load_text(b, dir, "", {"--train.max_steps=abc"});
  CHECK(r.outcome == NodeConfigLoad::Outcome::exit_failure);
  CHECK_THAT(r.error, Catch::Contains("--train.max_steps=abc"));
  NodeConfig c;
  CHECK_THAT(load_text(c, dir, "", {"stray"}).error, Catch::Contains("unexpected argument 'stray'"));
}

TEST_CASE("values out of range fail validation before anything starts", "[node_config]") {
  test::TempDir dir;
  NodeConfig cfg;
  const auto r = load_text(cfg, dir, "[device]\nweight_slots = 1\n");
  CHECK(r.outcome == NodeConfigLoad::Outcome::exit_failure);
  CHECK_THAT(r.error, Catch::Contains("device.weight_slots: must be >= 2, got 1"));
  NodeConfig missing;
  CHECK_THAT(missing.load({"--config-file=" + kDemoIni}).error, Catch::Contains("data.train_files: no file matches"));
}

TEST_CASE("slot counts take auto in the INI file and on the command line", "[node_config]") {
  test::TempDir dir;
  NodeConfig a;
  REQUIRE(load_text(a, dir, "[device]\nweight_slots = \"auto\"\ngrad_slots = 3\n").error.empty());
  CHECK(a.values.device.weight_slots == 0);
  CHECK(a.values.device.grad_slots == 3);
  NodeConfig b;
  REQUIRE(load_text(b, dir, "", {"--device.grad_slots=auto", "--device.weight_slots=5"}).error.empty());
  CHECK(b.values.device.grad_slots == 0);
  CHECK(b.values.device.weight_slots == 5);
  NodeConfig c;
  CHECK_THAT(load_text(c, dir, "[device]\nweight_slots = \"many\"\n").error, Catch::Contains("device.weight_slots"));
  NodeConfig d;
  CHECK_THAT(load_text(d, dir, "", {"--train.max_steps=auto"}).error, Catch::Contains("--train.max_steps=auto"));
}

TEST_CASE("a missing or malformed config file is an error naming it", "[node_config]") {
  test::TempDir dir;
  NodeConfig a;
  const auto r = a.load({"--config-file=/nonexistent/x.ini"});
  CHECK(r.exit_code() == 1);
  CHECK_THAT(r.error, Catch::Contains("cannot read '/nonexistent/x.ini'"));
  NodeConfig b;
  const std::string bad = dir.file("bad.ini", "[train]\nmax_steps = = 3\n");
  CHECK_THAT(b.load({"--config-file=" + bad}).error, Catch::Contains(bad) && Catch::Contains("not a valid INI file"));
}

TEST_CASE("help and dump-config exit successfully without validating", "[node_config]") {
  NodeConfig a;
  CHECK(a.load({"--help"}).outcome == NodeConfigLoad::Outcome::exit_success);
  CHECK_THAT(a.help_text("node"),
             Catch::Contains("--train.learning_rate=<") && Catch::Contains("peak learning rate (now 0.0003)"));
  NodeConfig b;
  const auto r = b.load({"--config-file=" + kDemoIni, "--dump-config"});
  INFO(r.error);
  CHECK(r.outcome == NodeConfigLoad::Outcome::exit_success);
  CHECK(r.exit_code() == 0);
}

TEST_CASE("dump-config prints every key at full precision, and reads back to the same values", "[node_config]") {
  test::TempDir dir;
  NodeConfig first;
  REQUIRE(first
              .load(with_data(dir, {"--config-file=" + kDemoIni, "--train.adam_epsilon=1e-12",
                                    "--train.offload_dir=\"a \\\"q\\\" b\""}))
              .outcome == NodeConfigLoad::Outcome::run);
  const std::string dumped = first.dump_ini();
  CHECK_THAT(dumped, Catch::Contains("[train]") && Catch::Contains("adam_epsilon = 1e-12") &&
                         Catch::Contains("[log]") && Catch::Contains("rope_theta = 10000.0"));
  NodeConfig second;
  const auto r = second.load({}, dumped);
  INFO(r.error << "\n" << dumped);
  REQUIRE(r.outcome == NodeConfigLoad::Outcome::run);
  CHECK(second.values.train.adam_epsilon == 1e-12);
  CHECK(second.values.train.offload_dir == "a \"q\" b");
  CHECK(second.values.model.kv_heads == 2);
  CHECK(second.dump_ini() == dumped);
}

TEST_CASE("the CAF options are the key table's, in its order, and every boolean takes =true/=false", "[node_config]") {
  NodeConfig cfg;
  std::vector<std::string> table;
  for (const KeyDesc& k : config_keys()) table.push_back(k.qualified());
  CHECK(cfg.registered_keys() == table);
  const std::string help = cfg.help_text("node");
  const std::string dumped = cfg.dump_ini();
  int booleans = 0;
  for (const KeyDesc& k : config_keys()) {
    INFO(k.qualified());
    CHECK_THAT(help, Catch::Contains("--" + k.qualified() + "=<") && Catch::Contains(k.help));
    CHECK_THAT(dumped, Catch::Contains(std::string(k.name) + " = " + k.value_text(cfg.values) + "  ; " + k.help));
    if (!std::holds_alternative<BoolField>(k.field)) continue;
    ++booleans;
    NodeConfig b;
    CHECK_THAT(b.load({"--" + k.qualified() + "=maybe"}).error,
               Catch::Contains(k.qualified() + " takes true or false, got 'maybe'"));
  }
  CHECK(booleans == 10);  // monitor.allow_fault_injection is no key (issue 54)
}

TEST_CASE("--help lists at most 45 user keys, then the expert keys apart, each saying when to set it",
          "[node_config]") {
  NodeConfig cfg;
  const std::string help = cfg.help_text("megatrain train");
  const auto expert_header = help.find("\nExpert keys:");
  REQUIRE(expert_header != std::string::npos);
  int user_keys = 0;
  for (const KeyDesc& k : config_keys()) {
    INFO(k.qualified());
    const auto at = help.find("  --" + k.qualified() + "=<");
    REQUIRE(at != std::string::npos);
    if (k.is_expert()) {
      CHECK(at > expert_header);
      CHECK(std::string(k.expert_why).size() > 10);
      CHECK_THAT(help.substr(at), Catch::Contains("set it for: " + std::string(k.expert_why)));
    } else {
      CHECK(at < expert_header);
      ++user_keys;
    }
  }
  CHECK(user_keys <= 45);
  CHECK(user_keys >= 30);  // the sections a user needs are all there
  for (const char* user : {"train.learning_rate", "model.model_name_or_path", "data.train_files",
                           "train.resume_from_checkpoint", "device.max_vram_gb", "monitor.port", "cluster.mode"})
    CHECK_FALSE(find_key(user)->is_expert());
}
