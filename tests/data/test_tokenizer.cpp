// Tokenizer exactness against Hugging Face `tokenizers` (fixtures made by make_fixtures.py and, for the
// full corpora, hf_compare.py run at test time with the test venv), round trips and bad input.
#include <catch2/catch.hpp>

#include <thread>

#include <nlohmann/json.hpp>

#include "data/tokenizer.hpp"
#include "tests/data/test_util.hpp"

using namespace mt::data;
using namespace mt::data::test;
using json = nlohmann::json;

namespace {

const json& fixtures() {
  static const json j = json::parse(slurp_gz(source("tests/data/fixtures/hf_ids.json.gz")));
  return j;
}

const Tokenizer& gpt2() {
  static const Tokenizer t = Tokenizer::from_gpt2(shared("gpt2-bpe/encoder.json"), shared("gpt2-bpe/vocab.bpe"));
  return t;
}

const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::from_hf_json(shared("qwen3-tokenizer/tokenizer.json"));
  return t;
}

std::string corpus_prefix(const std::string& name, std::size_t bytes) {
  std::string s = slurp(shared("corpus/" + name + ".txt")).substr(0, bytes);
  return s.substr(0, s.rfind('\n') + 1);
}

void check_against_fixtures(const Tokenizer& tok, const std::string& name, bool nfc) {
  const json& f = fixtures();
  const json& ids = f["ids"][name];
  const auto& hard = f["hard"];
  for (std::size_t i = 0; i < hard.size(); ++i) {
    const std::string s = hard[i].get<std::string>();
    INFO(name << " hard string " << i << ": " << json(s).dump());
    const auto want = ids["hard"][i].get<std::vector<uint32_t>>();
    const auto got = tok.encode(s);
    CHECK(got == want);
    // decode(encode(x)) == x whenever NFC leaves x unchanged (fixtures with combining marks are not NFC).
    const bool nfc_exempt = nfc && (s.find("\xCC\x81") != std::string::npos || s.find("\xCC\x8A") != std::string::npos);
    if (!nfc_exempt) CHECK(tok.decode(got) == s);
  }
  for (const char* c : {"austen", "mobydick"}) {
    INFO(name << " corpus " << c);
    const std::string text = corpus_prefix(c, f["prefix_bytes"].get<std::size_t>());
    const auto want = ids[c].get<std::vector<uint32_t>>();
    const auto got = tok.encode(text);
    REQUIRE(got.size() == want.size());
    CHECK(got == want);
    CHECK(tok.decode(got) == text);
  }
}

// Our ids for a whole file, compared at test time by HF tokenizers in the test venv.
void check_full_corpus(const Tokenizer& tok, const std::string& spec, const std::string& corpus) {
  TempDir dir;
  const std::string text = slurp(shared("corpus/" + corpus + ".txt"));
  const auto ids = tok.encode(text);
  CHECK(tok.decode(ids) == text);
  spit(dir / "ids.bin", std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
  std::string out;
  const int rc = run(std::string(MEGATRAIN_VENV_PYTHON) + " " + source("tests/data/hf_compare.py") + " '" + spec +
                         "' '" + shared("corpus/" + corpus + ".txt") + "' '" + (dir / "ids.bin") + "'",
                     &out);
  INFO(out);
  CHECK(rc == 0);
}

}  // namespace

TEST_CASE("GPT-2 encoder.json + vocab.bpe matches HF tokenizers on hard strings and corpus prefixes", "[tokenizer]") {
  CHECK(gpt2().vocab_size() == 50257);
  CHECK(gpt2().eot_id() == 50256u);
  check_against_fixtures(gpt2(), "gpt2", false);
}

TEST_CASE("Qwen3 tokenizer.json matches HF tokenizers on hard strings and corpus prefixes", "[tokenizer]") {
  CHECK(qwen3().eot_id() == 151643u);
  check_against_fixtures(qwen3(), "qwen3", true);
}

TEST_CASE("full corpora match HF tokenizers run now (test venv)", "[tokenizer][hf]") {
  for (const char* c : {"austen", "mobydick"}) {
    check_full_corpus(gpt2(), shared("gpt2-bpe"), c);
    check_full_corpus(qwen3(), shared("qwen3-tokenizer/tokenizer.json"), c);
  }
}

