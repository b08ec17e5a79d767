// config/README.md's key table, rendered from the key table (config/keys.cpp): a test compares the
// README with it, and `megatrain-key-table --update config/README.md` rewrites it.
#include <sstream>

#include "config/keys.hpp"

namespace mt {

namespace {

const std::string kBegin = "<!-- key table: generated from config/keys.cpp by megatrain-key-table; do not edit -->";
const std::string kEnd = "<!-- end of key table -->";

// Markdown cell text: '|' would end the cell and '<' start an HTML tag.
std::string cell(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|')
      out += "\\|";
    else if (ch == '<')
      out += "&lt;";
    else
      out += ch;
  }
  return out;
}

}  // namespace

std::string key_table_markdown() {
  const TrainConfig defaults;
  std::ostringstream out;
  out << "### The user's keys\n\n| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
  for (const KeyDesc& k : config_keys())
    if (!k.is_expert())
      out << "| `" << k.qualified() << "` | " << k.type_name() << " | `" << k.value_text(defaults) << "` | "
          << cell(k.allowed_text()) << " | " << cell(k.help) << " |\n";
  out << "\n### Expert keys\n\nThe planner's or the default's choice is right for most runs; the last column says "
         "when to set one.\n\n| key | type | default | allowed | meaning | set it for |\n|---|---|---|---|---|---|\n";
  for (const KeyDesc& k : config_keys())
    if (k.is_expert())
      out << "| `" << k.qualified() << "` | " << k.type_name() << " | `" << k.value_text(defaults) << "` | "
          << cell(k.allowed_text()) << " | " << cell(k.help) << " | " << cell(k.expert_why) << " |\n";
  return out.str();
}

std::string with_key_table(const std::string& readme) {
  const auto begin = readme.find(kBegin);
  const auto end = readme.find(kEnd);
  if (begin == std::string::npos || end == std::string::npos || end < begin) return readme;
  const auto body = begin + kBegin.size();
  return readme.substr(0, body) + "\n" + key_table_markdown() + readme.substr(end);
}

}  // namespace mt
