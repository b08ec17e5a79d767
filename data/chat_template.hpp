// Chat records and pre-tokenized records -> token ids and a loss mask (what `megatrain-data shards
// --format chat` and `--format jsonl` with `input_ids` records write).
//
// No Jinja here: a role template is data (a small JSON, see data/chat_templates/), each built-in one checked
// in tests/python/test_chat_templates.py to render byte for byte what transformers' apply_chat_template
// renders from that family's tokenizer_config.json. A message renders as prefix + content + end + suffix of
// its role; an assistant turn's content and end are trained on (mask 1), nothing else is.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tokenizer.hpp"

namespace mt::data {

struct ChatRole {
  std::string prefix;  // before the content
  std::string end;     // after the content; trained with an assistant's content (its end-of-turn token)
  std::string suffix;  // after `end`, not trained
};

struct ChatTemplate {
  std::string name;
  std::string begin;                      // before the first message (the BOS the template writes)
  std::map<std::string, ChatRole> roles;  // the roles a record may use; "assistant" is required
  bool trim_content = false;              // every content stripped as Python's str.strip() (Jinja's `trim`)
  std::vector<std::string> alternate;     // roles in this cyclic order from the first message; empty: any order
  // Qwen3: the last message, when it is an assistant turn after a user turn, gets `final_prefix` before its
  // content (trained: the model writes it) and its content loses leading `final_lstrip` characters.
  std::string final_prefix, final_lstrip;
  std::vector<std::string> not_in_content;  // strings whose presence changes the family's rendering

  // A built-in name (builtin_names()) or a JSON file; DataError naming the file and the field.
  static ChatTemplate load(const std::string& name_or_path);
  static ChatTemplate parse(const std::string& json_text, const std::string& source);
  static std::vector<std::string> builtin_names();
  // The built-in template whose special tokens the tokenizer holds (<|im_start|>: qwen3,
  // <|start_header_id|>: llama3, <s> and </s>: mistral); DataError when none fits.
  static ChatTemplate for_tokenizer(const Tokenizer& tok);
};

struct RenderedChat {
  std::string text;
  std::vector<std::pair<std::size_t, std::size_t>> trained;  // byte ranges [begin, end) of the text
};

// Renders a record {"messages": [{"role", "content"}, ...]}. `where` ("file:line") starts every error.
RenderedChat render_chat(const ChatTemplate& t, const nlohmann::json& record, const std::string& where);

// The ids of the rendered text (no post-processor template, as apply_chat_template(tokenize=True)) and
// mask 1 on every token whose bytes overlap a trained range.
void encode_chat(const Tokenizer& tok, const RenderedChat& chat, const std::string& where, std::vector<uint32_t>& ids,
                 std::vector<uint8_t>& mask);

// Checks that the tokenizer holds the template's begin and assistant end as single tokens (as the family's
// tokenizer does); DataError otherwise.
void check_chat_tokens(const ChatTemplate& t, const Tokenizer& tok);

// A pre-tokenized record {"input_ids": [...], "labels": [...]?, "attention_mask": [...]?} with Hugging
// Face's rules: labels[j] is -100 (not a target) or input_ids[j]; attention_mask[j] == 0 drops token j.
void read_token_record(const nlohmann::json& record, uint32_t vocab_size, const std::string& where,
                       std::vector<uint32_t>& ids, std::vector<uint8_t>& mask);

}  // namespace mt::data
