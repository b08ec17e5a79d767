// The engine's data loader: memory-mapped token shards -> micro-batches of B x T inputs and targets.
//
// Packing: every shard is cut into windows of T+1 consecutive tokens with stride T (the last token of a
// window is the first of the next), so documents are packed back to back with their end-of-text separators
// and no token is padding. Windows never cross shards; a shard's tail shorter than T+1 tokens is unused.
// Each epoch visits every window once, in an order that is a pure function of (seed, epoch): a
// Fisher-Yates permutation driven by splitmix64 (no std:: distributions, so it is the same on every
// platform). A micro-batch for data-parallel rank r takes windows [pos + r*B, pos + (r+1)*B) of the
// epoch's order; the cursor then advances by B * world_size. An epoch's tail of fewer windows than that
// is skipped. inputs[b][t] = window[t], targets[b][t] = window[t+1], or -100 where the shard's loss mask
// excludes token t+1.
//
// Documents (LoaderOptions::documents, data.packing = documents): the shards' `.docs` starts cut each
// window into documents, the window's first token starting a piece of its own. positions[b][t] is input
// t's position within its document (0 at a start), and where window[t+1] starts a document target t is
// -100 (a document's last token predicts nothing, as transformers run on the document alone). The
// windows are the same as in the stream, so cursors, resume and ranks are untouched.
//
// The Cursor is everything needed to continue exactly: restore(cursor()) on a loader over the same
// shards and options yields the same batches as the loader it came from.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/shard.hpp"

namespace mt::data {

struct LoaderOptions {
  std::vector<std::string> shards;  // paths or glob patterns (each pattern expanded and sorted)
  ShardFormat format = ShardFormat::Auto;
  int batch_size = 1;       // B: sequences per micro-batch (per rank)
  int seq_len = 1024;       // T: tokens per sequence
  uint64_t seed = 0;        // shuffling seed
  bool shuffle = true;      // false: windows in file order, every epoch
  uint32_t vocab_size = 0;  // > 0: every token served must be < vocab_size (else DataError)
  int rank = 0;             // data-parallel rank in [0, world_size)
  int world_size = 1;
  bool use_mask = true;    // honour `x.mask` sidecars (targets -100 where masked)
  bool documents = false;  // data.packing = documents: `x.docs` sidecars required, positions served
};

// Position in the data stream. Plain fields; JSON via to_json / from_json (nlohmann ADL).
struct Cursor {
  uint64_t seed = 0;
  uint64_t epoch = 0;     // epochs completed
  uint64_t position = 0;  // next window index in this epoch's order
  uint64_t batches = 0;   // micro-batches served so far (by this rank)
  // Consistency checks on restore: the data and shape the cursor was taken with.
  uint64_t windows = 0;  // windows per epoch
  uint64_t tokens = 0;   // tokens in all shards
  int32_t batch_size = 0;
  int32_t seq_len = 0;
  int32_t world_size = 1;
  bool shuffle = true;
  bool operator==(const Cursor& o) const;
  bool operator!=(const Cursor& o) const { return !(*this == o); }
};
void to_json(nlohmann::json& j, const Cursor& c);
void from_json(const nlohmann::json& j, Cursor& c);

struct Batch {
  static constexpr int32_t kIgnoreIndex = -100;
  int batch_size = 0;
  int seq_len = 0;
  std::vector<int32_t> inputs;     // batch_size * seq_len, row-major
  std::vector<int32_t> targets;    // batch_size * seq_len, kIgnoreIndex where the loss mask excludes
  std::vector<int32_t> positions;  // documents: batch_size * seq_len positions within documents; else empty
  uint64_t epoch = 0;              // epoch the batch came from
  uint64_t index = 0;              // micro-batch number (Cursor::batches before this batch)
  std::size_t loss_tokens = 0;     // targets that are not kIgnoreIndex
};

class DataLoader {
 public:
  explicit DataLoader(LoaderOptions options);  // throws DataError (no shards, bad file, too little data)
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;

  Batch next();
  void next(Batch& out);  // reuses out's buffers

  const Cursor& cursor() const;
  // Continues from `c` (adopting its seed); throws DataError when it was taken on other data or with
  // another batch shape (batch_size, seq_len, world_size, shuffle).
  void restore(const Cursor& c);

  // Positions the loader so that next() returns micro-batch number `batch_index` (0 = the first batch of
  // epoch 0 for this seed), in O(1): every epoch is exactly batches_per_epoch() micro-batches, so batch g
  // is batch g % batches_per_epoch() of epoch g / batches_per_epoch(). Same batches as restoring the cursor
  // saved before batch g (the cursor fields may differ at an epoch boundary: position B*world*bpe of epoch
  // e vs position 0 of epoch e+1 name the same next batch).
  void seek(uint64_t batch_index);

  const LoaderOptions& options() const;
  const std::vector<std::string>& shard_paths() const;
  uint64_t tokens() const;  // in all shards
  uint64_t windows_per_epoch() const;
  uint64_t batches_per_epoch() const;  // windows_per_epoch / (B * world_size)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// data.packing = documents: the attention pairs of a window of seq_len inputs, the sum over its pieces of
// L (L + 1) / 2 (a piece: a document, or its part inside the window), averaged over up to `max_windows`
// windows spread evenly over the shards (every window when there are fewer). Needs every shard's `.docs`
// (DataError otherwise); 0 when the shards hold no window.
double document_pairs_per_window(const std::vector<std::string>& shards, int seq_len, std::size_t max_windows = 4096);

// Expands paths and glob patterns into a sorted list of existing files; DataError if a pattern matches none.
std::vector<std::string> expand_shard_paths(const std::vector<std::string>& patterns);

}  // namespace mt::data
