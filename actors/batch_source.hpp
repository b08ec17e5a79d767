// Where the engine's micro-batches come from: a deterministic function of the micro-batch's global
// index g = step * gradient_accumulation_steps + micro_batch. The data loader actor asks for g and
// prefetches g + 1; a restarted loader asks again for a g it has served before and must get the same
// batch, so a source keeps what it needs to seek back (the loader's cursor snapshots): that is the
// durable part of the data pipeline, and it lives here, outside any actor. No CAF here.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/loader.hpp"

namespace mt::actors {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Fills `out` with micro-batch g. Thread-safe (one caller at a time is enough).
  virtual void get(std::uint64_t g, data::Batch& out) = 0;
  // The data position before micro-batch g, for a checkpoint's run state (JSON; null when the source
  // has no state beyond g, as VectorBatchSource). Thread-safe.
  virtual nlohmann::json cursor_before(std::uint64_t g);
  // Continues from a checkpoint: the next get(g) returns what the source that produced `cursor`
  // (cursor_before(g)) would have returned. Throws on data that does not match the cursor.
  virtual void restore(std::uint64_t g, const nlohmann::json& cursor);
};

// The data engineer's loader (llm.c token shards, deterministic shuffling) behind the by-index API: a
// cursor snapshot is kept for every batch handed out, so any earlier batch can be served again.
class ShardBatchSource : public BatchSource {
 public:
  explicit ShardBatchSource(data::LoaderOptions options);
  void get(std::uint64_t g, data::Batch& out) override;
  nlohmann::json cursor_before(std::uint64_t g) override;
  void restore(std::uint64_t g, const nlohmann::json& cursor) override;
  const data::DataLoader& loader() const { return loader_; }

 private:
  std::mutex mutex_;
  data::DataLoader loader_;
  std::uint64_t next_ = 0;                        // the index loader_.next() returns next
  std::map<std::uint64_t, data::Cursor> before_;  // cursor before batch g
};

// Fixed batches in memory (tests, benchmarks): batch g = batches[g % size].
class VectorBatchSource : public BatchSource {
 public:
  explicit VectorBatchSource(std::vector<data::Batch> batches) : batches_(std::move(batches)) {}
  void get(std::uint64_t g, data::Batch& out) override { out = batches_.at(g % batches_.size()); }
  const std::vector<data::Batch>& batches() const { return batches_; }

 private:
  std::vector<data::Batch> batches_;
};

// The evaluation batches of a run: the first `max_batches` micro-batches of B x T tokens of the
// validation shards, windows in file order (no shuffling), read once at start. Fewer when the data
// holds fewer windows (never repeated). Throws data::DataError naming the file on bad data. documents:
// data.packing = documents (the loader's positions and document-ending targets).
std::unique_ptr<VectorBatchSource> make_eval_source(const std::string& validation_files, int batch_size, int seq_len,
                                                    std::uint32_t vocab_size, std::int64_t max_batches,
                                                    bool documents = false);

}  // namespace mt::actors
