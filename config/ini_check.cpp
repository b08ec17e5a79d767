#include "config/ini_check.hpp"

#include <algorithm>
#include <vector>

#include <caf/config_option.hpp>
#include <caf/config_value.hpp>
#include <caf/deep_to_string.hpp>

#include "config/keys.hpp"

namespace mt {

namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string full_name(const caf::config_option& opt) {
  const std::string category(opt.category().begin(), opt.category().end());
  const std::string name(opt.long_name().begin(), opt.long_name().end());
  return category == "global" ? name : category + "." + name;
}

std::string value_text(const caf::config_value& v) { return caf::deep_to_string(v); }

// Checks one key = value and stores it; returns an error text or "".
std::string apply_one(const std::string& category, const std::string& key, const caf::config_value& value,
                      const caf::config_option_set& options, caf::settings& content, const std::string& source) {
  const std::string shown = category == "global" ? key : category + "." + key;
  const caf::config_option* opt = options.qualified_name_lookup(category, key);
  if (opt == nullptr) {
    std::string message = source + ": unknown key '" + shown + "'";
    const std::string suggestion = closest_option_name(shown, options);
    if (!suggestion.empty()) message += " (did you mean '" + suggestion + "'?)";
    return message + "; --help lists every key";
  }
  caf::config_value stored = value;
  // Slot counts take "auto" (stored as 0: the engine sizes them from the device budget).
  if (const auto* text = caf::get_if<std::string>(&stored);
      text != nullptr && *text == "auto" && is_auto_integer_key(shown))
    stored = caf::config_value{caf::config_value::integer{0}};
  if (opt->check(stored)) {
    // INI writes reals as integers when they have no fraction (learning_rate=1): accept them as reals.
    if (const auto* i = caf::get_if<caf::config_value::integer>(&value)) {
      caf::config_value as_real{static_cast<caf::config_value::real>(*i)};
      if (!opt->check(as_real)) stored = as_real;
    }
  }
  if (opt->check(stored)) {
    const std::string type(opt->type_name().begin(), opt->type_name().end());
    return source + ": " + shown + " = " + value_text(value) + " is not a valid " + type + " (strings need quotes)";
  }
  opt->store(stored);
  if (category == "global")
    content[key] = stored;
  else
    caf::put(content, category + "." + key, stored);
  return "";
}

}  // namespace

std::string closest_option_name(const std::string& key, const caf::config_option_set& options) {
  std::string best;
  std::size_t best_distance = 4;  // more than 3 edits away is no longer a typo
  for (const auto& opt : options) {
    const std::string name = full_name(opt);
    const std::size_t d = edit_distance(key, name);
    if (d < best_distance) best_distance = d, best = name;
  }
  return best;
}

bool is_auto_integer_key(const std::string& qualified_key) {
  const KeyDesc* key = find_key(qualified_key);
  return key != nullptr && key->auto_zero;
}

std::string apply_ini_settings(const caf::settings& ini, const caf::config_option_set& options, caf::settings& content,
                               const std::string& source) {
  for (const auto& [top_key, top_value] : ini) {
    const auto* section = caf::get_if<caf::settings>(&top_value);
    if (section == nullptr) {
      // A key before any [section] header: CAF files it under the global category.
      std::string error = apply_one("global", top_key, top_value, options, content, source);
      if (!error.empty()) return error;
      continue;
    }
    for (const auto& [key, value] : *section) {
      if (caf::holds_alternative<caf::settings>(value))
        return source + ": unknown section '[" + top_key + "." + key + "]'";
      std::string error = apply_one(top_key, key, value, options, content, source);
      if (!error.empty()) return error;
    }
  }
  return "";
}

}  // namespace mt
