// Where the AdamW moments (m, v) of each stage live, behind one interface, so the optimizer, the
// checkpointer and checkpoint loading do not care whether they sit in the host tile (the default: no
// copies), compressed in RAM, or in files on an NVMe tier (storage/offload).
//
// A stage's moments are used through a lease: acquire(stage) makes m and v (each stage_floats long,
// fp32) available until release; a lease marked modified is written back. Stores that stage through
// bounded buffers read ahead in the visit order and write behind.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace mt {

// An I/O or integrity failure of a moment store (names the file and what went wrong).
class MomentStoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct MomentView {
  float* m = nullptr;
  float* v = nullptr;
  float* master = nullptr;  // the stage's fp32 masters when the store holds them (holds_masters()), else null
};

class MomentStore {
 public:
  virtual ~MomentStore() = default;
  // The stage's current moments, valid until release(stage). Blocks while they are read; throws
  // MomentStoreError when they cannot be (damage, I/O error) or after a failed write-behind.
  virtual MomentView acquire(std::int64_t stage) = 0;
  // As acquire, for a caller that overwrites every value (loading a checkpoint, benchmarks): the
  // current moments need not be read, so the contents are unspecified. Release it modified.
  virtual MomentView acquire_to_overwrite(std::int64_t stage) { return acquire(stage); }
  // As acquire, for a reader beside the optimizer's cycle (the checkpointer, an export): a store that
  // reads ahead in the optimizer's order keeps reading ahead from where the optimizer is, not from here.
  virtual MomentView acquire_to_read(std::int64_t stage) { return acquire(stage); }
  // Ends a lease; `modified`: m / v were changed and must be kept (written back). Never throws: a
  // failed write-behind keeps the data in RAM and is reported by the next acquire or flush.
  virtual void release(std::int64_t stage, bool modified) noexcept = 0;
  // Waits for every write-behind; throws the first failure.
  virtual void flush() = 0;
  // The stage's moments are zero (fresh run, params-only import): no I/O until the next update. A
  // store that holds the masters zeroes them too: set them through HostModel::set_masters instead.
  virtual void reset(std::int64_t stage) = 0;
  // Host bytes this store holds (0 for the tiles: counted with them), for reports.
  virtual std::size_t ram_bytes() const = 0;
  // One line: "in the host tiles", "int8 in RAM (4 staging stages)", "files in DIR (...)".
  virtual std::string describe() const = 0;
  // True when the store also holds every stage's fp32 masters (train.offload_params): a lease then
  // gives them too (MomentView::master), and the host tiles hold none.
  virtual bool holds_masters() const { return false; }
  // "" or the store's last failure (a write that failed, else a load that failed): file, offset, errno.
  virtual std::string failure() const { return ""; }
  // Bytes of the files this store keeps on the NVMe tier (0 in RAM), for reports and the planner.
  virtual std::size_t disk_bytes() const { return 0; }
  // True when this store holds stage s's moments; false for a stage another rank owns
  // (cluster.shard_state), which has nothing here.
  virtual bool holds(std::int64_t /*stage*/) const { return true; }
};

// A lease as a scope: released (unmodified unless mark_modified()) when it ends.
class MomentLease {
 public:
  // update: the optimizer's (acquire); overwrite: every value replaced (acquire_to_overwrite); read: a
  // reader beside the optimizer's cycle (acquire_to_read).
  enum class Use { update, overwrite, read };
  MomentLease(MomentStore& store, std::int64_t stage, Use use = Use::update)
      : store_(&store), stage_(stage), view_(acquire(store, stage, use)), modified_(use == Use::overwrite) {}
  ~MomentLease() {
    if (store_) store_->release(stage_, modified_);
  }
  MomentLease(const MomentLease&) = delete;
  MomentLease& operator=(const MomentLease&) = delete;
  float* m() const { return view_.m; }
  float* v() const { return view_.v; }
  float* master() const { return view_.master; }  // null unless the store holds the masters
  void mark_modified() { modified_ = true; }

 private:
  static MomentView acquire(MomentStore& store, std::int64_t stage, Use use) {
    if (use == Use::overwrite) return store.acquire_to_overwrite(stage);
    return use == Use::read ? store.acquire_to_read(stage) : store.acquire(stage);
  }

  MomentStore* store_;
  std::int64_t stage_;
  MomentView view_;
  bool modified_ = false;
};

}  // namespace mt
