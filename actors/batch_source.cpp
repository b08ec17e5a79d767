#include "actors/batch_source.hpp"

namespace mt::actors {

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
