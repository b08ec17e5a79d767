// Small file helpers shared by the Hugging Face and checkpoint code.
#pragma once
#include <filesystem>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace mt::hf {

// Writes `text` to `path` through `path`.tmp, fsync and rename: a reader never sees half a file.
void write_text_atomically(const std::filesystem::path& path, const std::string& text);

// Parses a JSON file; HfError naming the file when it is missing or not JSON.
nlohmann::json read_json_file(const std::filesystem::path& path);

// fsyncs a directory so that renames and creations inside it are durable.
void fsync_directory(const std::filesystem::path& dir);

}  // namespace mt::hf
