// Opens a published checkpoint, verifies it and reads it back stage by stage into caller buffers.
//
//   auto r = CheckpointReader::open(root);          // `latest`, fully verified
//   r.read_stage(s, params, exp_avg, exp_avg_sq);   // per-dataset checksums checked as it reads
//
// Every problem is a CheckpointError naming the file: a missing or damaged manifest, a shard whose
// size or checksum differs from the manifest, a dataset whose checksum differs from its attribute.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/model_config.hpp"
#include "storage/checkpoint/checkpoint_error.hpp"

namespace mt::ckpt {

enum class Verify {
  full,      // manifest + every shard's size and whole-file checksum (reads every byte once)
  manifest,  // manifest + shard sizes only (per-dataset checksums are still checked by read_stage)
};

enum class Fallback {
  none,           // a damaged latest checkpoint is an error
  previous_good,  // try older checkpoints, newest first, until one verifies
};

class CheckpointReader {
 public:
  // `dir` is one step directory (ROOT/step-N).
  explicit CheckpointReader(const std::filesystem::path& dir, Verify verify = Verify::full);

  // `path` is a step directory, or a root whose `latest` is opened (with Fallback::previous_good, the
  // newest one that verifies; skipped() then says why the others were refused).
  static CheckpointReader open(const std::filesystem::path& path, Fallback fallback = Fallback::none,
                               Verify verify = Verify::full);

  const std::filesystem::path& dir() const { return dir_; }
  std::int64_t step() const { return step_; }
  const ModelConfig& model_config() const { return config_; }
  const nlohmann::json& manifest() const { return manifest_; }
  const nlohmann::json& run_state() const { return manifest_.at("run"); }
  const std::vector<std::string>& skipped() const { return skipped_; }

  bool has_state(const std::string& state) const;  // "params", "exp_avg", "exp_avg_sq"
  std::uint64_t total_bytes() const;               // sum of the shard sizes

  // Checks every shard's size and checksum against the manifest.
  void verify_files() const;
  // Reads every dataset of every stage through HDF5 and checks its checksum (one stage buffer at a time).
  void verify_datasets() const;

  // Fills each non-null buffer (stage_layout(model_config(), stage).total_floats floats; padding zeroed).
  // Asking for a state the checkpoint lacks is an error.
  void read_stage(std::int64_t stage, float* params, float* exp_avg = nullptr, float* exp_avg_sq = nullptr) const;
  void read_stage_state(std::int64_t stage, const std::string& state, float* dst) const;

 private:
  std::filesystem::path dir_;
  nlohmann::json manifest_;
  ModelConfig config_;
  std::int64_t step_ = 0;
  std::vector<std::string> skipped_;
};

}  // namespace mt::ckpt
