#include "device/device_arena.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mt {

const char* slot_phase_name(SlotPhase p) {
  switch (p) {
    case SlotPhase::free:
      return "free";
    case SlotPhase::filling:
      return "filling";
    case SlotPhase::ready:
      return "ready";
  }
  return "?";
}

DeviceArena::DeviceArena(ArenaPlan plan)
    : plan_(std::move(plan)),
      buffer_(plan_.total_bytes, "the device arena", /*zero_fill=*/true),
      base_(buffer_.data()),
      claimed_(plan_.regions.size(), 0),
      slots_(static_cast<std::size_t>(plan_.weight_slots)) {
  if (plan_.total_bytes > plan_.budget_bytes)
    throw std::invalid_argument("device arena plan of " + std::to_string(plan_.total_bytes) +
                                " bytes exceeds its budget of " + std::to_string(plan_.budget_bytes) + " bytes");
}

DeviceArena::DeviceArena(ArenaPlan plan, std::byte* device_memory)
    : plan_(std::move(plan)),
      base_(device_memory),
      claimed_(plan_.regions.size(), 0),
      slots_(static_cast<std::size_t>(plan_.weight_slots)) {
  if (device_memory == nullptr) throw std::invalid_argument("device arena: no device memory given");
  if (plan_.total_bytes > plan_.budget_bytes)
    throw std::invalid_argument("device arena plan of " + std::to_string(plan_.total_bytes) +
                                " bytes exceeds its budget of " + std::to_string(plan_.budget_bytes) + " bytes");
}

std::size_t DeviceArena::region_position(ArenaRegionKind kind, int index) const {
  for (std::size_t i = 0; i < plan_.regions.size(); ++i)
    if (plan_.regions[i].kind == kind && plan_.regions[i].index == index) return i;
  throw std::out_of_range(std::string("device arena has no region ") + arena_region_kind_name(kind) + "[" +
                          std::to_string(index) + "]");
}

std::byte* DeviceArena::region_data(ArenaRegionKind kind, int index) {
  return base_ + plan_.regions[region_position(kind, index)].offset;
}

void DeviceArena::claim_locked(std::size_t position, std::size_t bytes) {
  const ArenaRegion& r = plan_.regions[position];
  if (bytes > r.bytes)
    throw std::length_error("device arena: claim of " + std::to_string(bytes) + " bytes exceeds " + r.name() + " (" +
                            std::to_string(r.bytes) + " bytes)");
  in_use_ = in_use_ - claimed_[position] + bytes;
  claimed_[position] = bytes;
  peak_ = std::max(peak_, in_use_);
}

void DeviceArena::claim(ArenaRegionKind kind, int index, std::size_t bytes) {
  const std::size_t position = region_position(kind, index);
  std::lock_guard<std::mutex> lock(mutex_);
  claim_locked(position, bytes);
}

void DeviceArena::release(ArenaRegionKind kind, int index) { claim(kind, index, 0); }

ArenaUsage DeviceArena::usage() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ArenaUsage{plan_.budget_bytes, plan_.total_bytes, in_use_, peak_};
}

void DeviceArena::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_ = in_use_;
}

std::optional<int> DeviceArena::begin_fill(std::int64_t stage, std::uint64_t version, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t k = 0; k < slots_.size(); ++k) {
    if (slots_[k].phase != SlotPhase::free) continue;
    claim_locked(region_position(ArenaRegionKind::weight_slot, static_cast<int>(k)), bytes);
    slots_[k] = WeightSlotState{SlotPhase::filling, stage, version, bytes};
    return static_cast<int>(k);
  }
  return std::nullopt;
}

void DeviceArena::begin_fill_slot(int slot, std::int64_t stage, std::uint64_t version, std::size_t bytes) {
  const std::size_t position = region_position(ArenaRegionKind::weight_slot, slot);
  std::lock_guard<std::mutex> lock(mutex_);
  auto& s = slots_[static_cast<std::size_t>(slot)];
  if (s.phase != SlotPhase::free)
    throw std::logic_error("weight_slot[" + std::to_string(slot) + "] is " + slot_phase_name(s.phase) + " (stage " +
                           std::to_string(s.stage) + "), not free");
  claim_locked(position, bytes);
  s = WeightSlotState{SlotPhase::filling, stage, version, bytes};
}

void DeviceArena::mark_ready(int slot) {
  region_position(ArenaRegionKind::weight_slot, slot);  // range check
  std::lock_guard<std::mutex> lock(mutex_);
  auto& s = slots_[static_cast<std::size_t>(slot)];
  if (s.phase != SlotPhase::filling)
    throw std::logic_error("weight_slot[" + std::to_string(slot) + "] is " + slot_phase_name(s.phase) +
                           ", not filling");
  s.phase = SlotPhase::ready;
}

void DeviceArena::map_slot(int slot, std::int64_t stage, std::uint64_t version, std::size_t bytes, const void* host) {
  begin_fill_slot(slot, stage, version, bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  auto& s = slots_[static_cast<std::size_t>(slot)];
  s.phase = SlotPhase::ready;
  s.mapped = host;
}

const void* DeviceArena::weights(int slot) {
  const void* own = weight_slot(slot);  // range check
  std::lock_guard<std::mutex> lock(mutex_);
  const void* mapped = slots_[static_cast<std::size_t>(slot)].mapped;
  return mapped != nullptr ? mapped : own;
}

void DeviceArena::release_slot(int slot) {
  const std::size_t position = region_position(ArenaRegionKind::weight_slot, slot);
  std::lock_guard<std::mutex> lock(mutex_);
  claim_locked(position, 0);
  slots_[static_cast<std::size_t>(slot)] = WeightSlotState{};
}

WeightSlotState DeviceArena::slot_state(int slot) const {
  region_position(ArenaRegionKind::weight_slot, slot);
  std::lock_guard<std::mutex> lock(mutex_);
  return slots_[static_cast<std::size_t>(slot)];
}

std::optional<int> DeviceArena::find_ready(std::int64_t stage, std::uint64_t min_version) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t k = 0; k < slots_.size(); ++k)
    if (slots_[k].phase == SlotPhase::ready && slots_[k].stage == stage && slots_[k].version >= min_version)
      return static_cast<int>(k);
  return std::nullopt;
}

int DeviceArena::free_slot_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(
      std::count_if(slots_.begin(), slots_.end(), [](const auto& s) { return s.phase == SlotPhase::free; }));
}

}  // namespace mt