TEST_CASE("very long words (letter, digit and space runs) match HF and stay fast", "[tokenizer][hf]") {
  TempDir dir;
  std::string text = std::string(100000, 'x') + " " + std::string(50000, ' ') + "y" + std::string(20000, '9') + "\n";
  uint32_t r = 12345;
  for (int i = 0; i < 60000; ++i) {
    r = r * 1103515245u + 12345u;
    text += char('a' + (r >> 16) % 26);
  }
  text += std::string(3000, '\n') + "end";
  spit(dir / "long.txt", text);
  for (const Tokenizer* tok : {&gpt2(), &qwen3()}) {
    const auto ids = tok->encode(text);
    CHECK(tok->decode(ids) == text);
    spit(dir / "ids.bin", std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
    std::string out;
    const std::string spec = tok == &gpt2() ? shared("gpt2-bpe") : shared("qwen3-tokenizer/tokenizer.json");
    const int rc = run(std::string(MEGATRAIN_VENV_PYTHON) + " " + source("tests/data/hf_compare.py") + " '" + spec +
                           "' '" + (dir / "long.txt") + "' '" + (dir / "ids.bin") + "'",
                       &out);
    INFO(out);
    CHECK(rc == 0);
  }
}

TEST_CASE("special tokens: honoured by default, plain text on request", "[tokenizer]") {
  const auto with = gpt2().encode("a<|endoftext|>b");
  CHECK(with == std::vector<uint32_t>{64, 50256, 65});
  const auto without = gpt2().encode("a<|endoftext|>b", false);
  CHECK(std::find(without.begin(), without.end(), 50256u) == without.end());
  CHECK(gpt2().decode(without) == "a<|endoftext|>b");
  CHECK(gpt2().decode(with, true) == "ab");
  const auto im = qwen3().encode("<|im_start|>x<|im_end|>");
  CHECK(im.front() == 151644u);
  CHECK(im.back() == 151645u);
}

TEST_CASE("encode is thread-safe and gives the same ids on every thread", "[tokenizer]") {
  const std::string text = corpus_prefix("austen", 200000);
  const auto want = gpt2().encode(text);
  std::vector<std::vector<uint32_t>> got(4);
  std::vector<std::thread> ts;
  ts.reserve(4);
  for (int i = 0; i < 4; ++i) ts.emplace_back([&, i] { got[std::size_t(i)] = gpt2().encode(text); });
  for (auto& t : ts) t.join();
  for (const auto& g : got) CHECK(g == want);
}

TEST_CASE("invalid UTF-8 input is an error naming the byte offset", "[tokenizer][errors]") {
  CHECK(find_invalid_utf8("abc") == std::string::npos);
  CHECK(find_invalid_utf8("ab\xC3") == 2);
  CHECK(find_invalid_utf8("ab\xC0\x80") == 2);     // overlong
  CHECK(find_invalid_utf8("x\xED\xA0\x80") == 1);  // surrogate
  CHECK(find_invalid_utf8("12345678\xF5\x80\x80\x80") == 8);
  CHECK_THROWS_WITH(gpt2().encode(std::string("hello \xFF world")), Catch::Contains("byte offset 6"));
}

TEST_CASE("malformed or unsupported tokenizer.json is a clear error", "[tokenizer][errors]") {
  const std::string base = R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},
    "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true}})";
  const Tokenizer ok = Tokenizer::from_hf_json_text(base, "ok.json");
  CHECK(ok.encode("ab") == std::vector<uint32_t>{2});
  CHECK_THROWS_WITH(Tokenizer::from_hf_json_text("{\"model\": [1,", "t.json"),
                    Catch::Contains("t.json: not valid JSON"));
  CHECK_THROWS_WITH(Tokenizer::from_hf_json_text(R"({"model":{"type":"WordPiece","vocab":{}}})", "wp.json"),
                    Catch::Contains("wp.json: unsupported model type 'WordPiece'"));
  CHECK_THROWS_WITH(
      Tokenizer::from_hf_json_text(
          R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Metaspace"}})", "ms.json"),
      Catch::Contains("ms.json: unsupported pre_tokenizer type 'Metaspace'"));
  CHECK_THROWS_WITH(
      Tokenizer::from_hf_json_text(
          R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"normalizer":{"type":"NFKD"}})", "n.json"),
      Catch::Contains("n.json: unsupported normalizer type 'NFKD'"));
  CHECK_THROWS_WITH(
      Tokenizer::from_hf_json_text(R"({"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]}})", "m.json"),
      Catch::Contains("m.json: merge 0 ('a b'): token 'ab' is not in the vocabulary"));
  CHECK_THROWS_WITH(Tokenizer::from_hf_json_text(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},
      "pre_tokenizer":{"type":"Split","pattern":{"Regex":"(unclosed"},"behavior":"Isolated","invert":false}})",
                                                 "r.json"),
                    Catch::Contains("r.json: cannot compile regex"));
  CHECK_THROWS_WITH(Tokenizer::from_hf_json("/nonexistent/tokenizer.json"),
                    Catch::Contains("/nonexistent/tokenizer.json: cannot open"));
  CHECK_THROWS_WITH(gpt2().decode(std::vector<uint32_t>{1, 999999}), Catch::Contains("cannot decode id 999999"));
  TempDir empty;
  CHECK_THROWS_WITH(Tokenizer::load(empty.path), Catch::Contains("neither tokenizer.json nor encoder.json"));
  CHECK(Tokenizer::load(shared("qwen3-tokenizer")).vocab_size() == qwen3().vocab_size());
}
