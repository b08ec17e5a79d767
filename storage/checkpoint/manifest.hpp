// manifest.json: the description of one checkpoint (see checkpoint_format.md). It carries its own
// checksum ("manifest_xxh3_64", over the compact dump of every other field) so a damaged manifest is
// detected like a damaged shard.
#pragma once
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace mt::ckpt {

inline constexpr const char* kFormatName = "megatrain-checkpoint";
inline constexpr int kFormatVersion = 1;

// Adds the self-checksum and writes the file atomically (temp + fsync + rename).
void write_manifest(const std::filesystem::path& file, nlohmann::json manifest);
// Reads and checks format, version and self-checksum; CheckpointError naming the file otherwise.
nlohmann::json read_manifest(const std::filesystem::path& file);

}  // namespace mt::ckpt
