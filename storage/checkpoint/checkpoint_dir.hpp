// The checkpoint root directory: naming, listing and the `latest` pointer.
//
//   ROOT/latest                        text file: the name of the newest published step directory
//   ROOT/step-00000100/manifest.json   one directory per published checkpoint (see checkpoint_format.md)
//   ROOT/step-00000100/plan.json       the device plan the run executed (when the writer was given one)
//   ROOT/step-00000100/shard-00000.h5
//   ROOT/.tmp-step-00000200-PID-N/     a checkpoint being written (never loaded; removed when stale)
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace mt::ckpt {

inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kPlanFile = "plan.json";  // the run's device plan, beside the manifest
inline constexpr const char* kLatestFile = "latest";
inline constexpr const char* kTempPrefix = ".tmp-";

std::string step_dir_name(std::int64_t step);                                          // "step-00000100"
std::string shard_file_name(std::size_t shard, const std::string& prefix = "shard-");  // "shard-00000.h5"
std::string stage_group_name(std::int64_t stage);                                      // "stage_00000"
// The step of a "step-N" directory name; nullopt for any other name.
std::optional<std::int64_t> parse_step_dir_name(const std::string& name);

struct CheckpointEntry {
  std::filesystem::path dir;
  std::int64_t step = 0;
  bool has_manifest = false;  // false: damaged (a published checkpoint always has one)
  bool is_latest = false;
};
// Published step directories under root, by increasing step; temporary directories are never listed.
std::vector<CheckpointEntry> list_checkpoints(const std::filesystem::path& root);

// The directory `latest` names; nullopt when there is no pointer yet.
std::optional<std::filesystem::path> read_latest(const std::filesystem::path& root);
// Points `latest` at root/dir_name: temp file, fsync, rename, fsync of root (atomic on POSIX).
void write_latest(const std::filesystem::path& root, const std::string& dir_name);

// Removes temporary directories left by writers that no longer run (kill -9, power loss).
void remove_stale_temp_dirs(const std::filesystem::path& root);

}  // namespace mt::ckpt

namespace mt::ckpt {
// Keeps the newest `keep_last` step directories (by step) and the one `latest` names; removes the
// rest (renamed to a temporary name first, so a half-deleted one is never mistaken for a checkpoint).
// keep_last <= 0 keeps everything. Returns the directories removed.
std::vector<std::filesystem::path> apply_retention(const std::filesystem::path& root, int keep_last);
}  // namespace mt::ckpt
