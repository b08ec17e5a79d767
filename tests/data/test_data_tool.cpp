// megatrain-data (the binary) and the dataset builder: text / JSONL / instruction records to shards that
// read back bit-exactly, the same for any thread count; loss masks; train/val split; bad input errors
// naming file and line; nothing partial left behind.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "data/dataset_builder.hpp"
#include "data/loader.hpp"
#include "data/shard.hpp"
#include "data/tokenizer.hpp"
#include "tests/data/test_util.hpp"

using namespace mt::data;
using namespace mt::data::test;

namespace {
const std::string kTool = MEGATRAIN_DATA_TOOL;

const Tokenizer& gpt2() {
  static const Tokenizer t = Tokenizer::load(shared("gpt2-bpe"));
  return t;
}

std::vector<uint32_t> read_all_shards(const std::string& dir, const std::string& split) {
  std::vector<uint32_t> all;
  for (int i = 0;; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "/%s_%06d.bin", split.c_str(), i);
    std::string out;
    if (run("test -f '" + dir + name + "'") != 0) break;
    const auto v = read_shard(dir + name);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// Qwen3's tokenizer.json with <|begin_of_text|> added (id 151669) and a post-processor whose single
// template is `single` (template pieces, "$A" for the text): a real vocabulary with a Llama-3- or OLMo-style
// template, written without Python.
std::string qwen3_with_template(const TempDir& d, const std::string& name, const std::vector<std::string>& single) {
  static const nlohmann::json base = nlohmann::json::parse(slurp(shared("qwen3-tokenizer/tokenizer.json")));
  nlohmann::json j = base;
  j["added_tokens"].push_back({{"id", 151669},
                               {"content", "<|begin_of_text|>"},
                               {"single_word", false},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", false},
                               {"special", true}});
  nlohmann::json pieces = nlohmann::json::array(), specials = nlohmann::json::object();
  for (const auto& p : single) {
    if (p == "$A") {
      pieces.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
      continue;
    }
    pieces.push_back({{"SpecialToken", {{"id", p}, {"type_id", 0}}}});
    specials[p] = {{"id", p}, {"ids", {p == "<|begin_of_text|>" ? 151669 : 151643}}, {"tokens", {p}}};
  }
  j["post_processor"] = {
      {"type", "TemplateProcessing"}, {"single", pieces}, {"pair", pieces}, {"special_tokens", specials}};
  spit(d / name, j.dump());
  return d / name;
}

std::string ls(const std::string& dir) {
  std::string out;
  run("ls '" + dir + "'", &out);
  return out;
}
}  // namespace

TEST_CASE("cutting large texts for the workers leaves the ids unchanged", "[tool]") {
  const Tokenizer qwen = Tokenizer::from_hf_json(shared("qwen3-tokenizer/tokenizer.json"));
  for (const char* c : {"austen", "mobydick"}) {
    const std::string text = slurp(shared(std::string("corpus/") + c + ".txt")).substr(0, 600000);
    for (const Tokenizer* tok : {&gpt2(), &qwen}) {
      REQUIRE(tok->splits_at_letter_spaces());
      const auto pieces = split_for_parallel(*tok, text, 20000);
      CHECK(pieces.size() > 20);
      std::vector<uint32_t> joined;
      std::size_t bytes = 0;
      for (auto p : pieces) {
        tok->encode(p, joined);
        bytes += p.size();
      }
      CHECK(bytes == text.size());
      CHECK(joined == tok->encode(text));
    }
  }
}

TEST_CASE("text files to shards: exact ids, end-of-text separators, same bytes for 1 and 2 threads", "[tool]") {
  TempDir d;
  const std::string a = shared("corpus/austen.txt"), m = shared("corpus/mobydick.txt");
  std::string out;
  for (int t : {1, 2}) {
    const std::string dir = d / ("t" + std::to_string(t));
    const int rc =
        run(kTool + " shards --tokenizer " + shared("gpt2-bpe") + " --out " + dir + " --threads " + std::to_string(t) +
                " --chunk-bytes 50000 --shard-tokens 300000 --no-progress " + a + " " + m,
            &out);
    INFO(out);
    REQUIRE(rc == 0);
    CHECK(out.find("2 documents") != std::string::npos);
  }
  // Each shard's documents beside it (data.packing = documents).
  CHECK(ls(d / "t1") ==
        "dataset.json\ntrain_000000.bin\ntrain_000000.docs\ntrain_000001.bin\ntrain_000001.docs\ntrain_000002.bin\n"
        "train_000002.docs\ntrain_000003.bin\ntrain_000003.docs\ntrain_000004.bin\ntrain_000004.docs\n");
  {  // a rerun into the same directory with fewer shards leaves no stale ones behind
    spit(d / "t1/notes.txt", "kept");
    BuildOptions o;
    o.inputs = {m};
    o.out_dir = d / "t1r";
    REQUIRE(run("cp -r '" + (d / "t1") + "' '" + (d / "t1r") + "'") == 0);
    build_shards(gpt2(), o);
    CHECK(ls(d / "t1r") == "dataset.json\nnotes.txt\ntrain_000000.bin\ntrain_000000.docs\n");
    spit(d / "t1/notes.txt", "");
    REQUIRE(run("rm '" + (d / "t1/notes.txt") + "'") == 0);
  }
  for (int i = 0; i < 5; ++i) {
    const std::string n = "/train_00000" + std::to_string(i) + ".bin";
    CHECK(slurp(d / "t1" + n) == slurp(d / "t2" + n));
  }
  std::vector<uint32_t> want = gpt2().encode(slurp(a));
  want.push_back(50256);
  const auto mm = gpt2().encode(slurp(m));
  want.insert(want.end(), mm.begin(), mm.end());
  want.push_back(50256);
  CHECK(read_all_shards(d / "t1", "train") == want);
  const auto meta = nlohmann::json::parse(slurp(d / "t1/dataset.json"));
  CHECK(meta["tokens"]["train"] == want.size());
  CHECK(meta["eot_id"] == 50256);
  CHECK(meta["token_bytes"] == 2);
}

TEST_CASE("reading in small blocks gives the same shards (streaming large files)", "[tool]") {
  TempDir d;
  std::string jsonl;
  const std::string text = slurp(shared("corpus/mobydick.txt")).substr(0, 300000);
  for (std::size_t p = 0; p < text.size(); p += 1000)
    jsonl += nlohmann::json{{"text", text.substr(p, 1000)}}.dump() + "\n";
  spit(d / "m.jsonl", jsonl);
  for (InputFormat fmt : {InputFormat::Text, InputFormat::Jsonl}) {
    BuildOptions big, small;
    big.inputs = small.inputs = {fmt == InputFormat::Text ? shared("corpus/austen.txt") : d / "m.jsonl",
                                 shared("corpus/mobydick.txt")};
    if (fmt == InputFormat::Jsonl) big.inputs = small.inputs = {d / "m.jsonl", d / "m.jsonl"};
    big.format = small.format = fmt;
    big.val_fraction = small.val_fraction = 0.2;
    big.threads = 1;
    small.threads = 2;
    small.block_bytes = 70000;
    small.chunk_bytes = 9000;
    big.out_dir = d / "big";
    small.out_dir = d / "small";
    const BuildSummary a = build_shards(gpt2(), big), b = build_shards(gpt2(), small);
    CHECK(a.documents == b.documents);
    CHECK(a.train_documents == b.train_documents);
    CHECK(a.tokens == b.tokens);
    CHECK(read_all_shards(d / "big", "train") == read_all_shards(d / "small", "train"));
    CHECK(read_all_shards(d / "big", "val") == read_all_shards(d / "small", "val"));
  }
  // An invalid byte deep in a file read in blocks is still reported at its line and column.
  std::string bad = text.substr(0, 200000);
  bad.insert(150000, "\xFF");
  spit(d / "bad.txt", bad);
  BuildOptions o;
  o.inputs = {d / "bad.txt"};
  o.out_dir = d / "bad";
  o.block_bytes = 30000;
  const std::string before = bad.substr(0, 150000);
  const std::size_t line = 1 + std::size_t(std::count(before.begin(), before.end(), '\n'));
  const std::size_t col = 150000 - before.rfind('\n');
  CHECK_THROWS_WITH(build_shards(gpt2(), o),
                    Catch::Contains("bad.txt:" + std::to_string(line) + ":" + std::to_string(col) +
                                    " (byte offset 150000): invalid UTF-8"));
}

TEST_CASE("JSONL with a text field, validation split, loader reads the shards", "[tool]") {
  TempDir d;
  std::string jsonl;
  for (int i = 0; i < 200; ++i)
    jsonl +=
        nlohmann::json{{"id", i},
                       {"body", "Document number " + std::to_string(i) + ". It is a truth universally acknowledged."}}
            .dump() +
        "\n";
  spit(d / "docs.jsonl", jsonl);
  std::string out;
  const int rc =
      run(kTool + " shards --tokenizer " + shared("gpt2-bpe") + " --out " + (d / "o") +
              " --format jsonl --text-field body --val-fraction 0.1 --seed 7 --no-progress " + (d / "docs.jsonl"),
          &out);
  INFO(out);
  REQUIRE(rc == 0);
  const auto meta = nlohmann::json::parse(slurp(d / "o/dataset.json"));
  const uint64_t val_docs = meta["documents"]["val"], train_docs = meta["documents"]["train"];
  CHECK(val_docs + train_docs == 200);
  CHECK(val_docs >= 8);
  CHECK(val_docs <= 35);
  const auto train = read_shard(d / "o/train_000000.bin"), val = read_shard(d / "o/val_000000.bin");
  CHECK(uint64_t(std::count(train.begin(), train.end(), 50256u)) == train_docs);
  CHECK(uint64_t(std::count(val.begin(), val.end(), 50256u)) == val_docs);
  LoaderOptions lo;
  lo.shards = {d / "o/train_*.bin"};
  lo.batch_size = 2;
  lo.seq_len = 32;
  lo.vocab_size = 50257;
  DataLoader dl(lo);
  const Batch b = dl.next();
  CHECK(b.loss_tokens == 64);
  // Each line is a document: its `.docs` starts are the first token of each line (after the previous
  // line's end-of-text token), and packing = documents reads them.
  const TokenShard s = TokenShard::open(d / "o/train_000000.bin", ShardFormat::Auto, true, true);
  std::size_t starts = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    starts += s.starts_document(i);
    CHECK(s.starts_document(i) == (i == 0 || train[i - 1] == 50256u));
  }
  CHECK(starts == train_docs);
  lo.documents = true;
  DataLoader docs(lo);
  const Batch bd = docs.next();
  CHECK(bd.positions.size() == 64);
  CHECK(bd.loss_tokens < 64);  // each document's end-of-text token predicts nothing
}

