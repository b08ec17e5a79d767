// The version gate between the optimizer and the checkpointer. A checkpoint of tile version v is
// written straight from the tiles (no copy of the model); stage s's tile holds version v from the
// optimizer's update of step v-1 until its update of step v, about one step later. The optimizer opens
// the gate for v before its first update towards v; before updating stage s past v it calls
// before_update, which returns at once when stage s of v is written (or the checkpoint given up), and
// otherwise, when the stage is not being written yet and the copy budget allows, copies the stage's
// state (masters, m, v) aside for the checkpointer to write from (copy on write), or else waits until
// the checkpointer marked it written. So the checkpointer has a whole step per stage, and more when a
// slow disk would make the optimizer wait: a copy of a stage costs a few milliseconds of memory
// bandwidth where waiting for the disk costs the rest of its write (tools/bench/run checkpoint).
// The budget bounds the copies' host RAM (train.save_snapshot_mib; 0 = always wait).
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace mt::actors {

// A stage's state copied aside before the optimizer updated it: `floats` per state.
struct StageSnapshot {
  std::size_t floats = 0;
  std::unique_ptr<float[]> master, m, v;  // m, v null when the checkpoint saves no moments
};

class CheckpointGate {
 public:
  void set_snapshot_budget(std::uint64_t bytes) { budget_bytes_ = bytes; }

  // Registers checkpoint v (every stage pending). False when it is already registered.
  bool open(std::int64_t v, std::int64_t stages);
  bool is_open(std::int64_t v) const;
  // Checkpoint v is published or given up: nothing waits for it any more; its copies are freed.
  void close(std::int64_t v);
  // Shutdown: releases every waiter, now and later.
  void release_all();

  // The checkpointer, before writing stage `stage` of checkpoint v: waits while the optimizer is
  // copying it; returns the copy to write from, or nullptr: write from the tile (the optimizer now
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

 private:
  enum class StageState : char { pending, writing, copying, copied, written };
  struct Checkpoint {
    std::vector<StageState> stages;
    std::map<std::int64_t, std::unique_ptr<StageSnapshot>> snapshots;
  };
  StageState* find(std::int64_t v, std::int64_t stage);  // nullptr: no such checkpoint open
  void recycle(std::unique_ptr<StageSnapshot> s);        // lock held
  static std::uint64_t bytes_of(const StageSnapshot& s);

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::int64_t, Checkpoint> open_;
  std::vector<std::unique_ptr<StageSnapshot>> free_;  // copies kept for the next checkpoint
  std::uint64_t budget_bytes_ = 0;
  std::uint64_t held_bytes_ = 0;  // copies in use and being made
  std::uint64_t copied_bytes_ = 0;
  bool released_ = false;
  double waited_s_ = 0.0;
};

}  // namespace mt::actors
