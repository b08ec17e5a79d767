// Chat role templates, chat and pre-tokenized records, and `build_shards` with those formats. The expected
// texts are what transformers 4.46.3's apply_chat_template renders for the same messages from each family's
// chat_template (tests/python/test_chat_templates.py checks the templates against transformers live).
#include <catch2/catch.hpp>

#include <filesystem>

#include "data/chat_template.hpp"
#include "data/dataset_builder.hpp"
#include "data/shard.hpp"
#include "test_util.hpp"

using namespace mt::data;
using namespace mt::data::test;
using json = nlohmann::json;

namespace {

const json kRecord = json::parse(R"({"messages": [
  {"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi\n"},
  {"role": "assistant", "content": "\nHello!\u00a0"}, {"role": "user", "content": "Again"},
  {"role": "assistant", "content": "\n\nBye"}]})");

std::string trained_text(const RenderedChat& c) {
  std::string out;
  for (const auto& [b, e] : c.trained) out += c.text.substr(b, e - b);
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("built-in chat templates render as transformers' apply_chat_template") {
  const RenderedChat q = render_chat(ChatTemplate::load("qwen3"), kRecord, "r:1");
  CHECK(q.text ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi\n<|im_end|>\n<|im_start|>assistant\n\nHello!"
        "\u00a0<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nBye"
        "<|im_end|>\n");
  // Trained: each answer and its end token; the final answer's empty think block with it, as Qwen3 writes it.
  CHECK(trained_text(q) == "\nHello!\u00a0<|im_end|><think>\n\n</think>\n\nBye<|im_end|>");

  // Llama-3 trims with Python's str.strip(): U+00A0 is whitespace there.
  const RenderedChat l = render_chat(ChatTemplate::load("llama3"), kRecord, "r:1");
  CHECK(l.text ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
        "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAgain<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
        "\n\nBye<|eot_id|>");
  CHECK(trained_text(l) == "Hello!<|eot_id|>Bye<|eot_id|>");

  json no_system = kRecord;
  no_system["messages"].erase(0);
  const RenderedChat m = render_chat(ChatTemplate::load("mistral"), no_system, "r:1");
  CHECK(m.text == "<s>[INST]  Hi\n [/INST]\nHello!\u00a0</s>[INST] Again [/INST]\n\nBye</s>");
  CHECK(trained_text(m) == "\nHello!\u00a0</s>\n\nBye</s>");
}

TEST_CASE("encode_chat: the whole text's ids, mask 1 on the tokens of the answers") {
  const Tokenizer qwen = Tokenizer::from_hf_json(shared("qwen3-tokenizer/tokenizer.json"));
  const json rec = json::parse(R"({"messages": [{"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello there."}, {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Goodbye."}]})");
  const RenderedChat c = render_chat(ChatTemplate::for_tokenizer(qwen), rec, "r:1");
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  encode_chat(qwen, c, "r:1", ids, mask);
  CHECK(ids == qwen.encode(c.text));
  REQUIRE(mask.size() == ids.size());
  std::vector<uint32_t> trained;
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (mask[i]) trained.push_back(ids[i]);
  CHECK(qwen.decode(trained) == trained_text(c));
  CHECK(qwen.decode(trained) == "Hello there.<|im_end|><think>\n\n</think>\n\nGoodbye.<|im_end|>");
}

TEST_CASE("chat records and templates: errors name the record and the field") {
  const ChatTemplate q = ChatTemplate::load("qwen3");
  auto render = [&](const char* text) { return error_of([&] { render_chat(q, json::parse(text), "f.jsonl:7"); }); };
  CHECK(render(R"({"messages": [{"role": "user", "content": "a"}]})") ==
        "f.jsonl:7: no assistant turn in 'messages' (the loss covers assistant turns only)");
  CHECK(render(R"({"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]})") ==
        "f.jsonl:7: messages[1]: unknown role 'bot' (template qwen3 knows assistant, system, user)");
  CHECK(render(R"({"messages": [{"role": "user"}, {"role": "assistant", "content": "b"}]})") ==
        "f.jsonl:7: messages[0] has no 'content'");
  CHECK(render(R"({"messages": [{"role": "user", "content": 3}]})") ==
        "f.jsonl:7: messages[0].content is not a string");
  CHECK(render(R"({"messages": [{"role": "user", "content": "a", "name": "x"}]})") ==
        "f.jsonl:7: messages[0]: field 'name' is not supported (role and content only)");
  CHECK(render(R"({"messages": [{"role": "assistant", "content": "a"}]})") ==
        "f.jsonl:7: messages[0] is an assistant turn: a conversation starts with a prompt");
  CHECK(render(R"({"text": "a"})") == "f.jsonl:7: record has no field 'messages'");
  CHECK_THAT(
      render(
          R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>x</think>y"}]})"),
      Catch::Contains("messages[1].content holds '</think>'"));
  CHECK(error_of([] {
          render_chat(ChatTemplate::load("mistral"), json::parse(R"({"messages": [{"role": "user", "content": "a"},
            {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]})"),
                      "m:2");
        }) ==
        "m:2: messages[1]: role 'user' where template mistral expects 'assistant' (its roles alternate from the "
        "first message)");

  auto parse = [](const char* text) { return error_of([&] { ChatTemplate::parse(text, "t.json"); }); };
  CHECK_THAT(parse("{\"roles\": "), Catch::StartsWith("t.json: chat template is not valid JSON"));
  CHECK(parse(R"({"roles": {"user": {}}})") == "t.json: roles has no 'assistant' (what the loss covers)");
  CHECK(parse(R"({"roles": {"assistant": {"prefix": 1}}})") == "t.json: roles.assistant.prefix is not a string");
  CHECK(parse(R"({"roles": {"assistant": {"start": ""}}})") ==
        "t.json: roles.assistant: unknown field 'start' (prefix, end, suffix)");
  CHECK(parse(R"({"roles": {"assistant": {}}, "bos": ""})") == "t.json: unknown field 'bos' in the chat template");
  CHECK(parse(R"({"roles": {"assistant": {}}, "alternate": ["user"]})") ==
        "t.json: alternate names role 'user', which roles lacks");
  CHECK_THAT(error_of([] { ChatTemplate::load("chatgpt"); }),
             Catch::Contains("'chatgpt': not a built-in one (qwen3, llama3, mistral)"));
}

