// Byte-level BPE tokenizer, exact to Hugging Face `tokenizers` for the byte-level BPE family (GPT-2,
// Llama-3, Qwen2/3 and what the BPE trainer writes).
//
// Loads a Hugging Face tokenizer.json (model BPE with vocab and merges; normalizer none or NFC;
// pre-tokenizer ByteLevel, Split with a regex, or a Sequence of them; ByteLevel decoder; added tokens)
// or GPT-2's encoder.json + vocab.bpe pair (then `<|endoftext|>` is a special token). Anything else is a
// DataError naming the file and the JSON field.
//
// Encoding follows the library step by step: added tokens are cut out first (leftmost-longest match),
// each remaining section is normalized and pre-tokenized on its own, and every pre-token is merged by
// BPE in rank order (lowest rank first, leftmost first among equals). The split regexes run on PCRE2
// with JIT; `\s` is widened to Unicode White_Space so it means what it means in Oniguruma.
// Input must be valid UTF-8 (DataError with the byte offset otherwise). decode() returns the exact bytes
// of the tokens (so decode(encode(x)) == x whenever normalization leaves x unchanged).
//
// encode() gives the ids of the text alone. encode_single() / encode_pair() are HF's tokenizer(text) and
// tokenizer(a, b): the tokenizer.json `post_processor` template (TemplateProcessing, BertProcessing,
// RobertaProcessing, or a Sequence holding one of them beside ByteLevel) adds its special tokens, such as
// Llama-3's <|begin_of_text|> or Mistral's <s> in front, unless add_special_tokens is false.
//
// encode() is const and thread-safe; each thread keeps its own word cache.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/shard.hpp"  // DataError

namespace mt::data {

struct AddedToken {
  uint32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

class Tokenizer {
 public:
  // A Hugging Face tokenizer.json.
  static Tokenizer from_hf_json(const std::string& path);
  static Tokenizer from_hf_json_text(const std::string& json_text, const std::string& name = "tokenizer.json");
  // GPT-2's encoder.json and vocab.bpe (merges); `<|endoftext|>` becomes a special added token.
  static Tokenizer from_gpt2(const std::string& encoder_json, const std::string& vocab_bpe);
  // A directory holding tokenizer.json (or encoder.json + vocab.bpe), or a tokenizer.json path.
  static Tokenizer load(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Appends the ids of `text` to `out`. allow_special = false treats special added tokens as plain text
  // (HF's encode_special_tokens); non-special added tokens are always matched, as in HF.
  void encode(std::string_view text, std::vector<uint32_t>& out, bool allow_special = true) const;
  std::vector<uint32_t> encode(std::string_view text, bool allow_special = true) const;
  // HF's tokenizer(text): encode() placed in the post-processor's single template. add_special_tokens =
  // false is HF's add_special_tokens=False (the template adds no token: the ids of encode()).
  std::vector<uint32_t> encode_single(std::string_view text, bool add_special_tokens = true,
                                      bool allow_special = true) const;
  // HF's tokenizer(a, b): both texts placed in the pair template (without a post-processor: a's ids, then b's).
  std::vector<uint32_t> encode_pair(std::string_view a, std::string_view b, bool add_special_tokens = true,
                                    bool allow_special = true) const;
  // The single template as the ids it puts before and after the text (both empty without a post-processor),
  // for callers that encode a text in parts, like the shard builder; nullopt when the template does not
  // hold the text exactly once.
  struct Affixes {
    std::vector<uint32_t> before, after;
  };
  const std::optional<Affixes>& single_affixes() const;
  // Exact bytes of the tokens; DataError on an id outside the vocabulary.
  std::string decode(const uint32_t* ids, std::size_t n, bool skip_special = false) const;
  std::string decode(const std::vector<uint32_t>& ids, bool skip_special = false) const;

  // Calls f(piece) for every pre-token of `text` in order (added tokens cut out and not reported,
  // normalization applied): what BPE then merges. The trainer counts words with it.
  void for_each_pretoken(std::string_view text, const std::function<void(std::string_view)>& f) const;

  // True when every pre-tokenizer step is one of the GPT-2 / Llama-3 / Qwen2 split regexes (no prefix
  // space) and no added token holds a space: then the text splits before any space that sits between two
  // ASCII letters, and pieces cut there encode independently to the ids of the whole.
  bool splits_at_letter_spaces() const;

  uint32_t vocab_size() const;                                              // largest id + 1
  std::optional<uint32_t> token_to_id(std::string_view token_bytes) const;  // raw bytes or added content
  const std::string& id_to_bytes(uint32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;
  // `<|endoftext|>` when present, else the first special added token; nullopt when there is none.
  std::optional<uint32_t> eot_id() const;
  const std::string& source() const;  // the file it was loaded from

  // GPT-2's byte <-> printable-character map used by byte-level vocabularies (UTF-8 of each byte's char).
  static const std::string& byte_to_unicode(uint8_t b);

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Regexes of the common byte-level pre-tokenizers (Oniguruma syntax as written in tokenizer.json).
extern const char* const kGpt2SplitPattern;
extern const char* const kLlama3SplitPattern;
extern const char* const kQwen2SplitPattern;

// Offset of the first byte that is not valid UTF-8 (overlongs, surrogates and > U+10FFFF are invalid),
// or npos when all of `s` is valid.
std::size_t find_invalid_utf8(std::string_view s);

}  // namespace mt::data
