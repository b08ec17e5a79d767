// Learns a byte-level BPE vocabulary from text and writes it as a Hugging Face tokenizer.json.
//
// Words are the pre-tokens of the chosen split regex (GPT-2's by default), counted over all text given.
// Training starts from the 256 bytes (ids 0..255, id = byte value) and repeatedly merges the most frequent
// adjacent pair (ties: the pair whose tokens' bytes compare smallest), until the vocabulary, counting the
// special tokens, has the size asked for or no pair occurs min_frequency times. Special tokens take the
// last ids. The output loads in Hugging Face tokenizers (model BPE, ByteLevel pre-tokenizer and decoder)
// and in mt::data::Tokenizer, which encode identically. Deterministic: same text, same options, same file.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mt::data {

struct BpeTrainerOptions {
  uint32_t vocab_size = 4096;  // including the 256 bytes and the special tokens
  std::vector<std::string> special_tokens{"<|endoftext|>"};
  std::string split_pattern;   // empty: GPT-2's (pre_tokenizer ByteLevel with regex)
  uint64_t min_frequency = 2;  // pairs rarer than this are never merged
};

struct BpeTrainStats {
  uint64_t words = 0;        // distinct pre-tokens
  uint64_t word_tokens = 0;  // pre-tokens counted
  uint32_t merges = 0;
  uint32_t vocab_size = 0;
};

class BpeTrainer {
 public:
  explicit BpeTrainer(BpeTrainerOptions options = {});
  ~BpeTrainer();
  BpeTrainer(const BpeTrainer&) = delete;
  BpeTrainer& operator=(const BpeTrainer&) = delete;

  // Counts the pre-tokens of `text` (special tokens in it are cut out, not counted). Valid UTF-8 only.
  void add_text(std::string_view text);
  // Learns the merges and returns the tokenizer.json text.
  std::string train(BpeTrainStats* stats = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt::data
