// Writes one checkpoint, stage by stage, then publishes it atomically.
//
//   CheckpointWriter w(root, step, config);               // creates ROOT/.tmp-step-N-PID-K/
//   w.write_stage(s, {params, exp_avg, exp_avg_sq});       // any thread, any order, each stage once
//   w.finalize(run_state);                                  // manifest, fsync, rename, `latest`, retention
//
// write_stage copies nothing: it writes the caller's buffers straight into HDF5 datasets (one per
// tensor, contiguous, uncompressed; HDF5 lays out the metadata, the bytes go beside it, mostly with
// O_DIRECT) and returns when the bytes are handed to the OS, so the caller may change the buffers
// afterwards. It is meant to run on the checkpointer's background thread right after
// the optimizer updated stage s. Calls are serialised inside (HDF5 takes one global lock anyway).
//
// Any failure (disk full, I/O error) throws CheckpointError naming the file; nothing is published,
// the previous checkpoints and `latest` stay as they were, and destroying the writer (or abort())
// removes the temporary directory. A process killed mid-write leaves only a .tmp- directory that
// no reader ever loads and the next successful publish removes.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/model_config.hpp"
#include "storage/checkpoint/checkpoint_error.hpp"

namespace mt::ckpt {

// The fp32 buffers of one stage, each stage_layout(config, s).total_floats long; nullptr = not saved.
// All stages of a checkpoint must save the same set (an imported initial checkpoint has params only).
struct StageState {
  const float* params = nullptr;      // fp32 master weights      -> HDF5 group "params"
  const float* exp_avg = nullptr;     // Adam first moment (m)    -> "exp_avg"
  const float* exp_avg_sq = nullptr;  // Adam second moment (v)   -> "exp_avg_sq"
};

// (bugprone-exception-escape: nlohmann::json's noexcept move runs an invariant check the analysis
// cannot prove never throws.)
struct CheckpointWriterOptions {  // NOLINT(bugprone-exception-escape)
  // Stages go to one HDF5 file until it would exceed this; a stage is never split across files.
  std::uint64_t max_shard_bytes = std::uint64_t{2} << 30;
  // After publishing, keep only the newest N step directories (0 = keep all). The new checkpoint and
  // the one `latest` names are never deleted, so there is always a good one left.
  int keep_last = 0;
  // config.json the model came from: its extra fields (token ids, ...) are kept in the manifest's
  // model_config and in exports.
  nlohmann::json hf_config;
  // The device plan the run executes (what `megatrain train` and `megatrain plan` print), written as
  // plan.json beside the manifest and published with it; not in the manifest, which stays the same
  // across plans of the same state. null = none.
  nlohmann::json plan;
  // Tokenizer files copied into the checkpoint's tokenizer/ folder (exports take them along).
  std::filesystem::path tokenizer_dir;
  // Datasets' page-aligned bytes with O_DIRECT where the file system takes it (dataset_data_writer.hpp);
  // false: everything through the page cache. The files are the same bytes either way.
  bool direct_io = true;
  // Several writers of one checkpoint (a job of several ranks, each writing the stages it owns into a
  // shared directory): `temp_name` is the temporary directory every writer of the checkpoint agrees on
  // (made if absent; "" = one of this writer's own, ".tmp-step-N-PID-K"), `shard_prefix` names this
  // writer's files apart from the others' ("shard-" gives "shard-00000.h5"), and `part` says this writer
  // publishes nothing: close_part() hands its stages and shards to the writer that does (add_part).
  std::string temp_name;
  std::string shard_prefix = "shard-";
  bool part = false;
};

class CheckpointWriter {
 public:
  CheckpointWriter(std::filesystem::path root, std::int64_t step, ModelConfig config,
                   CheckpointWriterOptions options = {});
  ~CheckpointWriter();  // unpublished: removes the temporary directory
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void write_stage(std::int64_t stage, const StageState& state);

  // Needs every stage written. run_state (the run config, LR-schedule state, data-loader cursor, RNG
  // state, ...: whatever the engine needs to resume) is stored verbatim as the manifest's "run".
  // Returns the published directory ROOT/step-N.
  std::filesystem::path finalize(const nlohmann::json& run_state = nlohmann::json::object());

  // A part writer (options.part): closes and fsyncs its shards and returns what the publishing writer's
  // manifest needs of them ({"states", "stages", "shards", "bytes"}); it writes nothing after.
  nlohmann::json close_part();
  // The publishing writer: takes another writer's close_part() into this checkpoint's manifest. Throws
  // CheckpointError on a stage written twice, a shard named twice or a different set of buffers.
  void add_part(const nlohmann::json& part);

  // Gives up: removes the temporary directory (a part writer: only its own files). Safe to call more
  // than once.
  void abort();

  std::int64_t step() const { return step_; }
  const std::filesystem::path& temp_dir() const { return temp_dir_; }
  std::uint64_t bytes_written() const;  // data bytes written so far
  std::uint64_t direct_bytes() const;   // of those, written with O_DIRECT (counted per closed shard)

 private:
  struct Shard;
  void open_shard_locked();
  void close_shard_locked();
  // Runs `body`; any error marks this writer failed and leaves as a CheckpointError.
  void failing_on_error(const std::function<void()>& body);

  std::filesystem::path root_;
  std::int64_t step_;
  ModelConfig config_;
  CheckpointWriterOptions options_;
  std::filesystem::path temp_dir_;
  mutable std::mutex mutex_;
  std::unique_ptr<Shard> shard_;                   // the open shard file
  std::vector<nlohmann::json> shards_;             // closed shards: file, bytes, checksum
  std::map<std::int64_t, nlohmann::json> stages_;  // written stages: shard, group, ...
  std::vector<std::string> state_names_;           // the set saved by the first stage
  std::uint64_t bytes_written_ = 0;
  std::uint64_t direct_bytes_ = 0;
  bool published_ = false;
  bool failed_ = false;
};

}  // namespace mt::ckpt
