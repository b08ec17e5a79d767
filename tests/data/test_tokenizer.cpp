// Tokenizer exactness against Hugging Face `tokenizers` (fixtures made by make_fixtures.py and, for the
// full corpora, hf_compare.py run at test time with the test venv), round trips and bad input.
#include <catch2/catch.hpp>

#include <thread>
#include <tuple>

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

// Our ids against HF tokenizers' for the text of `text_file` (hf_compare.py in the test venv); `args`:
// --pair FILE (tokenizer(a, b)), --add-special-tokens (the post-processor's template).
void check_hf(const std::vector<uint32_t>& ids, const std::string& spec, const std::string& text_file,
              const std::string& args = "") {
  TempDir dir;
  spit(dir / "ids.bin", std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
  std::string out;
  const int rc = run(std::string(MEGATRAIN_VENV_PYTHON) + " " + source("tests/data/hf_compare.py") + " '" + spec +
                         "' '" + text_file + "' '" + (dir / "ids.bin") + "' " + args,
                     &out);
  INFO(out);
  CHECK(rc == 0);
}

// Our ids for a whole file, compared at test time by HF tokenizers in the test venv.
void check_full_corpus(const Tokenizer& tok, const std::string& spec, const std::string& corpus) {
  const std::string text = slurp(shared("corpus/" + corpus + ".txt"));
  const auto ids = tok.encode(text);
  CHECK(tok.decode(ids) == text);
  check_hf(ids, spec, shared("corpus/" + corpus + ".txt"));
}

// Exits 77, ctest's SKIP, when the test venv or its `tokenizers` is missing: the oracle is absent, so the
// test reports skipped, never passed.
void require_hf_tokenizers() {
  static const bool ok =
      std::system((std::string(MEGATRAIN_VENV_PYTHON) + " -c 'import tokenizers' 2>/dev/null").c_str()) == 0;
  if (ok) return;
  std::fprintf(stderr, "venv with tokenizers not found at %s (tools/install-deps --test): skipped\n",
               MEGATRAIN_VENV_PYTHON);
  std::exit(77);
}

// Llama-3-, Mistral-, OLMo-, BERT- and RoBERTa-style tokenizer.json files: GPT-2's vocabulary with each
// family's post-processor, written by HF tokenizers (make_template_tokenizers.py).
std::string template_tokenizer(const std::string& style) {
  static const TempDir dir;
  static const std::string made = [] {
    std::string out;
    const int rc = run(std::string(MEGATRAIN_VENV_PYTHON) + " " + source("tests/data/make_template_tokenizers.py") +
                           " '" + shared("gpt2-bpe") + "' '" + dir.path + "'",
                       &out);
    if (rc != 0) throw std::runtime_error("make_template_tokenizers.py failed: " + out);
    return dir.path;
  }();
  return made + "/" + style + ".json";
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

TEST_CASE("post-processor templates give HF's tokenizer(text) ids, and tokenizer(a, b) ids for pairs",
          "[tokenizer][hf]") {
  require_hf_tokenizers();
  TempDir d;
  const std::string a = d / "a.txt", b = d / "b.txt", empty = d / "empty.txt";
  spit(a, corpus_prefix("austen", 200000));
  spit(b, corpus_prefix("mobydick", 50000));
  spit(empty, "");
  const std::string ta = slurp(a), tb = slurp(b);
  // What each style puts around one text: HF checks the ids, these name the tokens.
  const std::vector<std::tuple<std::string, std::string, std::string>> styles{
      {"llama3-style", "<|begin_of_text|>", ""}, {"mistral-style", "<s>", ""},  {"mistral-eos", "<s>", "</s>"},
      {"olmo-style", "", "<|endoftext|>"},       {"bert-style", "<s>", "</s>"}, {"roberta-style", "<s>", "</s>"}};
  for (const auto& [style, bos, eos] : styles) {
    INFO(style);
    const std::string spec = template_tokenizer(style);
    const Tokenizer tok = Tokenizer::from_hf_json(spec);
    const auto plain = tok.encode(ta);
    const auto single = tok.encode_single(ta);
    REQUIRE(tok.single_affixes());
    std::vector<uint32_t> want;
    if (!bos.empty()) want.push_back(*tok.token_to_id(bos));
    want.insert(want.end(), plain.begin(), plain.end());
    if (!eos.empty()) want.push_back(*tok.token_to_id(eos));
    CHECK(single == want);
    check_hf(single, spec, a, "--add-special-tokens");
    check_hf(tok.encode_single(""), spec, empty, "--add-special-tokens");
    check_hf(tok.encode_pair(ta, tb), spec, a, "--pair '" + b + "' --add-special-tokens");
    // The off switch: HF's add_special_tokens=False, the text's ids alone.
    CHECK(tok.encode_single(ta, false) == plain);
    check_hf(tok.encode_single(ta, false), spec, a);
    check_hf(tok.encode_pair(ta, tb, false), spec, a, "--pair '" + b + "'");
  }
}

TEST_CASE("Qwen3's post-processor (ByteLevel) adds nothing, as in HF", "[tokenizer][hf]") {
  REQUIRE(qwen3().single_affixes());
  CHECK(qwen3().single_affixes()->before.empty());
  CHECK(qwen3().single_affixes()->after.empty());
  CHECK(gpt2().encode_single("a b") == gpt2().encode("a b"));
  require_hf_tokenizers();
  TempDir d;
  spit(d / "a.txt", corpus_prefix("mobydick", 200000));
  spit(d / "b.txt", "<|im_start|>user\nhi<|im_end|>");
  const std::string ta = slurp(d / "a.txt"), tb = slurp(d / "b.txt");
  const std::string spec = shared("qwen3-tokenizer/tokenizer.json");
  CHECK(qwen3().encode_single(ta) == qwen3().encode(ta));
  check_hf(qwen3().encode_single(ta), spec, d / "a.txt", "--add-special-tokens");
  check_hf(qwen3().encode_pair(ta, tb), spec, d / "a.txt", "--pair '" + (d / "b.txt") + "' --add-special-tokens");
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

TEST_CASE("a bad post_processor is a clear error naming the field", "[tokenizer][errors]") {
  auto with = [](const std::string& pp) {
    return R"({"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},
      "added_tokens":[{"id":3,"content":"<s>","special":true}],"post_processor":)" +
           pp + "}";
  };
  auto tmpl = [](const std::string& single, const std::string& specials = R"({"<s>":{"id":"<s>","ids":[3]}})") {
    return R"({"type":"TemplateProcessing","single":)" + single +
           R"(,"pair":[{"Sequence":{"id":"B","type_id":1}},{"Sequence":{"id":"A","type_id":0}}],"special_tokens":)" +
           specials + "}";
  };
  const std::string bos_a = R"([{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}])";
  const Tokenizer ok = Tokenizer::from_hf_json_text(with(tmpl(bos_a)), "ok.json");
  CHECK(ok.encode_single("ab") == std::vector<uint32_t>{3, 2});
  CHECK(ok.encode_single("ab", false) == std::vector<uint32_t>{2});
  CHECK(ok.encode_pair("ab", "a") == std::vector<uint32_t>{0, 2});  // the pair template's order, as in HF
  CHECK(ok.single_affixes()->before == std::vector<uint32_t>{3});
  const Tokenizer two =
      Tokenizer::from_hf_json_text(with(tmpl(bos_a, R"({"<s>":{"id":"<s>","ids":[3,1]}})")), "2.json");
  CHECK(two.encode_single("ab") == std::vector<uint32_t>{3, 1, 2});  // a special token may stand for several ids
  const Tokenizer twice = Tokenizer::from_hf_json_text(
      with(tmpl(R"([{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"A","type_id":0}}])")), "twice.json");
  CHECK(twice.encode_single("ab") == std::vector<uint32_t>{2, 2});
  CHECK(!twice.single_affixes());
  auto err = [&](const std::string& pp) {
    try {
      Tokenizer::from_hf_json_text(with(pp), "t.json");
    } catch (const DataError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(err(tmpl(R"([{"SpecialToken":{"id":"<|begin_of_text|>","type_id":0}}])")),
             Catch::Equals("t.json: post_processor.single[0]: special token '<|begin_of_text|>' is not in "
                           "post_processor.special_tokens"));
  CHECK_THAT(err(R"({"type":"Foo"})"), Catch::StartsWith("t.json: post_processor: unsupported type 'Foo'"));
  CHECK_THAT(err(R"({"type":"Sequence","processors":[)" + tmpl(bos_a) + R"(,{"type":"Foo"}]})"),
             Catch::StartsWith("t.json: post_processor.processors[1]: unsupported type 'Foo'"));
  CHECK_THAT(err(R"({"type":"Sequence","processors":[)" + tmpl(bos_a) + "," + tmpl(bos_a) + "]}"),
             Catch::StartsWith("t.json: post_processor.processors[1]: a second template post-processor"));
  CHECK_THAT(err(tmpl(bos_a, R"({"<s>":{"id":"<s>","ids":[99]}})")),
             Catch::Equals("t.json: post_processor.special_tokens['<s>'].ids: id 99 is not in the vocabulary"));
  CHECK_THAT(err(tmpl(R"([{"Sequence":{"id":"B","type_id":0}}])")),
             Catch::Equals("t.json: post_processor.single[0]: a single template has no sequence B"));
  CHECK_THAT(err(R"({"type":"TemplateProcessing","single":[],"special_tokens":{}})"),
             Catch::StartsWith("t.json: post_processor.pair is missing"));
  CHECK_THAT(err(R"({"type":"BertProcessing","sep":["</s>",7],"cls":["<s>",3]})"),
             Catch::Equals("t.json: post_processor.sep: id 7 is not in the vocabulary"));
}
