#include "storage/offload/staged_moment_store.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace mt::offload {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
constexpr int kWorkers = 2;  // one load and one store in flight at once

// A directory of its own under `dir` for this store's files: two stores (two runs, a test's two
// engines, two ranks of a job on one host or on one shared file system) never share files, and the
// destructor removes exactly what it made.
std::string make_files_dir(const std::string& dir, int rank) {
  static std::atomic<int> counter{0};
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw MomentStoreError("train.offload_dir " + dir + ": cannot create: " + ec.message());
  const std::string of_rank = rank >= 0 ? "rank" + std::to_string(rank) + "-" : "";
  const fs::path p =
      fs::path(dir) / ("megatrain-moments-" + of_rank + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::create_directory(p, ec);
  if (ec) throw MomentStoreError("train.offload_dir " + dir + ": cannot create " + p.string() + ": " + ec.message());
  return p.string();
}

// The stages a store holds, in its visit order: `visit_order`, or every stage in stage order.
std::vector<std::int64_t> held_stages(std::size_t stages, const std::vector<std::int64_t>& visit_order) {
  std::vector<std::int64_t> held = visit_order;
  if (held.empty())
    for (std::size_t s = 0; s < stages; ++s) held.push_back(static_cast<std::int64_t>(s));
  std::vector<char> seen(stages, 0);
  for (std::int64_t s : held) {
    if (s < 0 || static_cast<std::size_t>(s) >= stages || seen[static_cast<std::size_t>(s)])
      throw std::invalid_argument("StagedMomentStore: visit order names stage " + std::to_string(s) +
                                  " twice or outside the model's " + std::to_string(stages) + " stages");
    seen[static_cast<std::size_t>(s)] = 1;
  }
  return held;
}

}  // namespace

StagedMomentStore::StagedMomentStore(std::vector<std::size_t> stage_floats, const StagedMomentStoreOptions& options)
    : stages_(held_stages(stage_floats.size(), options.visit_order)), o_(options) {
  if (stages_.empty()) throw std::invalid_argument("StagedMomentStore: no stages");
  if (o_.staging_stages < 3)
    throw std::invalid_argument(
        "offload staging: at least 3 stages (one in use, one "
        "being written, one read ahead)");
  index_.assign(stage_floats.size(), -1);
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    index_[static_cast<std::size_t>(stages_[i])] = static_cast<std::int64_t>(i);
    floats_.push_back(stage_floats[static_cast<std::size_t>(stages_[i])]);
  }
  max_floats_ = *std::max_element(floats_.begin(), floats_.end());
  const std::size_t S = floats_.size();
  fresh_.assign(S, 1);
  generation_.assign(S, 0);
  std::size_t encoded_bytes = round_up(encoded_bound(o_.codec, max_floats_) + master_bytes(max_floats_), kDirectAlign);
  if (!o_.dir.empty()) {
    files_dir_ = make_files_dir(o_.dir, o_.rank);
    io_ = std::make_unique<IoPool>(o_.io_threads, o_.io_chunk_bytes);
    char name[48];
    for (std::size_t i = 0; i < S; ++i) {  // named by the model's stage
      const auto stage = static_cast<long long>(stages_[i]);
      std::snprintf(name, sizeof(name), o_.with_masters ? "stage-%05lld.state" : "stage-%05lld.moments", stage);
      files_.push_back(std::make_unique<StageFile>((fs::path(files_dir_) / name).string(), stages_[i],
                                                   encoded_bound(o_.codec, floats_[i]) + master_bytes(floats_[i]),
                                                   o_.direct_io));
      header_bytes_ = std::max(header_bytes_, files_.back()->header_bytes());
    }
    encoded_bytes += header_bytes_;
  } else {
    blobs_.resize(S);
  }
  for (int i = 0; i < o_.staging_stages; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->encoded = AlignedBuffer(encoded_bytes, "moment staging slot (encoded)", false, kDirectAlign);
    if (raw_in_place()) {  // fp32 in files: the file's payload is [master |] m | v itself, no copy either way
      slot->moments = reinterpret_cast<float*>(slot->encoded.data() + header_bytes_);
    } else {
      slot->fp32 = AlignedBuffer(arrays() * max_floats_ * sizeof(float), "moment staging slot", false);
      slot->moments = reinterpret_cast<float*>(slot->fp32.data());
    }
    slots_.push_back(std::move(slot));
  }
  for (int i = 0; i < kWorkers; ++i) workers_.emplace_back([this] { worker(); });
}

