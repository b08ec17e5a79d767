// The moments outside the tiles: encoded (moment_codec.hpp) in RAM, or in one file per stage on the
// NVMe tier (stage_file.hpp), used through a bounded set of staging slots, each holding one stage's
// fp32 m and v plus its encoded form.
//
// The optimizer visits the stages in a known cyclic order (0..S-1 every step with clipping, S-1..0
// without; with the host state sharded, this rank's own stages in that order), given as
// StagedMomentStoreOptions::visit_order, so after it acquires stage s the store starts loading the
// next `staging_stages - 2` stages in that order into free slots (read ahead),
// and a released, modified stage is encoded and written by a worker while the optimizer updates the
// next one (write behind). A slot that still holds a stage serves it again without I/O (small models
// whose stages all fit the slots do no reads at all). RAM use is bounded: slots x (largest stage's
// m and v + its encoding), whatever the depth.
//
// Failures: a load that fails (damage, truncation, I/O error) fails the acquire that wants it, naming
// the file and block; a write that fails keeps the stage's data in its slot (never evicted, so nothing
// is lost) and fails every later acquire and flush with the message (sticky): the engine stops and
// the last checkpoint stays the consistent state.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "storage/host/aligned_buffer.hpp"
#include "storage/host/moment_store.hpp"
#include "storage/offload/io_pool.hpp"
#include "storage/offload/moment_codec.hpp"
#include "storage/offload/stage_file.hpp"

namespace mt::offload {

struct StagedMomentStoreOptions {
  MomentCodec codec = MomentCodec::none;
  std::string dir;         // "" = encoded in RAM; else the NVMe tier's directory (created if needed)
  int staging_stages = 4;  // slots (>= 3: one in use, one writing, one read ahead)
  int io_threads = 4;      // chunks in flight per transfer (the queue depth)
  std::size_t io_chunk_bytes = std::size_t{1} << 20;
  bool direct_io = true;  // O_DIRECT
  // Also hold every stage's fp32 masters (train.offload_params): a slot is then master | m | v, and the
  // stage's encoding is the master's fp32 bytes followed by the codec's m and v (masters are never
  // compressed lossily).
  bool with_masters = false;
  // The stages this store holds, in the order the optimizer visits them each step (the order repeats
  // every step): reads run ahead in it. Empty: every stage, in stage order. With the host state sharded
  // (cluster.shard_state) only this rank's own stages: no other stage has a slot, a file or an encoding
  // here, and acquiring one throws std::out_of_range.
  std::vector<std::int64_t> visit_order;
  // A job of several ranks: this rank, named in the files' directory (megatrain-moments-rank<R>-<pid>-<n>),
  // so ranks sharing a host or a file system never share files. -1: a process alone.
  int rank = -1;
};

// Counters since construction (benchmarks, reports).
struct MomentStoreStats {
  std::uint64_t loads = 0, stores = 0;  // stage transfers (file or RAM)
  std::uint64_t hits = 0;               // acquires served by a slot without a load
  std::uint64_t file_bytes_read = 0, file_bytes_written = 0;
  std::uint64_t raw_bytes = 0, encoded_bytes = 0;  // of the stores: fp32 bytes and their encoding
  double acquire_wait_s = 0.0;                     // time acquire blocked (the optimizer waiting on the tier)
  double load_s = 0.0, store_s = 0.0;              // worker time: I/O + (de)coding
  double encode_s = 0.0, decode_s = 0.0;           // of which (de)coding
};

class StagedMomentStore final : public MomentStore {
 public:
  // stage_floats[s]: the floats of stage s's m (and of its v).
  StagedMomentStore(std::vector<std::size_t> stage_floats, const StagedMomentStoreOptions& options);
  ~StagedMomentStore() override;

  MomentView acquire(std::int64_t stage) override;
  MomentView acquire_to_overwrite(std::int64_t stage) override;
  MomentView acquire_to_read(std::int64_t stage) override;
  void release(std::int64_t stage, bool modified) noexcept override;
  void flush() override;
  void reset(std::int64_t stage) override;
  std::size_t ram_bytes() const override;
  std::string describe() const override;
  bool holds_masters() const override { return o_.with_masters; }
  bool holds(std::int64_t stage) const override;
  std::size_t disk_bytes() const override;
  std::string failure() const override;
  // RAM and NVMe bytes a store with these options would hold, before it exists (the planner, `train`'s
  // fit check): ram equals ram_bytes() of a fresh store (its staging slots); ram_encodings bounds what a
  // store without a directory adds as every stage's encoding is kept in RAM (lossless encodings are
  // smaller); disk equals disk_bytes() once every stage was written once at its largest encoding.
  struct Footprint {
    std::size_t ram = 0, ram_encodings = 0, disk = 0;
  };
  static Footprint footprint(const std::vector<std::size_t>& stage_floats, const StagedMomentStoreOptions& options);

