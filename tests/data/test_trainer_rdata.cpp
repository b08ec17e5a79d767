// The BPE trainer (its tokenizer.json loads in Hugging Face tokenizers and encodes identically there)
// and the R data extractor (the demo corpus comes out byte for byte).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "data/bpe_trainer.hpp"
#include "data/rdata.hpp"
#include "data/tokenizer.hpp"
#include "tests/data/test_util.hpp"

using namespace mt::data;
using namespace mt::data::test;

TEST_CASE("janeaustenr's R data gives the novels byte for byte", "[rdata]") {
  const auto books = read_janeaustenr();
  REQUIRE(books.size() == 6);
  CHECK(books[0].name == "emma");
  CHECK(books[5].name == "sensesensibility");
  CHECK(books[0].values.size() == 16235);
  CHECK(janeaustenr_text() == slurp(shared("corpus/austen.txt")));
}

TEST_CASE("bad R data files are errors naming the file", "[rdata][errors]") {
  TempDir d;
  spit(d / "x.rdx", "not gzip at all");
  spit(d / "x.rdb", "");
  CHECK_THROWS_WITH(read_r_lazyload_strings(d / "x"), Catch::Contains("x.rdx"));
  CHECK_THROWS_WITH(read_r_lazyload_strings(d / "missing"), Catch::Contains("missing.rdx: cannot open"));
  spit(d / "t.rds", std::string("X\n\x00\x00", 4));  // explicit length: keep the NUL bytes
  CHECK_THROWS_WITH(read_rds_strings(d / "t.rds"), Catch::Contains("t.rds: truncated data at offset"));
}

TEST_CASE("trained tokenizer: deterministic, exact round trip, HF tokenizers encodes identically", "[trainer][hf]") {
  TempDir d;
  const std::string text = slurp(shared("corpus/austen.txt"));
  BpeTrainerOptions o;
  o.vocab_size = 2048;
  std::string json1, json2;
  BpeTrainStats st;
  {
    BpeTrainer t(o);
    t.add_text(text);
    json1 = t.train(&st);
  }
  {
    BpeTrainer t(o);
    t.add_text(text);
    json2 = t.train();
  }
  CHECK(json1 == json2);
  CHECK(st.vocab_size == 2048);
  CHECK(st.merges == 2048 - 256 - 1);
  spit(d / "tokenizer.json", json1);
  const Tokenizer tok = Tokenizer::from_hf_json(d / "tokenizer.json");
  CHECK(tok.vocab_size() == 2048);
  CHECK(tok.eot_id() == 2047u);
  for (const char* corpus : {"austen", "mobydick"}) {
    const std::string c = slurp(shared(std::string("corpus/") + corpus + ".txt"));
    const auto ids = tok.encode(c);
    CHECK(ids.size() < c.size() / 2);  // it compresses
    CHECK(tok.decode(ids) == c);
    spit(d / "ids.bin", std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
    std::string out;
    const int rc = run(std::string(MEGATRAIN_VENV_PYTHON) + " " + source("tests/data/hf_compare.py") + " '" +
                           (d / "tokenizer.json") + "' '" + shared(std::string("corpus/") + corpus + ".txt") + "' '" +
                           (d / "ids.bin") + "'",
                       &out);
    INFO(out);
    CHECK(rc == 0);
  }
}

TEST_CASE("trainer variants (Llama-3 / Qwen2 regexes, ignore_merges, add_prefix_space) agree with HF",
          "[trainer][hf]") {
  // Hard strings from the fixtures, joined, plus a slice of Moby Dick.
  const auto fx = nlohmann::json::parse(slurp_gz(source("tests/data/fixtures/hf_ids.json.gz")));
  const std::string text = slurp(shared("corpus/mobydick.txt"));
  std::string sample = text.substr(0, 150000);
  for (const auto& h : fx["hard"]) sample += h.get<std::string>() + "\n<|im_start|>";
  sample += "<|endoftext|>";
  struct Variant {
    const char* name;
    const char* pattern;
    bool ignore_merges, prefix_space, strip_tokens = false;
  };
  for (const Variant& v : {Variant{"llama3", kLlama3SplitPattern, false, false},
                           Variant{"qwen2+ignore_merges", kQwen2SplitPattern, true, false},
                           Variant{"gpt2+ignore_merges", kGpt2SplitPattern, true, false},
                           Variant{"gpt2+prefix_space", kGpt2SplitPattern, false, true},
                           Variant{"gpt2+lstrip/rstrip added tokens", kGpt2SplitPattern, false, false, true}}) {
    INFO("variant " << v.name);
    TempDir d;
    BpeTrainerOptions o;
    o.vocab_size = 800;
    o.split_pattern = v.pattern;
    o.special_tokens = {"<|endoftext|>", "<|im_start|>"};
    BpeTrainer t(o);
    t.add_text(text);
    auto j = nlohmann::json::parse(t.train());
    j["model"]["ignore_merges"] = v.ignore_merges;
    if (v.prefix_space) j["pre_tokenizer"]["add_prefix_space"] = true;
    std::string extra;
    if (v.strip_tokens) {
      j["added_tokens"].push_back({{"id", 800},
                                   {"content", "<mask>"},
                                   {"single_word", false},
                                   {"lstrip", true},
                                   {"rstrip", false},
                                   {"normalized", false},
                                   {"special", false}});
      j["added_tokens"].push_back({{"id", 801},
                                   {"content", "<|sep|>"},
                                   {"single_word", false},
                                   {"lstrip", false},
                                   {"rstrip", true},
                                   {"normalized", false},
                                   {"special", true}});
      extra = "a  <mask> b <mask>c\n\n<mask>\t<|sep|>   d <|sep|>\ne<|sep|>";
    }
    spit(d / "tokenizer.json", j.dump());
    const Tokenizer tok = Tokenizer::from_hf_json(d / "tokenizer.json");
    spit(d / "sample.txt", sample + extra);
    const auto ids = tok.encode(sample + extra);
    if (!v.prefix_space && !v.strip_tokens) CHECK(tok.decode(ids) == sample);
    spit(d / "ids.bin", std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
    std::string out;
    const int rc = run(std::string(MEGATRAIN_VENV_PYTHON) + " " + source("tests/data/hf_compare.py") + " '" +
                           (d / "tokenizer.json") + "' '" + (d / "sample.txt") + "' '" + (d / "ids.bin") + "'",
                       &out);
    INFO(out);
    CHECK(rc == 0);
  }
  CHECK_THROWS_WITH(BpeTrainer(BpeTrainerOptions{100, {"<|endoftext|>"}, "", 2}),
                    Catch::Contains("vocab_size 100 is below 257"));
}