StagedMomentStore::~StagedMomentStore() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] {
      return jobs_.empty() && std::none_of(slots_.begin(), slots_.end(), [](const auto& s) {
               return s->state == SlotState::loading || s->state == SlotState::writing;
             });
    });
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  files_.clear();
  io_.reset();
  if (!files_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(files_dir_, ec);
  }
}

std::string StagedMomentStore::describe() const {
  std::string where = files_.empty()
                          ? "in RAM"
                          : "in files under " + files_dir_ + (files_[0]->direct() ? " (O_DIRECT, " : " (page cache, ") +
                                std::to_string(o_.io_threads) + " I/O threads)";
  const std::string held = stages_.size() < index_.size()
                               ? "; this rank's " + std::to_string(stages_.size()) + " of the model's " +
                                     std::to_string(index_.size()) + " stages"
                               : "";
  return std::string(moment_codec_name(o_.codec)) + (o_.with_masters ? " moments and fp32 masters " : " moments ") +
         where + ", " + std::to_string(o_.staging_stages) + " staging stages" + held;
}

std::string StagedMomentStore::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_.empty() ? load_error_ : failed_;
}

std::size_t StagedMomentStore::disk_bytes() const {
  std::size_t total = 0;
  for (const auto& f : files_) total += f->buffer_bytes();  // each file's size once written at its largest
  return total;
}

StagedMomentStore::Footprint StagedMomentStore::footprint(const std::vector<std::size_t>& stage_floats,
                                                          const StagedMomentStoreOptions& o) {
  Footprint f;
  if (stage_floats.empty()) return f;
  const std::size_t arrays = o.with_masters ? 3 : 2;
  const auto master = [&](std::size_t n) { return o.with_masters ? n * sizeof(float) : 0; };
  std::vector<std::size_t> held;  // the stages this store would hold (visit_order)
  for (std::int64_t s : held_stages(stage_floats.size(), o.visit_order))
    held.push_back(stage_floats[static_cast<std::size_t>(s)]);
  const std::size_t max_floats = *std::max_element(held.begin(), held.end());
  std::size_t header = 0;
  for (std::size_t n : held) {
    const std::size_t payload = encoded_bound(o.codec, n) + master(n);
    const std::size_t h = StageFile::header_bytes_for(payload);
    header = std::max(header, h);
    if (!o.dir.empty())
      f.disk += h + round_up(payload, kDirectAlign);
    else
      f.ram_encodings += payload;
  }
  std::size_t encoded = round_up(encoded_bound(o.codec, max_floats) + master(max_floats), kDirectAlign);
  if (!o.dir.empty()) encoded += header;
  const bool raw_in_place = o.codec == MomentCodec::none && !o.dir.empty();
  const std::size_t fp32 = raw_in_place ? 0 : arrays * max_floats * sizeof(float);
  f.ram = static_cast<std::size_t>(o.staging_stages) * (encoded + fp32);
  return f;
}

std::size_t StagedMomentStore::ram_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t total = 0;
  for (const auto& s : slots_) total += s->fp32.bytes() + s->encoded.bytes();
  for (const auto& b : blobs_) total += b.capacity();
  return total;
}

MomentStoreStats StagedMomentStore::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::string StagedMomentStore::file_path(std::int64_t stage) const {
  return files_.empty() ? std::string() : files_.at(static_cast<std::size_t>(index_of(stage)))->path();
}

bool StagedMomentStore::holds(std::int64_t stage) const {
  return stage >= 0 && static_cast<std::size_t>(stage) < index_.size() && index_[static_cast<std::size_t>(stage)] >= 0;
}

