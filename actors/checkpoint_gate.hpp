// The version gate between the optimizer and the checkpointer. A checkpoint of tile version v is
// written straight from the tiles; stage s's tile holds version v from the optimizer's update of step
// v-1 until its update of step v, about one step later. The optimizer opens the gate for v before its
// first update towards v; before updating stage s past v it calls before_update, which returns at once
// when stage s of v is written (or the checkpoint given up); when the checkpointer has not started the
// stage and the copies in use fit the budget (train.save_snapshot_mib), it copies the stage's masters,
// m and v aside for the checkpointer to write from (copy on write: milliseconds of memory bandwidth
// instead of the rest of a disk write); otherwise (the stage being written, or past the budget) it
// waits until the checkpointer marked it written. Host RAM grows by at most the budget.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <nlohmann/json.hpp>

#include "storage/host/host_model.hpp"

namespace mt::actors {

// A stage's state copied aside before the optimizer updated it: `floats` per state. Page-aligned: the
// checkpoint writer writes aligned memory straight to disk (O_DIRECT), and a copy from malloc (16 bytes
// past a page) went through the page cache, a second copy of every byte on the writer's CPU.
struct FreeFloats {
  void operator()(float* p) const { std::free(p); }
};
using PageAlignedFloats = std::unique_ptr<float[], FreeFloats>;
PageAlignedFloats page_aligned_floats(std::size_t n);  // throws std::bad_alloc
struct StageSnapshot {
  std::size_t floats = 0;
  PageAlignedFloats master, m, v;  // m, v null when the checkpoint saves no moments
};

// Copies a stage's masters, m and v (through a lease on them) into a snapshot of the stage's size.
void copy_stage_state(const StateLease& state, StageSnapshot& snap);

class CheckpointGate {
 public:
  void set_snapshot_budget(std::uint64_t bytes) { budget_bytes_ = bytes; }
  // The writer runs at a lower priority than training (the checkpointer: nice + 10); while the optimizer
  // waits for it, it is on the critical path: `urgent(true)` when such a wait begins, `urgent(false)`
  // when it ends (priority inheritance by hand). Called under the gate's lock; an empty function (the
  // writer's thread is gone) stops the calls.
  void set_writer_urgency(std::function<void(bool)> urgent);

  // Registers checkpoint v (every stage pending). False when it is already registered.
  bool open(std::int64_t v, std::int64_t stages);
  // The data loader's cursor before checkpoint v's first batch, taken when v is decided: the loader
  // keeps a bounded history, and the checkpoint may finish many steps later (copies let training run
  // on). Null when none was set.
  void set_data_cursor(std::int64_t v, nlohmann::json cursor);
  nlohmann::json data_cursor(std::int64_t v) const;
  // Checkpoint v is published or given up: nothing waits for it any more; its copies are freed.
  void close(std::int64_t v);
  // Shutdown: releases every waiter, now and later.
  void release_all();

  // The checkpointer, before writing stage `stage` of checkpoint v: waits while the optimizer is
  // copying it; returns the copy to write from, or nullptr: write from the tile (the optimizer then
  // waits for mark_written before updating it).
  const StageSnapshot* begin_write(std::int64_t v, std::int64_t stage);
  // Stage `stage` of v is on disk: the optimizer may update it; its copy (if any) is freed.
  void mark_written(std::int64_t v, std::int64_t stage);
  // Has the optimizer copied stage `stage` of v aside (so the tile may be past v)?
  bool has_snapshot(std::int64_t v, std::int64_t stage) const;

  // The optimizer, before updating `stage` from version v. `floats`: the stage's size; `copy` fills a
  // snapshot (called without the lock held, at most once). Returns the seconds waited (a copy is not
  // a wait; copied_bytes() counts it).
  double before_update(std::int64_t v, std::int64_t stage, std::size_t floats, int states,
                       const std::function<void(StageSnapshot&)>& copy);

  double waited_s() const;
  std::uint64_t copied_bytes() const;
  double copy_seconds() const;  // the copiers' time copying stages aside (wall time, kept copies or not)

 private:
  enum class StageState : char { pending, writing, copying, copied, written };
  struct Checkpoint {
    std::vector<StageState> stages;
    std::map<std::int64_t, std::unique_ptr<StageSnapshot>> snapshots;
    nlohmann::json data_cursor;
  };
  StageState* find(std::int64_t v, std::int64_t stage);  // nullptr: no such checkpoint open
  // Lock held, the stage pending: copies it aside when the budget allows (the lock released while
  // `copy` runs). False: over the budget, nothing done.
  bool copy_aside(std::unique_lock<std::mutex>& lock, std::int64_t v, std::int64_t stage, std::size_t floats,
                  int states, const std::function<void(StageSnapshot&)>& copy);
  void recycle(std::unique_ptr<StageSnapshot> s);  // lock held
  static std::uint64_t bytes_of(const StageSnapshot& s);

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::int64_t, Checkpoint> open_;
  std::vector<std::unique_ptr<StageSnapshot>> free_;  // copies kept for the next checkpoint
  std::uint64_t budget_bytes_ = 0;
  std::uint64_t held_bytes_ = 0;  // copies in use and being made
  std::uint64_t copied_bytes_ = 0;
  double copy_s_ = 0.0;
  bool released_ = false;
  double waited_s_ = 0.0;
  std::function<void(bool)> writer_urgency_;
};

}  // namespace mt::actors
