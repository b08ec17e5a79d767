// The one description of every config key (config/keys.cpp): section, name, where its value lives in
// a TrainConfig, help text, and the range or choices a value alone must satisfy. Its default is the
// member's initialiser in train_config.hpp. From this table come the CAF option binding, --help and
// --dump-config (config/node_config.cpp), the per-key checks of validate() with messages naming
// "section.name", the key names that other messages mention (key_of) and config/README.md's key table.
// No CAF here: megatrain_config uses it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "config/train_config.hpp"

namespace mt {

// Where a key's value lives, one alternative per INI value type.
using StringField = std::string& (*)(TrainConfig&);
using IntegerField = std::int64_t& (*)(TrainConfig&);
using RealField = double& (*)(TrainConfig&);
using BoolField = bool& (*)(TrainConfig&);
using KeyField = std::variant<StringField, IntegerField, RealField, BoolField>;

struct KeyDesc {
  template <class T>
  KeyDesc(const char* section_, const char* name_, T& (*field_)(TrainConfig&), const char* help_)
      : section(section_), name(name_), field(field_), help(help_) {}

  // Builders for the table: what a value of this key alone must be.
  KeyDesc&& at_least(std::int64_t v) && { return min = v, std::move(*this); }
  KeyDesc&& at_most(std::int64_t v) && { return max = v, std::move(*this); }
  // "auto" (command line or INI) is stored as 0, which the engine sizes; 0 is exempt from the minimum.
  KeyDesc&& takes_auto() && { return auto_zero = true, std::move(*this); }
  KeyDesc&& positive() && { return lo = 0, lo_open = true, std::move(*this); }
  KeyDesc&& non_negative() && { return lo = 0, std::move(*this); }
  KeyDesc&& within(double lo_, double hi_, bool hi_inclusive) && {
    return lo = lo_, hi = hi_, hi_open = !hi_inclusive, std::move(*this);
  }
  KeyDesc&& one_of(std::vector<std::string> names) && { return choices = std::move(names), std::move(*this); }
  KeyDesc&& not_empty(const char* message = "must not be empty") && { return empty_error = message, std::move(*this); }
  // An expert key: the planner's or the default's choice is right for most runs; `why` says when to set
  // it. --help and config/README.md list these apart, after the user's keys.
  KeyDesc&& expert(const char* why) && { return expert_why = why, std::move(*this); }
  bool is_expert() const { return expert_why != nullptr; }

  std::string qualified() const { return std::string(section) + "." + name; }
  const char* type_name() const;  // string, integer, real, boolean
  // The key's current text in `config`: strings quoted, reals the shortest text that reads back exactly.
  std::string value_text(const TrainConfig& config) const;
  // "" or what the range / choices allow, for the README ("1 to 64", "> 0", "cpu, cuda").
  std::string allowed_text() const;
  // Throws ConfigError naming the key when its value in `config` is outside the range or choices.
  void check(const TrainConfig& config) const;

  const char* section;
  const char* name;
  KeyField field;
  const char* help;
  std::int64_t min = std::numeric_limits<std::int64_t>::min();  // integers
  std::int64_t max = std::numeric_limits<std::int64_t>::max();
  bool auto_zero = false;
  double lo = -std::numeric_limits<double>::infinity();  // reals: always finite, lo <(=) value <(=) hi
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;
  std::vector<std::string> choices;   // strings: one of these (empty = any)
  const char* empty_error = nullptr;  // strings: non-null = must not be empty, this is the message
  const char* expert_why = nullptr;   // non-null: an expert key, and when to set it
};

// The values of the enum-valued keys, in the order their choices are listed (the table's choices are
// their names; TrainConfig's lr_schedule() etc. parse with them).
extern const LrSchedule kLrSchedules[3];
extern const OptimizerCompression kOptimizerCompressions[3];
extern const MasterWeights kMasterWeights[3];
extern const GradientBuffer kGradientBuffers[3];
extern const KeepIntermediates kKeepIntermediates[6];
extern const MicroBatchOrder kMicroBatchOrders[3];

// Every key, in section order ([train] [model] [data] [device] [threads] [log] [monitor] [restart] [plan] [cluster]).
const std::vector<KeyDesc>& config_keys();
const std::vector<std::string>& config_sections();
const KeyDesc* find_key(const std::string& qualified);  // nullptr when no key has that name

// The qualified name of the key whose value is `field`, a member of `config`: messages about keys
// take their names from the table instead of retyping them. std::logic_error for a non-key. (The
// type is compared too: a section shares its address with its first key.)
std::string key_name(const TrainConfig& config, const void* field, std::size_t type_index);
template <class T>
std::string key_of(const TrainConfig& config, const T& field) {
  return key_name(config, &field, KeyField(static_cast<T& (*)(TrainConfig&)>(nullptr)).index());
}

// Runs every key's own check (range, choices, not empty); cross-key rules stay in validate().
void check_key_values(const TrainConfig& config);

// Runs `work`; an exception about the key's value (e.g. the file it names is not what the key needs)
// becomes a ConfigError starting with the key: "data.tokenizer_file: /etc/passwd: not valid JSON".
// A ConfigError already names its key and passes unchanged.
template <class Work>
auto naming_key(const std::string& key, Work&& work) -> decltype(work()) {
  try {
    return work();
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(key, e.what());
  }
}

// config/README.md's key table as markdown (one row per key), and the README text with the part
// between its key-table markers replaced by it (unchanged when the markers are missing).
std::string key_table_markdown();
std::string with_key_table(const std::string& readme);

}  // namespace mt
