#include "actors/checkpoint_gate.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <optional>

namespace mt::actors {

PageAlignedFloats page_aligned_floats(std::size_t n) {
  constexpr std::size_t kPage = 4096;
  const std::size_t bytes = (n * sizeof(float) + kPage - 1) / kPage * kPage;  // aligned_alloc wants a multiple
  auto* p = static_cast<float*>(std::aligned_alloc(kPage, std::max(bytes, kPage)));
  if (!p) throw std::bad_alloc();
  return PageAlignedFloats(p);
}

void copy_stage_state(const StateLease& state, StageSnapshot& snap) {
  const std::size_t bytes = snap.floats * sizeof(float);
  std::memcpy(snap.master.get(), state.master(), bytes);
  if (snap.m) std::memcpy(snap.m.get(), state.m(), bytes);
  if (snap.v) std::memcpy(snap.v.get(), state.v(), bytes);
}

void CheckpointGate::set_writer_urgency(std::function<void(bool)> urgent) {
  std::lock_guard<std::mutex> lock(mutex_);  // the optimizer may be in before_update, calling it
  writer_urgency_ = std::move(urgent);
}

bool CheckpointGate::open(std::int64_t v, std::int64_t stages) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (open_.count(v)) return false;
  open_[v].stages.assign(static_cast<std::size_t>(stages), StageState::pending);
  return true;
}

void CheckpointGate::set_data_cursor(std::int64_t v, nlohmann::json cursor) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = open_.find(v);
  if (it != open_.end()) it->second.data_cursor = std::move(cursor);
}

nlohmann::json CheckpointGate::data_cursor(std::int64_t v) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = open_.find(v);
  return it != open_.end() ? it->second.data_cursor : nlohmann::json(nullptr);
}

CheckpointGate::StageState* CheckpointGate::find(std::int64_t v, std::int64_t stage) {
  auto it = open_.find(v);
  if (it == open_.end() || stage < 0 || stage >= static_cast<std::int64_t>(it->second.stages.size())) return nullptr;
  return &it->second.stages[static_cast<std::size_t>(stage)];
}

std::uint64_t CheckpointGate::bytes_of(const StageSnapshot& s) {
  return static_cast<std::uint64_t>(s.floats) * sizeof(float) * (s.m ? 3 : 1);
}

void CheckpointGate::recycle(std::unique_ptr<StageSnapshot> s) {
  held_bytes_ -= bytes_of(*s);
  // Kept for the next checkpoint (its pages are already faulted in) while copies in use plus kept
  // ones stay within the budget.
  std::uint64_t kept = 0;
  for (const auto& f : free_) kept += bytes_of(*f);
  if (held_bytes_ + kept + bytes_of(*s) <= budget_bytes_) free_.push_back(std::move(s));
}

void CheckpointGate::close(std::int64_t v) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = open_.find(v);
    if (it != open_.end()) {
      for (auto& [stage, snap] : it->second.snapshots) recycle(std::move(snap));
      open_.erase(it);
    }
  }
  cv_.notify_all();
}

void CheckpointGate::release_all() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
  }
  cv_.notify_all();
}

const StageSnapshot* CheckpointGate::begin_write(std::int64_t v, std::int64_t stage) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    StageState* st = find(v, stage);
    if (!st) return nullptr;
    if (*st == StageState::copying && !released_) {
      cv_.wait(lock);
      continue;
    }
    if (*st == StageState::copied) return open_[v].snapshots[stage].get();
    if (*st == StageState::pending) *st = StageState::writing;
    return nullptr;
  }
}

void CheckpointGate::mark_written(std::int64_t v, std::int64_t stage) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (StageState* st = find(v, stage)) {
      *st = StageState::written;
      auto& snaps = open_[v].snapshots;
      auto it = snaps.find(stage);
      if (it != snaps.end()) {
        recycle(std::move(it->second));
        snaps.erase(it);
      }
    }
  }
  cv_.notify_all();
}

bool CheckpointGate::has_snapshot(std::int64_t v, std::int64_t stage) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = open_.find(v);
  if (it == open_.end() || stage < 0 || stage >= static_cast<std::int64_t>(it->second.stages.size())) return false;
  const StageState s = it->second.stages[static_cast<std::size_t>(stage)];
  return s == StageState::copying || s == StageState::copied;
}

bool CheckpointGate::copy_aside(std::unique_lock<std::mutex>& lock, std::int64_t v, std::int64_t stage,
                                std::size_t floats, int states, const std::function<void(StageSnapshot&)>& copy) {
  const std::uint64_t need = static_cast<std::uint64_t>(floats) * sizeof(float) * static_cast<std::uint64_t>(states);
  if (held_bytes_ + need > budget_bytes_) return false;
  *find(v, stage) = StageState::copying;
  std::unique_ptr<StageSnapshot> snap;
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if ((*it)->floats == floats && ((*it)->m != nullptr) == (states == 3)) {
      snap = std::move(*it);
      free_.erase(it);
      break;
    }
  if (!snap) {
    snap = std::make_unique<StageSnapshot>();
    snap->floats = floats;
    snap->master = page_aligned_floats(floats);
    if (states == 3) {
      snap->m = page_aligned_floats(floats);
      snap->v = page_aligned_floats(floats);
    }
  }
  held_bytes_ += need;
  lock.unlock();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    copy(*snap);
  } catch (...) {
    lock.lock();
    if (StageState* again = find(v, stage)) *again = StageState::pending;
    recycle(std::move(snap));
    cv_.notify_all();
    throw;
  }
  lock.lock();
  copy_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  StageState* again = find(v, stage);
  if (again && *again == StageState::copying) {
    *again = StageState::copied;
    open_[v].snapshots[stage] = std::move(snap);
    copied_bytes_ += need;
  } else {
    recycle(std::move(snap));  // the checkpoint was given up meanwhile
  }
  cv_.notify_all();
  return true;
}

double CheckpointGate::before_update(std::int64_t v, std::int64_t stage, std::size_t floats, int states,
                                     const std::function<void(StageSnapshot&)>& copy) {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mutex_);
  std::optional<Clock::time_point> t0;
  for (;;) {
    StageState* st = find(v, stage);
    if (released_ || !st || *st == StageState::written || *st == StageState::copied) break;
    if (*st == StageState::pending && copy_aside(lock, v, stage, floats, states, copy)) break;
    if (!t0) {
      t0 = Clock::now();
      if (writer_urgency_) writer_urgency_(true);
    }
    cv_.wait(lock);  // being copied or written, or the budget is spent: until copied, written or freed
  }
  if (!t0) return 0.0;
  if (writer_urgency_) writer_urgency_(false);
  const double w = std::chrono::duration<double>(Clock::now() - *t0).count();
  waited_s_ += w;
  return w;
}

double CheckpointGate::waited_s() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waited_s_;
}

std::uint64_t CheckpointGate::copied_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return copied_bytes_;
}

double CheckpointGate::copy_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return copy_s_;
}

}  // namespace mt::actors
