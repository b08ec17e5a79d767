#include "config/node_config.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include <caf/config_value.hpp>
#include <caf/deep_to_string.hpp>
#include <caf/pec.hpp>
#include <caf/sec.hpp>

#include "config/ini_check.hpp"

namespace mt {

NodeConfig::NodeConfig() {
  auto& t = values.train;
  opt_group{custom_options_, "train"}
      .add(t.output_dir, "output_dir", "directory for logs, checkpoints and the final model")
      .add(t.per_device_train_batch_size, "per_device_train_batch_size", "sequences per micro-batch")
      .add(t.gradient_accumulation_steps, "gradient_accumulation_steps", "micro-batches per optimizer step")
      .add(t.max_steps, "max_steps", "optimizer steps to run")
      .add(t.learning_rate, "learning_rate", "peak learning rate")
      .add(t.lr_scheduler_type, "lr_scheduler_type", "constant | linear | cosine (after warmup)")
      .add(t.warmup_steps, "warmup_steps", "linear warmup steps from 0 to learning_rate")
      .add(t.min_lr_ratio, "min_lr_ratio", "decay floor as a fraction of learning_rate, in [0, 1]")
      .add(t.weight_decay, "weight_decay", "AdamW decoupled weight decay (matrices only)")
      .add(t.adam_beta1, "adam_beta1", "AdamW beta1")
      .add(t.adam_beta2, "adam_beta2", "AdamW beta2")
      .add(t.adam_epsilon, "adam_epsilon", "AdamW epsilon")
      .add(t.max_grad_norm, "max_grad_norm", "global gradient-norm clipping; 0 = off")
      .add(t.bf16, "bf16", "bf16 compute (weights streamed and multiplied in bf16) with fp32 master weights")
      .add(t.tf32, "tf32", "CUDA, fp32 compute: let the products use TF32 tensor cores (10-bit mantissa inputs)")
      .add(t.seed, "seed", "random seed (initialisation, data order)")
      .add(t.optimizer_compression, "optimizer_compression",
           "Adam moments: none | lossless (zstd, bit-identical) | int8 (block-wise, ~2 bytes/param)")
      .add(t.offload_dir, "offload_dir",
           "directory on an NVMe drive for the Adam moments (files, O_DIRECT); empty = host RAM")
      .add(t.offload_staging_stages, "offload_staging_stages",
           "moments outside the tiles: stages staged in RAM (read ahead, write behind), >= 3")
      .add(t.offload_io_threads, "offload_io_threads", "NVMe tier: I/O threads (1 MiB chunks in flight)")
      .add(t.offload_params, "offload_params",
           "the fp32 master weights in offload_dir too (needs bf16: RAM keeps the bf16 copy and the grads)")
      .add(t.save_steps, "save_steps", "checkpoint every N steps; 0 = only at the end")
      .add(t.save_total_limit, "save_total_limit", "checkpoints to keep; 0 = all")
      .add(t.resume_from_checkpoint, "resume_from_checkpoint", "checkpoint directory, 'latest', or empty")
      .add(t.resume_fallback, "resume_fallback", "none | previous_good (skip damaged checkpoints when resuming)")
      .add(t.save_minutes, "save_minutes", "also checkpoint every T minutes; 0 = off")
      .add(t.stop_after_steps, "stop_after_steps",
           "end this run after N total steps (LR schedule keeps max_steps); 0 = max_steps")
      .add(t.eval_steps, "eval_steps",
           "evaluate on data.validation_files every N steps (forward only); 0 = only at the end")
      .add(t.eval_max_batches, "eval_max_batches",
           "micro-batches per evaluation: the first N of the validation data, the same every time")
      .add(t.export_hf_dir, "export_hf_dir",
           "export the final weights as a Hugging Face model directory; empty = none");
  auto& m = values.model;
  opt_group{custom_options_, "model"}
      .add(m.config_file, "config_file", "Hugging Face config.json (or its directory); empty = the keys below")
      .add(m.model_name_or_path, "model_name_or_path", "Hugging Face model directory to start from")
      .add(m.arch, "arch", "llama | qwen2 | qwen3 | mistral | gpt2")
      .add(m.hidden_size, "hidden_size", "model width")
      .add(m.layers, "layers", "decoder layers (num_hidden_layers)")
      .add(m.heads, "heads", "attention heads")
      .add(m.kv_heads, "kv_heads", "key/value heads (GQA); 0 = heads")
      .add(m.head_dim, "head_dim", "per-head width; 0 = hidden_size / heads")
      .add(m.intermediate_size, "intermediate_size", "MLP width")
      .add(m.vocab_size, "vocab_size", "vocabulary size (must cover the data's tokens)")
      .add(m.max_position_embeddings, "max_position_embeddings", "longest sequence")
      .add(m.rope_theta, "rope_theta", "rotary embedding base")
      .add(m.norm_eps, "norm_eps", "RMSNorm / LayerNorm epsilon")
      .add(m.tie_word_embeddings, "tie_word_embeddings", "LM head shares the embedding matrix")
      .add(m.initializer_range, "initializer_range", "std of the normal initialisation");
  auto& d = values.data;
  opt_group{custom_options_, "data"}
      .add(d.train_files, "train_files", "glob of llm.c token shards for training")
      .add(d.validation_files, "validation_files", "glob of token shards for evaluation; empty = none")
      .add(d.tokenizer_file, "tokenizer_file", "tokenizer.json (vocabulary check); empty = none")
      .add(d.seq_length, "seq_length", "tokens per sequence");
  auto& v = values.device;
  opt_group{custom_options_, "device"}
      .add(v.backend, "backend", "cpu | cuda")
      .add(v.max_vram_gb, "max_vram_gb", "device memory budget in GiB; 0 = use device_memory_mb")
      .add(v.device_memory_mb, "device_memory_mb", "device memory budget in MiB; 0 = use max_vram_gb")
      .add(v.weight_slots, "weight_slots",
           "K streamed weight slots on the device (>= 2); auto (0) = 2, up to 4 when the budget allows")
      .add(v.grad_slots, "grad_slots",
           "gradient staging slots on the device (>= 1); auto (0) = 1, up to 4 when the budget allows")
      .add(v.keep_intermediates, "keep_intermediates", "auto | boundary | boundary_host | all")
      .add(v.copy_bandwidth_gbps, "copy_bandwidth_gbps", "copy engine limit per direction in GB/s; 0 = unlimited")
      .add(v.prefetch_depth, "prefetch_depth", "stages streamed ahead; 0 = weight_slots - 1")
      .add(v.schedule, "schedule", "interleaved | sequential (order of a step's micro-batches)")
      .add(v.gpus, "gpus",
           "devices of this node (>= 1), each with its own arena and gradient_accumulation_steps micro-batches "
           "per step; gradients are summed across them before the host accumulates (cpu: N arenas in one process; "
           "cuda: N GPUs, summed on GPU 0 with NCCL in device order, in builds with NCCL)");
  auto& h = values.threads;
  opt_group{custom_options_, "threads"}
      .add(h.total, "total", "the thread budget; 0 = hardware threads")
      .add(h.blas, "blas", "compute kernel threads; 0 = the whole budget")
      .add(h.optimizer, "optimizer",
           "optimizer and collector threads (they share the cores with compute in short bursts); 0 = one per "
           "8 cores of the budget on the cpu backend, the whole budget with a GPU")
      .add(h.copy, "copy", "copy engine workers (1 or 2); 0 = derived")
      .add(h.scheduler, "scheduler", "CAF scheduler threads; 0 = derived");
  auto& l = values.log;
  opt_group{custom_options_, "log"}
      .add(l.train_jsonl, "train_jsonl", "per-step JSONL log; empty = <output_dir>/train.jsonl")
      .add(l.events_jsonl, "events_jsonl", "actor events JSONL log; empty = <output_dir>/events.jsonl")
      .add(l.logging_steps, "logging_steps", "log every N steps");
  auto& mo = values.monitor;
  opt_group{custom_options_, "monitor"}
      .add(mo.enabled, "enabled", "serve the monitor endpoint (metrics, status, events, dashboard, control)")
      .add(mo.bind, "bind", "listen address of the endpoint (loopback by default)")
      .add(mo.port, "port", "listen port; 0 = any free port (see <output_dir>/monitor.json)")
      .add(mo.token_file, "token_file",
           "file holding the control bearer token; empty = a random token in <output_dir>/monitor.token (0600)")
      .add(mo.watchdog_warn_s, "watchdog_warn_s", "no step finished for T s: watchdog warning event; 0 = off")
      .add(mo.watchdog_dump_s, "watchdog_dump_s", "... dump every actor's state into the events; 0 = off")
      .add(mo.watchdog_restart_s, "watchdog_restart_s", "... restart the actor stuck in a handler; 0 = off")
      .add(mo.allow_fault_injection, "allow_fault_injection", "test-only: accept POST /control/fault?actor=NAME");
  auto& re = values.restart;
  opt_group{custom_options_, "restart"}
      .add(re.max_restarts, "max_restarts", "restarts per actor within window_s; past it: final checkpoint, stop")
      .add(re.window_s, "window_s", "the window of max_restarts, in seconds")
      .add(re.backoff_s, "backoff_s", "wait before respawning a failed actor (doubles per failure in the window)")
      .add(re.per_actor, "per_actor", "per-actor max_restarts, e.g. \"loader:20,compute:2\"; empty = none");
  auto& pl = values.plan;
  opt_group{custom_options_, "plan"}
      .add(pl.hardware, "hardware",
           "megatrain plan: this (measured now) | h200 | h100 | gh200 | a100 (a section of plan.hardware_file)")
      .add(pl.hardware_file, "hardware_file", "hardware profiles INI; empty = the built-in config/hardware.ini")
      .add(pl.host_ram_gb, "host_ram_gb", "host RAM to plan for (GiB); 0 = MemAvailable (this) or the profile's")
      .add(pl.disk_gb, "disk_gb", "free disk for train.offload_dir (GiB); 0 = statvfs (this) or the profile's")
      .add(pl.enforce, "enforce", "train refuses a run whose plan does not fit host RAM or disk; false = warn only");
}

namespace {

const std::string kConfigFileFlag = "--config-file=";

bool is_parser_error(const caf::error& e, caf::pec code) {
  return e.category() == caf::atom("parser") && e.code() == static_cast<std::uint8_t>(code);
}

// CAF 0.17 takes a boolean on the command line only as a bare flag (--train.bf16), and refuses
// --train.bf16=true, although --help prints "=<boolean>" (and Hugging Face users type exactly that).
// Such arguments are taken out before CAF parses and applied after it, so they override the INI file.
struct BoolArgument {
  bool* value;
  bool parsed;
};

// Takes every "--KEY=VALUE" whose KEY is one of `keys` out of args; false with `error` set on a value
// that is not a boolean.
bool take_bool_arguments(std::vector<std::string>& args, const std::vector<std::pair<std::string, bool*>>& keys,
                         std::vector<BoolArgument>& out, std::string& error) {
  for (auto it = args.begin(); it != args.end();) {
    bool taken = false;
    for (const auto& [key, target] : keys) {
      const std::string prefix = "--" + key + "=";
      if (it->rfind(prefix, 0) != 0) continue;
      const std::string v = it->substr(prefix.size());
      if (v == "true" || v == "1" || v == "yes" || v == "on")
        out.push_back({target, true});
      else if (v == "false" || v == "0" || v == "no" || v == "off")
        out.push_back({target, false});
      else {
        error = "command line: " + key + " takes true or false, got '" + v + "'";
        return false;
      }
      taken = true;
      break;
    }
    it = taken ? args.erase(it) : it + 1;
  }
  return true;
}

}  // namespace

NodeConfigLoad NodeConfig::load(int argc, char** argv) {
  std::vector<std::string> args;
  if (argc > 0) program = argv[0];
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return load(args, "");
}

NodeConfigLoad NodeConfig::load(const std::vector<std::string>& arguments, const std::string& config_file_text) {
  NodeConfigLoad result;
  auto fail = [&](std::string message) {
    result.outcome = NodeConfigLoad::Outcome::exit_failure;
    result.error = std::move(message);
    return result;
  };
  // The INI file is read here, strictly, and the command line applied after it (overrides the file).
  std::vector<std::string> args;
  std::string ini_text = config_file_text;
  std::string source = "config text";
  for (const auto& a : arguments) {
    if (a.rfind(kConfigFileFlag, 0) != 0) {
      args.push_back(a);
      continue;
    }
    config_file = a.substr(kConfigFileFlag.size());
    std::ifstream in(config_file);
    if (!in) return fail("--config-file: cannot read '" + config_file + "'");
    std::ostringstream text;
    text << in.rdbuf();
    ini_text = text.str();
    source = config_file;
  }
  if (!ini_text.empty()) {
    std::istringstream in(ini_text);
    auto ini = caf::actor_system_config::parse_config(in);
    if (!ini) return fail(source + ": not a valid INI file: " + render(ini.error()));
    const std::string error = apply_ini_settings(*ini, custom_options_, content, source);
    if (!error.empty()) return fail(error);
  }
  for (const char* flag : {"--help", "-h", "-?"}) {
    if (std::find(args.begin(), args.end(), flag) != args.end()) {
      std::cout << help_text(program) << std::flush;
      result.outcome = NodeConfigLoad::Outcome::exit_success;
      return result;
    }
  }
  // --dump-config is ours: CAF's rounds reals to 6 decimals.
  const auto dump = std::find(args.begin(), args.end(), "--dump-config");
  const bool dump_requested = dump != args.end();
  if (dump_requested) args.erase(dump);
  std::vector<BoolArgument> bools;
  std::string bool_error;
  if (!take_bool_arguments(args,
                           {{"train.bf16", &values.train.bf16},
                            {"train.tf32", &values.train.tf32},
                            {"train.offload_params", &values.train.offload_params},
                            {"model.tie_word_embeddings", &values.model.tie_word_embeddings},
                            {"monitor.enabled", &values.monitor.enabled},
                            {"monitor.allow_fault_injection", &values.monitor.allow_fault_injection},
                            {"plan.enforce", &values.plan.enforce}},
                           bools, bool_error))
    return fail(bool_error);
  for (auto& a : args)  // --device.weight_slots=auto (and grad_slots): stored as 0, sized by the engine
    if (a.size() > 7 && a.compare(0, 2, "--") == 0 && a.compare(a.size() - 5, 5, "=auto") == 0 &&
        is_auto_integer_key(a.substr(2, a.size() - 7)))
      a = a.substr(0, a.size() - 4) + "0";
  std::istringstream no_file;
  if (auto err = parse(args, no_file)) {
    if (is_parser_error(err, caf::pec::not_an_option))
      return fail("command line: unknown option in " + render(err) + "; --help lists every key");
    return fail("command line: bad value in " + render(err));
  }
  if (cli_helptext_printed || dump_requested) {  // --help / --long-help (CAF printed them) or --dump-config
    if (dump_requested && !cli_helptext_printed) std::cout << dump_ini() << std::flush;
    result.outcome = NodeConfigLoad::Outcome::exit_success;
    return result;
  }
  if (!remainder.empty()) return fail("command line: unexpected argument '" + remainder.front() + "'");
  for (const BoolArgument& b : bools) *b.value = b.parsed;
  try {
    if (check_files)
      values.validate();
    else
      values.validate_values();
  } catch (const ConfigError& e) {
    return fail(std::string("config: ") + e.what());
  }
  configure_scheduler(*this, values.thread_budget().scheduler);
  return result;
}

void configure_scheduler(caf::actor_system_config& cfg, int threads) {
  cfg.set("scheduler.max-threads", static_cast<caf::config_value::integer>(std::max(1, threads)));
  cfg.set("scheduler.policy", caf::atom("sharing"));
}

namespace {

bool is_train_section(const std::string& category) {
  static const std::string sections[] = {"train", "model",   "data",    "device", "threads",
                                         "log",   "monitor", "restart", "plan"};
  return std::find(std::begin(sections), std::end(sections), category) != std::end(sections);
}

std::string option_key(const caf::config_option& opt) {
  return std::string(opt.category().begin(), opt.category().end()) + "." +
         std::string(opt.long_name().begin(), opt.long_name().end());
}

}  // namespace

namespace {

std::string ini_value(const caf::config_value& v) {
  if (const auto* text = caf::get_if<std::string>(&v)) {
    std::string quoted = "\"";
    for (char ch : *text) {
      if (ch == '"' || ch == '\\') quoted += '\\';
      quoted += ch;
    }
    return quoted + "\"";
  }
  if (const auto* flag = caf::get_if<bool>(&v)) return *flag ? "true" : "false";
  if (const auto* integer = caf::get_if<caf::config_value::integer>(&v)) return std::to_string(*integer);
  if (const auto* real = caf::get_if<caf::config_value::real>(&v)) {
    // The shortest text that reads back to the same double.
    char buffer[40];
    for (int digits = 15; digits <= 17; ++digits) {
      std::snprintf(buffer, sizeof buffer, "%.*g", digits, *real);
      if (std::strtod(buffer, nullptr) == *real) break;
    }
    std::string out = buffer;
    if (out.find_first_of(".eni") == std::string::npos) out += ".0";  // stays a real when read back
    return out;
  }
  return caf::deep_to_string(v);
}

}  // namespace

std::string NodeConfig::dump_ini() const {
  std::ostringstream out;
  out << "; megatrain node config: every key with its current value (--config-file reads this back)\n";
  std::string section;
  for (const auto& opt : custom_options_) {
    const std::string category(opt.category().begin(), opt.category().end());
    if (!is_train_section(category)) continue;
    if (category != section) out << (section.empty() ? "" : "\n") << "[" << category << "]\n";
    section = category;
    const auto value = opt.get();
    out << std::string(opt.long_name().begin(), opt.long_name().end()) << " = " << (value ? ini_value(*value) : "\"\"")
        << "  ; " << std::string(opt.description().begin(), opt.description().end()) << "\n";
  }
  return out.str();
}

std::string NodeConfig::help_text(const std::string& program) const {
  std::ostringstream out;
  out << "usage: " << program << " [--config-file=FILE.ini] [--section.key=value ...]\n"
      << "  --help: this text; --dump-config: every key as an INI file; --long-help: CAF's own options too\n"
      << "  in INI files strings need double quotes and comments start with ';'\n";
  std::string section;
  for (const auto& opt : custom_options_) {
    const std::string category(opt.category().begin(), opt.category().end());
    if (!is_train_section(category)) continue;
    if (category != section) out << "\n[" << category << "]\n";
    section = category;
    const auto value = opt.get();
    out << "  --" << option_key(opt) << "=<" << std::string(opt.type_name().begin(), opt.type_name().end()) << ">  "
        << std::string(opt.description().begin(), opt.description().end()) << " (now "
        << (value ? ini_value(*value) : "?") << ")\n";
  }
  return out.str();
}

std::vector<std::string> NodeConfig::registered_keys() const {
  std::vector<std::string> keys;
  for (const auto& opt : custom_options_)
    if (is_train_section(std::string(opt.category().begin(), opt.category().end()))) keys.push_back(option_key(opt));
  return keys;
}

caf::settings NodeConfig::dump_content() const {
  caf::settings result = actor_system_config::dump_content();
  for (const auto& opt : custom_options_) {
    if (!is_train_section(std::string(opt.category().begin(), opt.category().end()))) continue;
    if (auto value = opt.get()) caf::put(result, option_key(opt), std::move(*value));
  }
  return result;
}

}  // namespace mt