std::int64_t StagedMomentStore::index_of(std::int64_t stage) const {
  if (!holds(stage))
    throw std::out_of_range("moment store: stage " + std::to_string(stage) +
                            (stage >= 0 && static_cast<std::size_t>(stage) < index_.size()
                                 ? " is not held here (another rank owns it: cluster.shard_state)"
                                 : " out of range"));
  return index_[static_cast<std::size_t>(stage)];
}

std::vector<std::int64_t> StagedMomentStore::staged_stages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::int64_t> out;
  for (const auto& s : slots_)
    if (s->state != SlotState::empty) out.push_back(stages_[static_cast<std::size_t>(s->stage)]);
  std::sort(out.begin(), out.end());
  return out;
}

StagedMomentStore::Slot* StagedMomentStore::find(std::int64_t index) {
  for (auto& s : slots_)
    if (s->stage == index) return s.get();
  return nullptr;
}

// Whether `index` is one of the next `staging_stages - 2` stages of the visit order after the
// optimizer's position (what the read-ahead loads or keeps).
bool StagedMomentStore::in_window(std::int64_t index) const {
  const auto S = static_cast<std::int64_t>(floats_.size());
  const std::int64_t depth = o_.staging_stages - 2;
  if (position_ < 0) return false;
  const std::int64_t ahead = ((index - position_) % S + S) % S;
  return ahead >= 1 && ahead <= depth;
}

// An empty slot, else the least recently used ready one (never a retained one; for a read-ahead never
// one holding a stage of the read-ahead window: that would undo the read ahead). nullptr: none free.
StagedMomentStore::Slot* StagedMomentStore::pick_victim(bool for_prefetch) {
  Slot* best = nullptr;
  for (auto& s : slots_) {
    if (s->state == SlotState::empty) return s.get();
    if (s->state != SlotState::ready || s->retained) continue;
    if (for_prefetch && in_window(s->stage)) continue;
    if (!best || s->last_use < best->last_use) best = s.get();
  }
  return best;
}

void StagedMomentStore::start_load(Slot* s, std::int64_t stage) {
  s->stage = stage;
  s->state = SlotState::loading;
  s->error.clear();
  s->dirty = false;
  s->last_use = ++clock_;
  jobs_.push_back(Job{s, false});
  cv_.notify_all();
}

void StagedMomentStore::prefetch() {
  const auto S = static_cast<std::int64_t>(floats_.size());
  if (position_ < 0 || !read_ahead_) return;
  for (std::int64_t k = 1; k <= std::min<std::int64_t>(o_.staging_stages - 2, S - 1); ++k) {
    const std::int64_t index = (position_ + k) % S;
    if (find(index)) continue;
    Slot* v = pick_victim(true);
    if (!v) return;
    start_load(v, index);
  }
}

MomentView StagedMomentStore::acquire(std::int64_t stage) { return acquire_impl(stage, Acquirer::optimizer); }

MomentView StagedMomentStore::acquire_to_overwrite(std::int64_t stage) {
  return acquire_impl(stage, Acquirer::overwrite);
}

MomentView StagedMomentStore::acquire_to_read(std::int64_t stage) { return acquire_impl(stage, Acquirer::reader); }

