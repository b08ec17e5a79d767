// Device memory accounting: one allocation of exactly ArenaPlan::total_bytes (<= the budget), made
// once at start-up (by the backend, or by the arena itself in tests) and carved into the plan's regions. Nothing is
// allocated afterwards, so exceeding the budget is impossible by construction.
//
// Use accounting: a user claims the bytes it actually fills in a region (a weight slot holding a
// smaller stage claims less than the slot's capacity) and releases them when done; the arena keeps the
// bytes in use and their high-water mark (peak), which is what the memory acceptance tests report.
//
// Weight slot states (free -> filling(stage, version) -> ready(stage, version) -> free) live here so
// the prefetcher, the copy engine callback and compute agree on them. Every member is thread-safe.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "device/arena_plan.hpp"
#include "storage/host/aligned_buffer.hpp"

namespace mt {

enum class SlotPhase { free, filling, ready };
const char* slot_phase_name(SlotPhase p);

struct WeightSlotState {
  SlotPhase phase = SlotPhase::free;
  std::int64_t stage = -1;       // valid unless free
  std::uint64_t version = 0;     // the tile version being / been copied
  std::size_t bytes = 0;         // bytes claimed (the stage's streamed size)
  const void* mapped = nullptr;  // map_slot: the host tile compute reads instead of the slot's memory
};

struct ArenaUsage {
  std::size_t budget_bytes = 0;
  std::size_t capacity_bytes = 0;  // plan total (allocated)
  std::size_t in_use_bytes = 0;
  std::size_t peak_bytes = 0;  // high-water mark of in_use_bytes since start / reset_peak()
};

class DeviceArena {
 public:
  // Allocates and zero-fills plan.total_bytes. Throws std::runtime_error (naming the size) on failure.
  explicit DeviceArena(ArenaPlan plan);
  // Carves memory a backend allocated (Backend::allocate_device(plan.total_bytes), zero-filled); the
  // arena does not own it and allocates nothing.
  DeviceArena(ArenaPlan plan, std::byte* device_memory);
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  const ArenaPlan& plan() const { return plan_; }
  std::byte* base() { return base_; }

  std::byte* region_data(ArenaRegionKind kind, int index = 0);  // throws std::out_of_range
  float* weight_slot(int slot) { return reinterpret_cast<float*>(region_data(ArenaRegionKind::weight_slot, slot)); }
  float* grad_slot(int slot) { return reinterpret_cast<float*>(region_data(ArenaRegionKind::grad_slot, slot)); }
  std::byte* workspace() { return region_data(ArenaRegionKind::workspace); }
  std::byte* activations() { return region_data(ArenaRegionKind::activations); }
  int weight_slot_count() const { return plan_.weight_slots; }

  // --- use accounting ------------------------------------------------------------------------------
  // Sets the bytes in use of one region (replacing its previous claim). Throws std::length_error naming
  // the region when bytes exceed its capacity.
  void claim(ArenaRegionKind kind, int index, std::size_t bytes);
  void release(ArenaRegionKind kind, int index);  // claim(kind, index, 0)
  ArenaUsage usage() const;
  std::size_t peak_bytes() const { return usage().peak_bytes; }
  void reset_peak();  // peak := bytes in use now

  // --- weight slots --------------------------------------------------------------------------------
  // Picks a free slot (lowest index), marks it filling(stage, version) and claims `bytes` of it;
  // nullopt when every slot is busy.
  std::optional<int> begin_fill(std::int64_t stage, std::uint64_t version, std::size_t bytes);
  // The same for a chosen slot; throws std::logic_error when it is not free.
  void begin_fill_slot(int slot, std::int64_t stage, std::uint64_t version, std::size_t bytes);
  void mark_ready(int slot);  // filling -> ready, else logic_error
  // A backend that shares host memory (Backend::shares_host_memory): free -> ready(stage, version)
  // at once, reading `host` (the tile's stream source) instead of the slot's memory. It claims `bytes`
  // as a copy would, so the arena's figures do not depend on the backend. Logic_error when not free.
  void map_slot(int slot, std::int64_t stage, std::uint64_t version, std::size_t bytes, const void* host);
  // What compute reads for a ready slot: the mapped host tile, else the slot's own memory.
  const void* weights(int slot);
  void release_slot(int slot);  // any -> free, releases its bytes
  WeightSlotState slot_state(int slot) const;
  // A ready slot holding `stage` at version >= min_version, if any.
  std::optional<int> find_ready(std::int64_t stage, std::uint64_t min_version = 0) const;
  int free_slot_count() const;

 private:
  std::size_t region_position(ArenaRegionKind kind, int index) const;  // index into plan_.regions
  void claim_locked(std::size_t position, std::size_t bytes);

  ArenaPlan plan_;
  AlignedBuffer buffer_;  // owned memory (the one-argument constructor), else empty
  std::byte* base_ = nullptr;
  mutable std::mutex mutex_;
  std::vector<std::size_t> claimed_;  // per plan_.regions entry
  std::vector<WeightSlotState> slots_;
  std::size_t in_use_ = 0;
  std::size_t peak_ = 0;
};

}  // namespace mt