TEST_CASE("pre-tokenized records: Hugging Face's labels and attention_mask") {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  read_token_record(json::parse(R"({"input_ids": [5, 6, 7, 8, 0], "labels": [-100, 6, -100, 8, -100],
                                    "attention_mask": [1, 1, 1, 1, 0]})"),
                    100, "f:3", ids, mask);
  CHECK(ids == std::vector<uint32_t>{5, 6, 7, 8});  // padding dropped
  CHECK(mask == std::vector<uint8_t>{0, 1, 0, 1});
  ids.clear();
  mask.clear();
  read_token_record(json::parse(R"({"input_ids": [1, 2]})"), 100, "f:3", ids, mask);
  CHECK(mask == std::vector<uint8_t>{1, 1});
  auto err = [](const char* text) {
    return error_of([&] {
      std::vector<uint32_t> i;
      std::vector<uint8_t> m;
      read_token_record(json::parse(text), 100, "f:3", i, m);
    });
  };
  CHECK(err(R"({"input_ids": [1, 2], "labels": [1]})") == "f:3: field 'labels' has 1 entries, 'input_ids' has 2");
  CHECK_THAT(err(R"({"input_ids": [1, 2], "labels": [1, 3]})"),
             Catch::StartsWith("f:3: labels[1] = 3 is neither -100 nor input_ids[1] = 2"));
  CHECK(err(R"({"input_ids": [1, 2], "attention_mask": [1, 2]})") == "f:3: attention_mask[1] = 2 (0 or 1 expected)");
  CHECK(err(R"({"input_ids": [1, 100]})") == "f:3: input_ids[1] = 100 is outside the tokenizer's vocabulary of 100");
  CHECK(err(R"({"input_ids": [1, "a"]})") == "f:3: input_ids[1] is not an integer");
  CHECK(err(R"({"labels": [1]})") == "f:3: record has no field 'input_ids'");
}

TEST_CASE("build_shards --format chat and pre-tokenized JSONL: ids as given, the mask beside, no separator") {
  const Tokenizer qwen = Tokenizer::from_hf_json(shared("qwen3-tokenizer/tokenizer.json"));
  TempDir d;
  spit(d / "chat.jsonl", kRecord.dump() + "\n" + kRecord.dump() + "\n");
  BuildOptions o;
  o.inputs = {d / "chat.jsonl"};
  o.out_dir = d / "chat";
  o.format = InputFormat::Chat;
  o.chat = ChatTemplate::load("qwen3");
  o.threads = 2;
  build_shards(qwen, o);
  std::vector<uint32_t> one;
  std::vector<uint8_t> one_mask;
  encode_chat(qwen, render_chat(o.chat, kRecord, "x"), "x", one, one_mask);
  std::vector<uint32_t> both = one;
  both.insert(both.end(), one.begin(), one.end());
  CHECK(read_shard(d / "chat/train_000000.bin") == both);
  const TokenShard shard = TokenShard::open(d / "chat/train_000000.bin");
  REQUIRE(shard.has_mask());
  for (std::size_t i = 0; i < both.size(); ++i) CHECK(shard.mask(i) == one_mask[i % one.size()]);
  CHECK_THAT(slurp(d / "chat/dataset.json"), Catch::Contains("\"chat_template\": \"qwen3\""));

  spit(d / "ids.jsonl", "{\"input_ids\": [3, 4, 5], \"labels\": [-100, 4, 5]}\n{\"input_ids\": [6]}\n");
  o.inputs = {d / "ids.jsonl"};
  o.out_dir = d / "ids";
  o.format = InputFormat::Jsonl;
  build_shards(qwen, o);
  CHECK(read_shard(d / "ids/train_000000.bin") == std::vector<uint32_t>{3, 4, 5, 6});
  const TokenShard ids = TokenShard::open(d / "ids/train_000000.bin");
  CHECK((ids.mask(0) == 0 && ids.mask(1) == 1 && ids.mask(2) == 1 && ids.mask(3) == 1));
  CHECK_THAT(slurp(d / "ids/dataset.json"), Catch::Contains("\"format\": \"jsonl-tokens\""));

  // A bad record: the error names it, and no shard is left (those this run committed are removed).
  spit(d / "bad.jsonl", kRecord.dump() + "\n{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n");
  o.inputs = {d / "bad.jsonl"};
  o.out_dir = d / "chat";
  o.format = InputFormat::Chat;
  o.shard_tokens = 10;  // several shards committed before the error
  CHECK(error_of([&] { build_shards(qwen, o); }) ==
        d / "bad.jsonl:2: no assistant turn in 'messages' (the loss covers assistant turns only)");
  for (const auto& e : std::filesystem::directory_iterator(d / "chat"))
    CHECK(e.path().filename().string().rfind("train_", 0) != 0);
}