TEST_CASE("instruction records: template rendering and prompt tokens masked out of the loss", "[tool]") {
  TempDir d;
  spit(d / "sft.jsonl", R"({"instruction": "Name the heroine of Emma.", "input": "", "output": "Emma Woodhouse."})"
                        "\n"
                        R"({"instruction": "Translate", "input": "bonjour", "output": "hello"})"
                        "\n"
                        "\n"
                        R"({"prompt": "Who wrote Persuasion?", "response": "Jane Austen."})"
                        "\n");
  std::string out;
  const int rc = run(kTool + " shards --tokenizer " + shared("gpt2-bpe") + " --out " + (d / "o") +
                         " --format instruct --no-progress " + (d / "sft.jsonl"),
                     &out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(ls(d / "o") == "dataset.json\ntrain_000000.bin\ntrain_000000.docs\ntrain_000000.mask\n");
  const TokenShard s = TokenShard::open(d / "o/train_000000.bin");
  REQUIRE(s.has_mask());
  // Rebuild what the three records must be.
  const InstructTemplate t = InstructTemplate::alpaca();
  std::vector<uint32_t> want;
  std::vector<uint8_t> mask;
  auto add = [&](const std::string& prompt, const std::string& response) {
    auto p = gpt2().encode(prompt), r = gpt2().encode(response);
    want.insert(want.end(), p.begin(), p.end());
    mask.insert(mask.end(), p.size(), 0);
    want.insert(want.end(), r.begin(), r.end());
    mask.insert(mask.end(), r.size(), 1);
    want.push_back(50256);
    mask.push_back(1);
  };
  auto sub = [](std::string str, const std::string& k, const std::string& v) {
    const auto p = str.find(k);
    if (p != std::string::npos) str.replace(p, k.size(), v);
    return str;
  };
  add(sub(t.prompt_no_input, "{instruction}", "Name the heroine of Emma."), "Emma Woodhouse.");
  add(sub(sub(t.prompt, "{instruction}", "Translate"), "{input}", "bonjour"), "hello");
  add(sub(t.prompt_no_input, "{instruction}", "Who wrote Persuasion?"), "Jane Austen.");
  REQUIRE(s.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    REQUIRE(s[i] == want[i]);
    REQUIRE(s.mask(i) == mask[i]);
  }
  CHECK(gpt2().decode(want).find("### Response:\nhello<|endoftext|>") != std::string::npos);
}

TEST_CASE("bad input: clear errors naming file and line, and no shard left behind", "[tool][errors]") {
  TempDir d;
  spit(d / "good.txt", slurp(shared("corpus/mobydick.txt")));
  spit(d / "bad.jsonl", "{\"text\": \"fine\"}\n{\"other\": 1}\n");
  spit(d / "broken.jsonl", "{\"text\": \"fine\"}\n\n{\"text\": \"unterminated}\n");
  spit(d / "utf8.txt", "line one\nline \xC3\x28 two\n");
  std::string out;
  const std::string base = kTool + " shards --tokenizer " + shared("gpt2-bpe") + " --no-progress ";
  CHECK(run(base + "--out " + (d / "o1") + " --format jsonl " + (d / "bad.jsonl"), &out) == 1);
  CHECK_THAT(out, Catch::Contains("bad.jsonl:2: record has no field 'text'"));
  CHECK(run(base + "--out " + (d / "o2") + " --format jsonl " + (d / "broken.jsonl"), &out) == 1);
  CHECK_THAT(out, Catch::Contains("broken.jsonl:3: not valid JSON"));
  // A good text file first (committed in several shards), then a bad one: everything is removed.
  CHECK(run(base + "--out " + (d / "o3") + " --shard-tokens 100000 " + (d / "good.txt") + " " + (d / "utf8.txt"),
            &out) == 1);
  CHECK_THAT(out, Catch::Contains("utf8.txt:2:6 (byte offset 14): invalid UTF-8"));
  CHECK(ls(d / "o3") == "");
  CHECK(run(base + "--out " + (d / "o4") + " " + (d / "missing.txt"), &out) == 1);
  CHECK_THAT(out, Catch::Contains("missing.txt: no such input file"));
  spit(d / "bad_tok.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  CHECK(run(base + "--out " + (d / "o5") + " --tokenizer " + (d / "bad_tok.json") + " " + (d / "good.txt"), &out) == 1);
  CHECK_THAT(out, Catch::Contains("bad_tok.json: unsupported model type 'Unigram'"));
  CHECK(run(kTool + " shards --bogus", &out) == 2);
  CHECK(run(kTool + " inspect " + (d / "good.txt"), &out) == 1);
  CHECK_THAT(out, Catch::Contains("good.txt: not an llm.c shard"));
}

TEST_CASE("train-tokenizer, encode, decode and extract-austen commands", "[tool]") {
  TempDir d;
  std::string out;
  REQUIRE(run(kTool + " extract-austen --out " + (d / "austen.txt"), &out) == 0);
  CHECK(slurp(d / "austen.txt") == slurp(shared("corpus/austen.txt")));
  REQUIRE(run(kTool + " extract-austen --chapters --out " + (d / "austen.jsonl"), &out) == 0);
  const std::string jl = slurp(d / "austen.jsonl");
  CHECK(std::count(jl.begin(), jl.end(), '\n') > 250);
  REQUIRE(run(kTool + " train-tokenizer --vocab-size 1000 --out " + (d / "tok.json") + " " + (d / "austen.txt"),
              &out) == 0);
  CHECK_THAT(out, Catch::Contains("vocabulary 1000"));
  REQUIRE(run(kTool + " encode --tokenizer " + (d / "tok.json") + " 'Emma Woodhouse<|endoftext|>'", &out) == 0);
  const std::string ids = out.substr(0, out.find('\n'));
  CHECK(ids.substr(ids.rfind(' ') + 1) == "999");
  REQUIRE(run(kTool + " decode --tokenizer " + (d / "tok.json") + " " + ids, &out) == 0);
  CHECK(out == "Emma Woodhouse<|endoftext|>\n");
}

TEST_CASE("encode and shards wrap each document in the tokenizer's template, --no-add-special-tokens leaves it out",
          "[tool]") {
  TempDir d;
  const uint32_t bos = 151669, eot = 151643;
  const std::string llama = qwen3_with_template(d, "llama.json", {"<|begin_of_text|>", "$A"});
  const Tokenizer tok = Tokenizer::load(llama);
  REQUIRE(tok.eot_id() == eot);
  std::string out;
  auto line = [](const std::vector<uint32_t>& ids) {
    std::string s;
    for (uint32_t x : ids) s += (s.empty() ? "" : " ") + std::to_string(x);
    return s + "\n";
  };
  const auto hello = tok.encode("Hello world");
  REQUIRE(run(kTool + " encode --tokenizer " + llama + " 'Hello world'", &out) == 0);
  std::vector<uint32_t> want{bos};
  want.insert(want.end(), hello.begin(), hello.end());
  CHECK(out == line(want));
  REQUIRE(run(kTool + " encode --tokenizer " + llama + " --no-add-special-tokens 'Hello world'", &out) == 0);
  CHECK(out == line(hello));
  // Text documents cut into pieces for two threads: the template wraps the whole document, once.
  const std::string a = shared("corpus/austen.txt"), m = shared("corpus/mobydick.txt");
  const auto ia = tok.encode(slurp(a)), im = tok.encode(slurp(m));
  for (const bool on : {true, false}) {
    const std::string dir = d / (on ? "on" : "off");
    const int rc = run(kTool + " shards --tokenizer " + llama + " --out " + dir +
                           " --threads 2 --chunk-bytes 50000 --no-progress " + (on ? "" : "--no-add-special-tokens ") +
                           a + " " + m,
                       &out);
    INFO(out);
    REQUIRE(rc == 0);
    want.clear();
    for (const auto* ids : {&ia, &im}) {
      if (on) want.push_back(bos);
      want.insert(want.end(), ids->begin(), ids->end());
      want.push_back(eot);
    }
    CHECK(read_all_shards(dir, "train") == want);
    const auto meta = nlohmann::json::parse(slurp(dir + "/dataset.json"));
    CHECK(meta["add_special_tokens"] == on);
    CHECK(meta["template"]["before"] == (on ? nlohmann::json{bos} : nlohmann::json::array()));
  }
}

namespace {

// JSONL records `jsonl` made into shards under d/out (the template on or off); the train split's ids.
std::vector<uint32_t> shard_jsonl(const Tokenizer& tok, const TempDir& d, const std::string& jsonl,
                                  const std::string& out, bool add_special_tokens) {
  spit(d / (out + ".jsonl"), jsonl);
  BuildOptions o;
  o.inputs = {d / (out + ".jsonl")};
  o.out_dir = d / out;
  o.format = InputFormat::Jsonl;
  o.add_special_tokens = add_special_tokens;
  build_shards(tok, o);
  return read_all_shards(d / out, "train");
}

}  // namespace

TEST_CASE("a template that ends documents with the end-of-text token is not followed by a second one", "[tool]") {
  TempDir d;
  const uint32_t eot = 151643;
  const std::string olmo = qwen3_with_template(d, "olmo.json", {"$A", "<|endoftext|>"});
  const Tokenizer tok = Tokenizer::load(olmo);
  const std::vector<uint32_t> got =
      shard_jsonl(tok, d, "{\"text\": \"First document.\"}\n{\"text\": \"\"}\n{\"text\": \"Third.\"}\n", "o", true);
  std::vector<uint32_t> want;
  for (const char* t : {"First document.", "", "Third."}) {
    const auto ids = tok.encode(t);
    want.insert(want.end(), ids.begin(), ids.end());
    want.push_back(eot);
  }
  CHECK(got == want);
  CHECK(nlohmann::json::parse(slurp(d / "o/dataset.json"))["template"]["eot_appended"] == false);
  // Without the template the separator is appended as before: the same ids here.
  CHECK(shard_jsonl(tok, d, "{\"text\": \"First document.\"}\n{\"text\": \"\"}\n{\"text\": \"Third.\"}\n", "off",
                    false) == want);
}

TEST_CASE("a template that begins documents with the end-of-text token is not preceded by a second one", "[tool]") {
  TempDir d;
  const uint32_t eot = 151643;
  const std::string bos_eot = qwen3_with_template(d, "bos_eot.json", {"<|endoftext|>", "$A"});
  const Tokenizer tok = Tokenizer::load(bos_eot);
  const std::vector<uint32_t> got =
      shard_jsonl(tok, d, "{\"text\": \"First document.\"}\n{\"text\": \"Second.\"}\n", "o", true);
  std::vector<uint32_t> want;
  for (const char* t : {"First document.", "Second."}) {
    want.push_back(eot);
    const auto ids = tok.encode(t);
    want.insert(want.end(), ids.begin(), ids.end());
  }
  CHECK(got == want);
  CHECK(nlohmann::json::parse(slurp(d / "o/dataset.json"))["template"]["eot_appended"] == false);
}

TEST_CASE("the separator is the family's end-of-text token, not the first special token", "[tool]") {
  TempDir d;
  nlohmann::json j = nlohmann::json::parse(slurp(shared("qwen3-tokenizer/tokenizer.json")));
  // Llama-3's and Mistral's names in place of Qwen's <|endoftext|>, after a begin-of-text token.
  for (const char* name : {"<|end_of_text|>", "</s>"}) {
    nlohmann::json k = j;
    for (auto& t : k["added_tokens"])
      if (t["content"] == "<|endoftext|>") t["content"] = name;
    k["added_tokens"].insert(k["added_tokens"].begin(), nlohmann::json::object({{"id", 151669},
                                                                                {"content", "<|begin_of_text|>"},
                                                                                {"single_word", false},
                                                                                {"lstrip", false},
                                                                                {"rstrip", false},
                                                                                {"normalized", false},
                                                                                {"special", true}}));
    spit(d / "t.json", k.dump());
    INFO(name);
    CHECK(Tokenizer::load(std::string(d / "t.json")).eot_id() == std::optional<uint32_t>(151643));
  }
}

TEST_CASE("instruction records: the template's leading ids are masked with the prompt", "[tool]") {
  TempDir d;
  const std::string llama = qwen3_with_template(d, "llama.json", {"<|begin_of_text|>", "$A"});
  const Tokenizer tok = Tokenizer::load(llama);
  spit(d / "sft.jsonl", R"({"prompt": "Who wrote Emma?", "response": "Jane Austen."})"
                        "\n");
  BuildOptions o;
  o.inputs = {d / "sft.jsonl"};
  o.out_dir = d / "o";
  o.format = InputFormat::Instruct;
  o.instruct = InstructTemplate::plain();
  build_shards(tok, o);
  const TokenShard s = TokenShard::open(d / "o/train_000000.bin");
  REQUIRE(s.has_mask());
  const auto p = tok.encode("Who wrote Emma?\n"), r = tok.encode("Jane Austen.");
  REQUIRE(s.size() == 1 + p.size() + r.size() + 1);
  CHECK(s[0] == 151669u);
  CHECK(s.mask(0) == 0);
  CHECK(s.mask(p.size()) == 0);
  CHECK(s.mask(p.size() + 1) == 1);
  CHECK(s[s.size() - 1] == 151643u);
  CHECK(s.mask(s.size() - 1) == 1);
}

TEST_CASE("a template the shards cannot wrap documents in is an error, unless switched off", "[tool][errors]") {
  TempDir d;
  const Tokenizer tok = Tokenizer::load(qwen3_with_template(d, "twice.json", {"$A", "<|endoftext|>", "$A"}));
  spit(d / "a.txt", "Some text.");
  BuildOptions o;
  o.inputs = {d / "a.txt"};
  o.out_dir = d / "o";
  CHECK_THROWS_WITH(build_shards(tok, o), Catch::Contains("twice.json: post_processor's single template"));
  o.add_special_tokens = false;
  CHECK(build_shards(tok, o).tokens == tok.encode("Some text.").size() + 1);
}
