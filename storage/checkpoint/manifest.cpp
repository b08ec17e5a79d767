#include "storage/checkpoint/manifest.hpp"

#include <fstream>

#include "storage/checkpoint/checkpoint_error.hpp"
#include "storage/checkpoint/checksum.hpp"
#include "storage/hf/file_util.hpp"
#include "storage/hf/hf_config.hpp"

namespace mt::ckpt {

using nlohmann::json;

namespace {
constexpr const char* kSelfChecksum = "manifest_xxh3_64";

std::string self_checksum(json m) {
  m.erase(kSelfChecksum);
  const std::string text = m.dump();
  return checksum_hex(checksum(text.data(), text.size()));
}
}  // namespace

void write_manifest(const std::filesystem::path& file, json manifest) {
  manifest[kSelfChecksum] = self_checksum(manifest);
  try {
    hf::write_text_atomically(file, manifest.dump(1) + "\n");
  } catch (const hf::HfError& e) {
    throw CheckpointError(e.what());
  }
}

json read_manifest(const std::filesystem::path& file) {
  if (!std::filesystem::exists(file))
    throw CheckpointError(file.string() + ": manifest is missing (incomplete or damaged checkpoint)");
  std::ifstream in(file);
  if (!in) throw CheckpointError(file.string() + ": cannot open manifest");
  json m;
  try {
    m = json::parse(in);
  } catch (const json::exception& e) {
    throw CheckpointError(file.string() + ": manifest is not valid JSON (damaged): " + e.what());
  }
  if (!m.is_object() || !m.contains("format") || m["format"] != kFormatName)
    throw CheckpointError(file.string() + ": not a megatrain checkpoint manifest");
  if (!m.contains(kSelfChecksum) || !m[kSelfChecksum].is_string() ||
      m[kSelfChecksum].get<std::string>() != self_checksum(m))
    throw CheckpointError(file.string() + ": manifest checksum mismatch (damaged)");
  if (!m.contains("format_version") || m["format_version"] != kFormatVersion)
    throw CheckpointError(file.string() + ": unsupported format_version " + m.value("format_version", json()).dump() +
                          " (this build reads " + std::to_string(kFormatVersion) + ")");
  return m;
}

}  // namespace mt::ckpt
