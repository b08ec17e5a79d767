// Strict INI handling for CAF 0.17, whose own INI reader silently drops unknown keys and values of the
// wrong type: applies already-parsed INI settings option by option and reports the first problem.
#pragma once
#include <string>

#include <caf/config_option_set.hpp>
#include <caf/settings.hpp>

namespace mt {

// Stores every entry of `ini` (sections -> keys -> values) through its declared option in `options`
// and into `content`. Returns "" on success, otherwise an error naming `source` and the key: an
// unknown key (with the closest known key as a suggestion), a nested section, or a value the option
// cannot take. An integer is accepted where a real is declared.
std::string apply_ini_settings(const caf::settings& ini, const caf::config_option_set& options, caf::settings& content,
                               const std::string& source);

// "did you mean ...?" helper: the registered "category.name" closest to `key` within a small edit
// distance, or "".
// Integer keys that also take "auto" (stored as 0): device.weight_slots, device.grad_slots.
bool is_auto_integer_key(const std::string& qualified_key);

std::string closest_option_name(const std::string& key, const caf::config_option_set& options);

}  // namespace mt