  MomentStoreStats stats() const;
  // The file of a stage (tests: damage); "" in RAM.
  std::string file_path(std::int64_t stage) const;
  // The directory this store's files live in (under options.dir); "" in RAM.
  const std::string& files_dir() const { return files_dir_; }
  // Drops every slot that is not in use (tests: make the next acquire read the file).
  void evict_all();
  // The stages in a slot now, being loaded, held, leased or written (tests: what was read ahead).
  std::vector<std::int64_t> staged_stages() const;

 private:
  enum class SlotState { empty, loading, ready, leased, writing };
  // Who acquires: the optimizer (the read-ahead follows it), a caller overwriting every value, or a
  // reader beside the optimizer (the read-ahead stays with the optimizer).
  enum class Acquirer { optimizer, overwrite, reader };
  // Slots, files and counters are indexed by the stage's place in the visit order (its `index`); the
  // stage numbers of the model appear only at the interface, in file names and in messages.
  struct Slot {
    std::int64_t stage = -1;  // the index of the stage it holds
    SlotState state = SlotState::empty;
    int leases = 0;
    bool dirty = false;     // a lease modified it: write when the last lease ends
    bool retained = false;  // its write failed: the only copy, never evicted
    std::uint64_t last_use = 0;
    std::string error;         // a failed load, for the acquire waiting on it
    AlignedBuffer fp32;        // m | v (uncompressed in files: none, the payload of `encoded` is m | v)
    float* moments = nullptr;  // [master,] m, then v: each the stage's float count
    AlignedBuffer encoded;     // [file header region] encoding
  };
  struct Job {
    Slot* slot;
    bool store;
  };

  MomentView acquire_impl(std::int64_t stage, Acquirer who);
  std::int64_t index_of(std::int64_t stage) const;  // throws std::out_of_range for a stage not held here
  Slot* find(std::int64_t index);
  Slot* pick_victim(bool for_prefetch);
  bool in_window(std::int64_t index) const;
  void start_load(Slot* s, std::int64_t stage);
  void prefetch();
  void worker();
  void load(Slot& s, std::int64_t stage, std::uint64_t generation, bool fresh);  // no lock held
  std::uint64_t store(Slot& s, std::int64_t stage, std::uint64_t generation);    // no lock held; bytes written
  std::size_t payload_offset() const { return files_.empty() ? 0 : header_bytes_; }
  bool raw_in_place() const { return o_.codec == MomentCodec::none && !files_.empty(); }
  std::size_t arrays() const { return o_.with_masters ? 3 : 2; }  // fp32 arrays per stage
  std::size_t master_bytes(std::size_t n) const { return o_.with_masters ? n * sizeof(float) : 0; }

  std::vector<std::int64_t> stages_;  // index -> the model's stage (the visit order)
  std::vector<std::int64_t> index_;   // the model's stage -> index, -1 when not held here
  std::vector<std::size_t> floats_;   // per index
  std::size_t max_floats_ = 0;
  StagedMomentStoreOptions o_;
  std::string files_dir_;
  std::vector<std::unique_ptr<StageFile>> files_;  // on the NVMe tier
  std::vector<std::vector<std::byte>> blobs_;      // in RAM: each stage's encoding
  std::size_t header_bytes_ = 0;
  std::unique_ptr<IoPool> io_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<char> fresh_;                // per stage: moments are zero, nothing stored
  std::vector<std::uint64_t> generation_;  // per stage: writes made
  std::int64_t position_ = -1;             // the index the optimizer acquired last (read ahead from there)
  bool read_ahead_ = true;                 // false while the caller overwrites (no use reading ahead)
  std::uint64_t clock_ = 0;
  std::string failed_;      // sticky write failure
  std::string load_error_;  // the last load that failed (not sticky: a retry may succeed)
  std::deque<Job> jobs_;
  bool stop_ = false;
  MomentStoreStats stats_;
  std::vector<std::thread> workers_;
};

}  // namespace mt::offload
