#include "config/node_config.hpp"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>
#include <variant>

#include <caf/config_value.hpp>
#include <caf/pec.hpp>
#include <caf/sec.hpp>

#include "config/ini_check.hpp"
#include "config/keys.hpp"

namespace mt {

// Every key of the table (config/keys.cpp) becomes a CAF option bound to its member of `values`.
NodeConfig::NodeConfig() {
  for (const KeyDesc& key : config_keys())
    std::visit(
        [&](auto field) {
          opt_group{custom_options_, key.section}.add(field(values), key.name, key.help);
        },
        key.field);
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
  std::vector<std::pair<std::string, bool*>> bool_keys;
  for (const KeyDesc& key : config_keys())
    if (const auto* field = std::get_if<BoolField>(&key.field))
      bool_keys.emplace_back(key.qualified(), &(*field)(values));
  if (!take_bool_arguments(args, bool_keys, bools, bool_error)) return fail(bool_error);
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
  const auto& sections = config_sections();
  return std::find(sections.begin(), sections.end(), category) != sections.end();
}

std::string option_key(const caf::config_option& opt) {
  return std::string(opt.category().begin(), opt.category().end()) + "." +
         std::string(opt.long_name().begin(), opt.long_name().end());
}

}  // namespace

std::string NodeConfig::dump_ini() const {
  std::ostringstream out;
  out << "; megatrain node config: every key with its current value (--config-file reads this back)\n";
  std::string section;
  for (const KeyDesc& key : config_keys()) {
    if (key.section != section) out << (section.empty() ? "" : "\n") << "[" << key.section << "]\n";
    section = key.section;
    out << key.name << " = " << key.value_text(values) << "  ; " << key.help << "\n";
  }
  return out.str();
}

std::string NodeConfig::help_text(const std::string& program) const {
  std::ostringstream out;
  out << "usage: " << program << " [--config-file=FILE.ini] [--section.key=value ...]\n"
      << "  --help: this text; --dump-config: every key as an INI file; --long-help: CAF's own options too\n"
      << "  in INI files strings need double quotes and comments start with ';'\n";
  help_keys(out, false);
  out << "\n\nExpert keys: the planner's or the default's choice is right for most runs; each says when to set "
         "it.\n";
  help_keys(out, true);
  return out.str();
}

// The user's keys (expert = false) or the expert keys, by section, each with its type and current value.
void NodeConfig::help_keys(std::ostream& out, bool expert) const {
  std::string section;
  for (const KeyDesc& key : config_keys()) {
    if (key.is_expert() != expert) continue;
    if (key.section != section) out << "\n[" << key.section << "]\n";
    section = key.section;
    const caf::config_option* opt = custom_options_.qualified_name_lookup(key.section, key.name);
    out << "  --" << key.qualified() << "=<" << std::string(opt->type_name().begin(), opt->type_name().end()) << ">  "
        << key.help << " (now " << key.value_text(values) << ")\n";
    if (expert) out << "      set it for: " << key.expert_why << "\n";
  }
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
