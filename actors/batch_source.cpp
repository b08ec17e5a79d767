#include "actors/batch_source.hpp"

#include <algorithm>

namespace mt::actors {

nlohmann::json BatchSource::cursor_before(std::uint64_t) { return nullptr; }
void BatchSource::restore(std::uint64_t, const nlohmann::json&) {}

nlohmann::json ShardBatchSource::cursor_before(std::uint64_t g) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = before_.find(g);
  if (it != before_.end()) return it->second;
  if (g < next_) {
    // Older than every snapshot kept: replay from the nearest one below (never happens for a step
    // boundary of the current or previous step).
    auto below = before_.upper_bound(g);
    if (below == before_.begin())
      throw std::runtime_error("data cursor before batch " + std::to_string(g) + " is not kept");
    --below;
    data::DataLoader copy(loader_.options());
    copy.restore(below->second);
    data::Batch tmp;
    for (std::uint64_t i = below->first; i < g; ++i) copy.next(tmp);
    return copy.cursor();
  }
  // Not served yet: advance (the same batches get() would produce), snapshotting each.
  data::Batch tmp;
  while (next_ < g) {
    before_[next_] = loader_.cursor();
    loader_.next(tmp);
    ++next_;
  }
  return loader_.cursor();
}

void ShardBatchSource::restore(std::uint64_t g, const nlohmann::json& cursor) {
  std::lock_guard<std::mutex> lock(mutex_);
  before_.clear();
  if (cursor.is_null()) {
    loader_.seek(g);
  } else {
    loader_.restore(cursor.get<data::Cursor>());
  }
  next_ = g;
  before_[g] = loader_.cursor();
}

ShardBatchSource::ShardBatchSource(data::LoaderOptions options) : loader_(std::move(options)) {}

void ShardBatchSource::get(std::uint64_t g, data::Batch& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (g != next_) {
    // Seek: back to a snapshot we took, or forward from the nearest one below g.
    auto it = before_.upper_bound(g);
    if (it == before_.begin()) {
      next_ = 0;
      // No snapshot below g: only possible before the first batch was served.
    } else {
      --it;
      loader_.restore(it->second);
      next_ = it->first;
    }
    while (next_ < g) {
      before_[next_] = loader_.cursor();
      loader_.next(out);
      ++next_;
    }
  }
  before_[g] = loader_.cursor();
  loader_.next(out);
  next_ = g + 1;
  // Keep snapshots bounded: a restart re-asks at most the batches of the current and previous steps.
  while (before_.size() > 4096) before_.erase(before_.begin());
}

}  // namespace mt::actors

namespace mt::actors {

std::unique_ptr<VectorBatchSource> make_eval_source(const std::string& validation_files, int batch_size, int seq_len,
                                                    std::uint32_t vocab_size, std::int64_t max_batches,
                                                    bool documents) {
  data::LoaderOptions lo;
  lo.documents = documents;
  lo.shards = data::expand_shard_paths({validation_files});
  lo.batch_size = batch_size;
  lo.seq_len = seq_len;
  lo.shuffle = false;
  lo.vocab_size = vocab_size;
  data::DataLoader loader(lo);
  const auto n = static_cast<std::int64_t>(
      std::min<std::uint64_t>(static_cast<std::uint64_t>(max_batches), loader.batches_per_epoch()));
  std::vector<data::Batch> batches(static_cast<std::size_t>(n));
  for (auto& b : batches) loader.next(b);
  return std::make_unique<VectorBatchSource>(std::move(batches));
}

}  // namespace mt::actors
