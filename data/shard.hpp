// Token shards on disk.
//
// Native format (llm.c): a header of 256 little-endian int32 (magic, version, token count, rest zero),
// then the tokens from byte 1024: uint16 when magic is 20240520, uint32 when magic is 20240801.
// Beside a shard `x.bin` may sit a loss mask `x.mask` in the same layout (magic 20240902, one uint8 per
// token: 1 = the token counts as a prediction target, 0 = it is excluded from the loss), and its documents
// `x.docs` (magic 20241104, header count = documents, then one uint64 per document: the token offset where
// it starts, strictly increasing from 0), which data.packing = documents reads.
//
// Also readable: nanoGPT's raw uint16 `.bin` (no header) and Megatron-LM's `.bin` + `.idx` pair
// (MMapIndexedDataset, index version 1). Writers are atomic: data goes to `<path>.tmp.<pid>` and is renamed
// onto the final name only when complete, so a partial shard never sits under the final name.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mt::data {

// Every error of the data library: the message names the file and, where it applies, line or offset.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// The shards are valid but hold fewer tokens than one step's sequences need (long context on a small
// validation set: the run can go on without evaluating).
class TooFewTokens : public DataError {
 public:
  using DataError::DataError;
};

constexpr int32_t kShardMagicU16 = 20240520;
constexpr int32_t kShardMagicU32 = 20240801;
constexpr int32_t kMaskMagic = 20240902;
constexpr int32_t kDocsMagic = 20241104;
constexpr int32_t kShardVersion = 1;
constexpr std::size_t kShardHeaderInts = 256;
constexpr std::size_t kShardHeaderBytes = kShardHeaderInts * 4;

enum class ShardFormat {
  Auto,      // llm.c when the magic matches; Megatron when `<stem>.idx` exists; otherwise an error
  LlmC,      // 1024-byte header + uint16/uint32 tokens
  NanoGpt,   // raw uint16 tokens, no header
  Megatron,  // `<stem>.bin` tokens + `<stem>.idx` index
};

// A read-only memory map of a whole file (empty files map to nothing). Move-only.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();
  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

// One memory-mapped token stream (with its optional loss mask). Token i is read as uint32.
class TokenShard {
 public:
  // load_docs: the documents' starts are needed (data.packing = documents): from `x.docs`, or a Megatron
  // index's sequences; a shard without them is a DataError naming the file and how to rebuild it.
  static TokenShard open(const std::string& path, ShardFormat format = ShardFormat::Auto, bool load_mask = true,
                         bool load_docs = false);
  std::size_t size() const { return count_; }  // tokens
  int token_bytes() const { return width_; }   // 2 or 4
  ShardFormat format() const { return format_; }
  const std::string& path() const { return file_.path(); }
  uint32_t operator[](std::size_t i) const {
    return width_ == 2 ? uint32_t(reinterpret_cast<const uint16_t*>(tokens_)[i])
                       : reinterpret_cast<const uint32_t*>(tokens_)[i];
  }
  void copy(std::size_t begin, std::size_t n, uint32_t* out) const;
  bool has_mask() const { return mask_ != nullptr; }
  uint8_t mask(std::size_t i) const { return mask_ ? mask_[i] : uint8_t(1); }
  // Megatron only: token offsets of each sequence start, plus the end (size()+1 entries); empty otherwise.
  const std::vector<uint64_t>& sequence_offsets() const { return seq_offsets_; }
  // Opened with load_docs: whether a document starts at token i (token 0 always does).
  bool has_docs() const { return docs_ != nullptr; }
  bool starts_document(std::size_t i) const;

 private:
  MappedFile file_, mask_file_, docs_file_;
  const unsigned char* tokens_ = nullptr;
  const uint8_t* mask_ = nullptr;
  const uint64_t* docs_ = nullptr;  // ascending starts (the mapped `.docs` body or seq_offsets_)
  std::size_t doc_count_ = 0;
  std::size_t count_ = 0;
  int width_ = 2;
  ShardFormat format_ = ShardFormat::LlmC;
  std::vector<uint64_t> seq_offsets_;
  void load_docs(const std::string& path);
};

// `dir/x.bin` -> `dir/x.mask`, `dir/x.docs`.
std::string mask_path_for(const std::string& shard_path);
std::string docs_path_for(const std::string& shard_path);

// Reads a whole llm.c shard (validating it) into memory.
std::vector<uint32_t> read_shard(const std::string& path);

// Writes an llm.c shard in one go, atomically. token_bytes: 2 (every token must be < 65536) or 4.
void write_shard(const std::string& path, const uint32_t* tokens, std::size_t n, int token_bytes);
void write_mask(const std::string& path, const uint8_t* mask, std::size_t n);
// Writes documents' starts (ascending from 0, each below `tokens` unless both are 0), atomically.
void write_docs(const std::string& path, const std::vector<uint64_t>& starts, std::size_t tokens);

// Writes a Megatron-LM `.bin`/`.idx` pair (uint16 or int32 tokens), one sequence per entry of `docs`.
void write_megatron(const std::string& stem, const std::vector<std::vector<uint32_t>>& docs, int token_bytes);

// Streaming llm.c shard writer: appends tokens (and optionally mask bytes) to temporary files; commit()
// patches the header and renames them onto their final names. Destroyed uncommitted, it removes them.
// begin_document() marks that a document starts with the next token appended: a writer told of documents
// (with_docs, or begin_document called) commits `x.docs` beside the shard, its first token always a start
// (a document cut by the shard's start is a piece of its own).
class ShardWriter {
 public:
  ShardWriter(std::string path, int token_bytes, bool with_mask, bool with_docs = false);
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  ~ShardWriter();
  void append(const uint32_t* tokens, const uint8_t* mask, std::size_t n);
  void begin_document();
  void commit();
  std::size_t tokens() const { return count_; }
  std::size_t bytes() const { return kShardHeaderBytes + count_ * std::size_t(width_); }
  const std::string& path() const { return path_; }

 private:
  struct Out;
  std::string path_;
  int width_;
  bool with_mask_, with_docs_;
  std::size_t count_ = 0;
  std::vector<uint64_t> doc_starts_;
  std::unique_ptr<Out> out_;
};

}  // namespace mt::data
