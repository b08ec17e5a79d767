// Text -> token shards: what `megatrain-data shards` runs.
//
// Inputs: plain text files (each file one document), JSONL with a text field (each line one document),
// instruction records in JSONL (alpaca-style instruction/input/output, or prompt/response) rendered
// with a template, chat records rendered with a role template (chat_template.hpp), or pre-tokenized
// JSONL records (input_ids, labels, attention_mask); for instruction and chat records only the answer is
// trained on, for pre-tokenized ones the labels say (a `.mask` beside each shard).
// Each document is encoded as Hugging Face's tokenizer(text) encodes it (the tokenizer's post-processor
// template adds its BOS/EOS; add_special_tokens = false leaves them out), followed by the end-of-text token
// unless the template already ends with it, and goes to the train or the validation
// split by a seeded hash of its number. Documents are encoded on `threads` workers (large plain-text
// documents are cut where the tokenizer provably splits anyway, so the ids are those of the whole text);
// the output is the same for any thread count. Shards are written atomically (temporary name + rename);
// on any error every shard written by the run is removed and nothing partial is left.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/chat_template.hpp"
#include "data/tokenizer.hpp"

namespace mt::data {

// Tokens: JSONL records with input_ids (optional labels, attention_mask), chosen by build_shards when a
// Jsonl run's first record holds input_ids. Chat: {"messages": [...]} rendered with BuildOptions::chat.
// Both are taken as they are: no post-processor template, no end-of-text separator.
enum class InputFormat { Text, Jsonl, Instruct, Chat, Tokens };

// Rendering of an instruction record. Placeholders: {instruction} {input} {prompt} (prompt side) and
// {output} {response} (response side). The prompt part is masked out of the loss.
struct InstructTemplate {
  std::string prompt;           // used when the record has a non-empty input
  std::string prompt_no_input;  // used otherwise
  std::string response;         // the part that is trained on (the end-of-text token follows it)
  static InstructTemplate alpaca();
  static InstructTemplate plain();  // "{instruction}\n{input}\n" / "{output}"
  // A JSON file {"prompt": ..., "prompt_no_input": ..., "response": ...} or a built-in name.
  static InstructTemplate load(const std::string& name_or_path);
};

struct BuildOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  std::string prefix;  // shard names: <prefix>train_000000.bin, <prefix>val_000000.bin
  InputFormat format = InputFormat::Text;
  std::string text_field = "text";  // JSONL
  InstructTemplate instruct = InstructTemplate::alpaca();
  ChatTemplate chat;  // Chat: the role template (ChatTemplate::load)
  // The tokenizer's post-processor template around each document (Llama-3's <|begin_of_text|>, Mistral's
  // <s>), as HF's add_special_tokens=True; false: the document's ids alone. Its tokens before an
  // instruction record's prompt are masked with the prompt, those after the response are trained on.
  bool add_special_tokens = true;
  double val_fraction = 0.0;  // share of documents that go to validation
  uint64_t seed = 1337;       // of the split
  uint64_t shard_tokens = 100'000'000;
  int token_bytes = 0;  // 0: 2 when the vocabulary fits uint16, else 4
  int threads = 1;
  std::size_t chunk_bytes = 1 << 20;   // target size of work items cut from large plain-text documents
  std::size_t block_bytes = 32 << 20;  // files are read in blocks of about this size (memory: a few blocks)
};

struct BuildProgress {
  uint64_t bytes_done = 0, bytes_total = 0, tokens = 0, documents = 0;
  double seconds = 0;
};

struct BuildSummary {
  uint64_t documents = 0, train_documents = 0, val_documents = 0;
  uint64_t tokens = 0, train_tokens = 0, val_tokens = 0, masked_tokens = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
  double seconds = 0;
  std::vector<std::string> shards;  // paths written (token shards; masks sit beside them)
};

// Writes the shards and `<out_dir>/<prefix>dataset.json` (what was built, with which tokenizer).
BuildSummary build_shards(const Tokenizer& tok, const BuildOptions& options,
                          const std::function<void(const BuildProgress&)>& progress = {});

// Pieces of `text` that encode, one by one, to the ids of the whole text: cut only before a space that sits
// between two ASCII letters, where GPT-2/Llama-3/Qwen2 split regexes always split. One piece when the
// tokenizer's pre-tokenizer is not one of those.
std::vector<std::string_view> split_for_parallel(const Tokenizer& tok, std::string_view text, std::size_t target_bytes);

// data.packing = auto resolved for the shards `train_files` names: "documents" when the dataset.json that
// megatrain-data wrote beside the first of them says the documents are records (instruct, chat, token
// records: fine-tuning data, each record its own document), "stream" for text corpora and for shards
// without one. A value other than "auto" is returned as it is.
std::string resolved_packing(const std::string& packing, const std::string& train_files);

}  // namespace mt::data