MomentView StagedMomentStore::acquire_impl(std::int64_t global_stage, Acquirer who) {
  const std::int64_t stage = index_of(global_stage);  // from here on: the index in the visit order
  const bool overwrite = who == Acquirer::overwrite;
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  bool hit = true;
  while (true) {
    if (!failed_.empty()) throw MomentStoreError(failed_);
    Slot* s = find(stage);
    if (s && (s->state == SlotState::ready || s->state == SlotState::leased)) {
      s->state = SlotState::leased;
      ++s->leases;
      s->last_use = ++clock_;
      // The read-ahead follows the optimizer (and an overwriting caller) through the visit order; a
      // reader beside it (the checkpointer) leaves it where the optimizer is, so what is read ahead
      // stays what the optimizer acquires next.
      if (who != Acquirer::reader) {
        position_ = stage;
        // A caller that overwrites stages (loading a checkpoint, initialising) overwrites the next ones
        // too: reading them ahead would only delay it (each overwrite would wait for a useless read).
        read_ahead_ = !overwrite;
        prefetch();
      }
      if (hit) ++stats_.hits;
      stats_.acquire_wait_s += since(t0);
      const std::size_t n = floats_[static_cast<std::size_t>(stage)];
      float* f = s->moments;
      if (o_.with_masters) return MomentView{f + n, f + 2 * n, f};
      return MomentView{f, f + n};
    }
    if (s && s->state == SlotState::empty && !s->error.empty()) {
      const std::string e = s->error;
      s->error.clear();
      s->stage = -1;
      throw MomentStoreError(e);
    }
    if (!s) {
      // A reader takes a slot outside the read-ahead window when there is one.
      Slot* v = who == Acquirer::reader ? pick_victim(true) : nullptr;
      if (!v) v = pick_victim(false);
      if (v) {
        if (overwrite) {  // nothing to read: the slot is the stage's from now on
          v->stage = stage;
          v->state = SlotState::ready;
          v->error.clear();
          v->dirty = true;
          continue;
        }
        start_load(v, stage);
        hit = false;
        continue;
      }
    } else if (s->state == SlotState::loading) {
      hit = false;
    }
    cv_.wait(lock);
  }
}

void StagedMomentStore::release(std::int64_t global_stage, bool modified) noexcept {
  if (!holds(global_stage)) return;  // never acquired
  std::lock_guard<std::mutex> lock(mutex_);
  Slot* s = find(index_[static_cast<std::size_t>(global_stage)]);
  if (!s || s->state != SlotState::leased) return;  // not leased: nothing to do (a bug, but never lose data)
  s->dirty = s->dirty || modified;
  if (--s->leases > 0) return;
  if (s->dirty) {
    s->state = SlotState::writing;
    jobs_.push_back(Job{s, true});
  } else {
    s->state = SlotState::ready;
  }
  prefetch();
  cv_.notify_all();
}

void StagedMomentStore::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] {
    return std::none_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->state == SlotState::writing; });
  });
  if (!failed_.empty()) throw MomentStoreError(failed_);
}

void StagedMomentStore::reset(std::int64_t global_stage) {
  if (!holds(global_stage)) return;  // a stage another rank owns: nothing of it here
  const std::int64_t stage = index_of(global_stage);
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] {
    Slot* s = find(stage);
    return !s || s->state == SlotState::ready || s->state == SlotState::empty;
  });
  if (Slot* s = find(stage)) {
    s->stage = -1;
    s->state = SlotState::empty;
    s->retained = false;
    s->error.clear();
  }
  fresh_.at(static_cast<std::size_t>(stage)) = 1;
  if (!blobs_.empty()) std::vector<std::byte>().swap(blobs_[static_cast<std::size_t>(stage)]);
}

void StagedMomentStore::evict_all() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] {
    return std::none_of(slots_.begin(), slots_.end(),
                        [](const auto& s) { return s->state == SlotState::loading || s->state == SlotState::writing; });
  });
  for (auto& s : slots_)
    if (s->state == SlotState::ready && !s->retained) {
      s->stage = -1;
      s->state = SlotState::empty;
    }
  position_ = -1;
}

void StagedMomentStore::worker() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;
    const Job job = jobs_.front();
    jobs_.pop_front();
    Slot& s = *job.slot;
    const std::int64_t stage = s.stage;
    const auto st = static_cast<std::size_t>(stage);
    const auto t0 = Clock::now();
    if (job.store) {
      const std::uint64_t gen = generation_[st] + 1;
      lock.unlock();
      std::string err;
      std::uint64_t bytes = 0;
      try {
        bytes = store(s, stage, gen);
      } catch (const std::exception& e) {
        err = e.what();
      }
      lock.lock();
      stats_.store_s += since(t0);
      ++stats_.stores;
      s.state = SlotState::ready;
      s.dirty = false;
      if (err.empty()) {
        generation_[st] = gen;
        fresh_[st] = 0;
        stats_.file_bytes_written += files_.empty() ? 0 : bytes;
      } else {
        s.retained = true;  // the only good copy of this stage now
        if (failed_.empty()) failed_ = err;
      }
    } else {
      const std::uint64_t gen = generation_[st];
      const bool fresh = fresh_[st] != 0;
      lock.unlock();
      std::string err;
      try {
        load(s, stage, gen, fresh);
      } catch (const std::exception& e) {
        err = e.what();
      }
      lock.lock();
      stats_.load_s += since(t0);
      ++stats_.loads;
      if (err.empty()) {
        s.state = SlotState::ready;
        if (!fresh && !files_.empty()) stats_.file_bytes_read += header_bytes_;  // the payload: in load()
      } else {
        s.state = SlotState::empty;
        s.error = err;
        load_error_ = err;
      }
    }
    cv_.notify_all();
  }
}

void StagedMomentStore::load(Slot& s, std::int64_t stage, std::uint64_t generation, bool fresh) {
  const std::size_t n = floats_[static_cast<std::size_t>(stage)];
  float* m = s.moments;
  if (fresh) {
    std::memset(m, 0, arrays() * n * sizeof(float));
    return;
  }
  const std::byte* enc = nullptr;
  std::size_t bytes = 0;
  if (!files_.empty()) {
    bytes = files_[static_cast<std::size_t>(stage)]->read(s.encoded.data(), generation, *io_);
    enc = s.encoded.data() + header_bytes_;
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.file_bytes_read += round_up(bytes, kDirectAlign);
  } else {
    const auto& blob = blobs_[static_cast<std::size_t>(stage)];
    enc = blob.data();
    bytes = blob.size();
  }
  const auto t0 = Clock::now();
  try {
    if (raw_in_place()) {
      if (bytes != arrays() * n * sizeof(float)) throw std::runtime_error("fp32 moments: wrong size");
    } else {
      const std::size_t mb = master_bytes(n);
      if (bytes < mb) throw std::runtime_error("shorter than its fp32 masters");
      std::memcpy(m, enc, mb);  // the masters, then the codec's moments
      float* mo = m + mb / sizeof(float);
      decode_moments(o_.codec, enc + mb, bytes - mb, n, mo, mo + n);
    }
  } catch (const std::exception& e) {
    throw MomentStoreError("moments of stage " + std::to_string(stages_[static_cast<std::size_t>(stage)]) + " (" +
                           (files_.empty() ? std::string("in RAM") : files_[static_cast<std::size_t>(stage)]->path()) +
                           "): " + e.what());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.decode_s += since(t0);
}

std::uint64_t StagedMomentStore::store(Slot& s, std::int64_t stage, std::uint64_t generation) {
  const std::size_t n = floats_[static_cast<std::size_t>(stage)];
  float* m = s.moments;
  const auto t0 = Clock::now();
  std::byte* enc = s.encoded.data() + payload_offset();
  std::size_t bytes = arrays() * n * sizeof(float);
  if (!raw_in_place()) {
    const std::size_t mb = master_bytes(n);
    std::memcpy(enc, m, mb);  // the masters as they are, then the codec's moments
    float* mo = m + mb / sizeof(float);
    bytes = mb + encode_moments(o_.codec, mo, mo + n, n, enc + mb);
    // A lossy code: the slot keeps what a load would give back, so an acquire that finds the stage
    // still in its slot sees the same moments as one that reads it (which one happens depends on the
    // workers' timing; training must not).
    if (o_.codec == MomentCodec::int8) decode_moments(o_.codec, enc + mb, bytes - mb, n, mo, mo + n);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.encode_s += since(t0);
    stats_.raw_bytes += arrays() * n * sizeof(float);
    stats_.encoded_bytes += bytes;
  }
  if (!files_.empty()) return files_[static_cast<std::size_t>(stage)]->write(s.encoded.data(), bytes, generation, *io_);
  // In RAM: the blob is only touched by this store job (one per stage at a time) and by loads of this
  // stage, which cannot run while its slot is being written.
  auto& blob = blobs_[static_cast<std::size_t>(stage)];
  blob.assign(enc, enc + bytes);
  return bytes;
}

}  // namespace mt::offload
