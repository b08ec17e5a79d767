#include "data/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <sys/stat.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <nlohmann/json.hpp>

namespace mt::data {

const char* const kGpt2SplitPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

using json = nlohmann::json;
constexpr uint32_t kNone = 0xffffffffu;

// ----- UTF-8 ---------------------------------------------------------------------------------------------
void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
}

// Decodes one code point of valid UTF-8 at s[i], advancing i.
uint32_t next_cp(std::string_view s, std::size_t& i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  const int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  uint32_t cp = c & (n == 4 ? 0x07 : n == 3 ? 0x0F : 0x1F);
  for (int k = 1; k < n && i + std::size_t(k) < s.size(); ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + std::size_t(k)]) & 0x3F);
  i += std::size_t(n);
  return cp;
}

// ----- GPT-2's byte <-> unicode map ------------------------------------------------------------------------
struct ByteMap {
  std::array<std::string, 256> enc;  // byte -> UTF-8 of its printable char
  std::vector<int> dec;              // code point -> byte, -1 when none
  ByteMap() : dec(512, -1) {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = keep ? uint32_t(b) : uint32_t(256 + n++);
      append_utf8(enc[std::size_t(b)], cp);
      dec[cp] = b;
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Byte-level token string (as in vocab/merges) -> raw bytes; false when a char is not in the map.
bool bytelevel_to_bytes(std::string_view s, std::string& out) {
  out.clear();
  const auto& dec = byte_map().dec;
  bool ok = true;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t at = i;
    const uint32_t cp = next_cp(s, i);
    if (cp < dec.size() && dec[cp] >= 0) {
      out += char(dec[cp]);
    } else {
      ok = false;
      out.append(s.substr(at, i - at));
    }
  }
  return ok;
}

// ----- hashing -----------------------------------------------------------------------------------------
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

inline uint64_t hash_bytes(const char* p, std::size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = mix64(h ^ v) + 0x632BE59BD9B4E019ull;
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  return mix64(h ^ v ^ (uint64_t(n) << 56));
}

// Open-addressing map (a, b) -> (rank, merged id).
class MergeMap {
 public:
  void init(std::size_t n) {
    std::size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    mask_ = cap - 1;
    slots_.assign(cap, Slot{kEmpty, 0, 0});
  }
  bool insert(uint32_t a, uint32_t b, uint32_t rank, uint32_t id) {
    const uint64_t key = (uint64_t(a) << 32) | b;
    for (std::size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) {  // a repeated pair: the later merge wins, as in HF (HashMap collect)
        slots_[i] = Slot{key, rank, id};
        return false;
      }
      if (slots_[i].key == kEmpty) {
        slots_[i] = Slot{key, rank, id};
        return true;
      }
    }
  }
  // Returns rank in the high 32 bits and id in the low 32 bits; ~0 when the pair is not a merge.
  uint64_t find(uint32_t a, uint32_t b) const {
    const uint64_t key = (uint64_t(a) << 32) | b;
    for (std::size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return (uint64_t(s.rank) << 32) | s.id;
      if (s.key == kEmpty) return ~uint64_t(0);
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  struct Slot {
    uint64_t key;
    uint32_t rank, id;
  };
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
};

// Word cache: pre-token bytes -> ids, per thread and tokenizer. Direct-mapped, one 64-byte line per
// entry with the key and ids inline (words up to 22 bytes and 8 ids; longer ones are not cached), so a
// lookup touches one cache line; a colliding word simply replaces the entry.
class WordCache {
 public:
  static constexpr std::size_t kMaxKey = 22, kMaxIds = 8;
  WordCache() : table_(std::size_t(1) << kBits) {}
  const uint32_t* find(std::string_view w, uint64_t h, uint32_t* n) const {
    const Entry& e = table_[h >> (64 - kBits)];
    if (e.hash != h || e.klen != w.size() || std::memcmp(e.key, w.data(), w.size()) != 0) return nullptr;
    *n = e.nids;
    return e.ids;
  }
  void insert(std::string_view w, uint64_t h, const uint32_t* ids, uint32_t n) {
    if (w.size() > kMaxKey || n > kMaxIds) return;
    Entry& e = table_[h >> (64 - kBits)];
    e.hash = h;
    e.klen = uint8_t(w.size());
    e.nids = uint8_t(n);
    std::memcpy(e.key, w.data(), w.size());
    std::memcpy(e.ids, ids, n * sizeof(uint32_t));
  }

 private:
  static constexpr int kBits = 16;
  struct alignas(64) Entry {
    uint64_t hash = 0;
    uint8_t klen = 0xff, nids = 0;
    char key[kMaxKey];
    uint32_t ids[kMaxIds];
  };
  static_assert(sizeof(Entry) == 64, "one cache line per entry");
  std::vector<Entry> table_;
};

// ----- regex ---------------------------------------------------------------------------------------------
// Unicode White_Space, which is what `\s` means in Oniguruma (PCRE2's \s under UCP adds U+180E).
constexpr const char* kWhiteSpaceClass =
    R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string translate_pattern(const std::string& p, const std::string& where) {
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpaceClass) : std::string("[") + kWhiteSpaceClass + "]";
      } else if (n == 'S') {
        if (in_class) throw DataError(where + ": unsupported regex: \\S inside a character class");
        out += std::string("[^") + kWhiteSpaceClass + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) : source_(pattern) {
    const std::string pcre = translate_pattern(pattern, where);
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre.data()), pcre.size(), PCRE2_UTF | PCRE2_UCP, &err, &off,
                          nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw DataError(where + ": cannot compile regex '" + pattern + "' at offset " + std::to_string(off) + ": " +
                      reinterpret_cast<const char*>(msg));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  // Next match in s at or after `start`: true and [b, e) when found.
  bool find(std::string_view s, std::size_t start, std::size_t& b, std::size_t& e) const {
    Thread& t = thread();
    const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
    int rc = jit_ ? pcre2_jit_match(code_, subj, s.size(), start, 0, t.md, t.mc)
                  : pcre2_match(code_, subj, s.size(), start, PCRE2_NO_UTF_CHECK, t.md, t.mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code_, subj, s.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, t.md, t.mc);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw DataError("regex '" + source_ + "' failed at offset " + std::to_string(start) + ": " +
                      reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(t.md);
    b = ov[0];
    e = ov[1];
    return true;
  }
  const std::string& source() const { return source_; }

 private:
  struct Thread {
    pcre2_match_data* md;
    pcre2_match_context* mc;
    pcre2_jit_stack* js;
    Thread() {
      md = pcre2_match_data_create(4, nullptr);
      mc = pcre2_match_context_create(nullptr);
      js = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
      pcre2_jit_stack_assign(mc, nullptr, js);
    }
    ~Thread() {
      pcre2_match_data_free(md);
      pcre2_match_context_free(mc);
      pcre2_jit_stack_free(js);
    }
  };
  static Thread& thread() {
    thread_local Thread t;
    return t;
  }
  std::string source_;
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// ----- misc ----------------------------------------------------------------------------------------------
std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw DataError(path + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::atomic<uint64_t> g_next_instance{1};

bool is_ascii_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool is_word_byte(unsigned char c) { return c >= 0x80 || std::isalnum(static_cast<int>(c)) != 0 || c == '_'; }

}  // namespace

// =========================================================================================================
struct Tokenizer::Impl {
  enum class StepKind { Split, SplitRemoved, PrefixSpace };
  struct Step {
    StepKind kind;
    std::shared_ptr<Regex> re;
  };

  std::string source;
  uint64_t instance = g_next_instance.fetch_add(1);
  std::shared_ptr<const int> alive = std::make_shared<const int>(0);  // expires with the tokenizer
  std::vector<std::string> id_bytes;                                  // id -> raw bytes ("" for holes)
  std::vector<uint8_t> id_present, id_special;
  std::unordered_map<std::string, uint32_t> bytes_id;  // model vocabulary (raw bytes -> id)
  std::unordered_map<std::string, uint32_t> added_id;  // added tokens (content -> id)
  std::array<uint32_t, 256> byte_id;
  MergeMap merges;
  bool ignore_merges = false;
  bool nfc = false;
  const icu::Normalizer2* nfc_impl = nullptr;
  std::vector<Step> steps;
  std::vector<AddedToken> added;
  std::array<std::vector<uint32_t>, 256> added_by_first;  // indices into `added`, longest first
  std::array<bool, 256> added_first{};
  std::optional<uint32_t> eot;
  // Post-processor templates; a piece is the text $A (seq 0), $B (seq 1) or special ids (seq -1).
  struct Piece {
    int seq;
    std::vector<uint32_t> ids;
  };
  using Template = std::vector<Piece>;
  Template single{{0, {}}}, pair{{0, {}}, {1, {}}};  // HF's default: the texts in order, nothing added
  std::optional<Affixes> affixes = Affixes{};

  // ---- construction helpers ----
  void set_token(uint32_t id, std::string bytes, bool model = true) {
    if (id >= id_bytes.size()) {
      id_bytes.resize(std::size_t(id) + 1);
      id_present.resize(std::size_t(id) + 1, 0);
      id_special.resize(std::size_t(id) + 1, 0);
    }
    id_bytes[id] = bytes;
    id_present[id] = 1;
    (model ? bytes_id : added_id).emplace(std::move(bytes), id);
  }

  void load_vocab(const json& vocab, const std::string& where) {
    if (!vocab.is_object()) throw DataError(where + ": model.vocab must be an object of token -> id");
    std::string raw;
    id_bytes.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0)
        throw DataError(where + ": model.vocab['" + it.key() + "'] is not a non-negative integer id");
      bytelevel_to_bytes(it.key(), raw);
      set_token(uint32_t(it.value().get<int64_t>()), raw);
    }
    byte_id.fill(kNone);
    const auto& bm = byte_map();
    // The vocab's own byte-level strings decide which id a byte has.
    for (int b = 0; b < 256; ++b) {
      auto f = vocab.find(bm.enc[std::size_t(b)]);
      if (f != vocab.end()) byte_id[std::size_t(b)] = uint32_t(f.value().get<int64_t>());
    }
  }

  void add_merge(const json& vocab, const std::string& a, const std::string& b, uint32_t rank,
                 const std::string& where) {
    auto fa = vocab.find(a), fb = vocab.find(b), fab = vocab.find(a + b);
    auto bad = [&](const std::string& t) {
      throw DataError(where + ": merge " + std::to_string(rank) + " ('" + a + " " + b + "'): token '" + t +
                      "' is not in the vocabulary");
    };
    if (fa == vocab.end()) bad(a);
    if (fb == vocab.end()) bad(b);
    if (fab == vocab.end()) bad(a + b);
    merges.insert(uint32_t(fa.value().get<int64_t>()), uint32_t(fb.value().get<int64_t>()), rank,
                  uint32_t(fab.value().get<int64_t>()));
  }

  void add_added(AddedToken t) {
    if (t.content.empty()) return;
    set_token(t.id, t.content, false);
    id_special[t.id] = t.special;
    added.push_back(std::move(t));
  }

  void finish() {
    for (auto& v : added_by_first) v.clear();
    added_first.fill(false);
    for (uint32_t i = 0; i < added.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(added[i].content[0]);
      added_by_first[c].push_back(i);
      added_first[c] = true;
    }
    for (auto& v : added_by_first)
      std::stable_sort(v.begin(), v.end(),
                       [&](uint32_t x, uint32_t y) { return added[x].content.size() > added[y].content.size(); });
    // The documents' separator: the family's end-of-text token where there is one (GPT-2 and Qwen,
    // Llama-3, Llama-2 and Mistral, Gemma), else the first special token.
    eot.reset();
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
      for (const auto& t : added)
        if (!eot && t.content == name) eot = t.id;
    if (!eot)
      for (const auto& t : added)
        if (t.special) {
          eot = t.id;
          break;
        }
  }

  // ---- post-processor ----
  uint32_t checked_id(const json& v, const std::string& where) const {
    if (!v.is_number_unsigned()) throw DataError(where + ": not a token id");
    const uint64_t id = v.get<uint64_t>();
    if (id >= id_present.size() || !id_present[id])
      throw DataError(where + ": id " + std::to_string(id) + " is not in the vocabulary");
    return uint32_t(id);
  }

  // `field` of a TemplateProcessing: {"SpecialToken": {"id": key}} pieces (the ids of special_tokens[key])
  // and {"Sequence": {"id": "A" or "B"}} pieces; type ids do not change the ids.
  Template parse_template(const json& p, const std::string& field,
                          const std::map<std::string, std::vector<uint32_t>>& specials,
                          const std::string& where) const {
    const std::string at = where + "." + field;
    if (!p.contains(field) || !p[field].is_array()) throw DataError(at + " is missing (a list of template pieces)");
    Template t;
    for (std::size_t i = 0; i < p[field].size(); ++i) {
      const json& piece = p[field][i];
      const std::string pw = at + "[" + std::to_string(i) + "]";
      if (piece.is_object() && piece.contains("SpecialToken")) {
        const std::string key = piece["SpecialToken"].at("id").get<std::string>();
        const auto f = specials.find(key);
        if (f == specials.end())
          throw DataError(pw + ": special token '" + key + "' is not in " + where.substr(where.rfind(": ") + 2) +
                          ".special_tokens");
        t.push_back({-1, f->second});
      } else if (piece.is_object() && piece.contains("Sequence")) {
        const std::string id = piece["Sequence"].at("id").get<std::string>();
        if (id != "A" && id != "B") throw DataError(pw + ": sequence '" + id + "' is neither A nor B");
        if (id == "B" && field == "single") throw DataError(pw + ": a single template has no sequence B");
        t.push_back({id == "A" ? 0 : 1, {}});
      } else {
        throw DataError(pw + ": neither a SpecialToken nor a Sequence piece");
      }
    }
    return t;
  }

  void set_template_processing(const json& p, const std::string& where) {
    std::map<std::string, std::vector<uint32_t>> specials;
    if (!p.contains("special_tokens") || !p["special_tokens"].is_object())
      throw DataError(where + ".special_tokens is missing (an object of token -> {\"ids\": [...]})");
    const json& st = p["special_tokens"];
    for (auto it = st.begin(); it != st.end(); ++it) {
      const std::string sw = where + ".special_tokens['" + it.key() + "'].ids";
      if (!it.value().is_object() || !it.value().contains("ids") || !it.value()["ids"].is_array())
        throw DataError(sw + " is missing (a list of ids)");
      auto& ids = specials[it.key()];
      for (const auto& x : it.value()["ids"]) ids.push_back(checked_id(x, sw));
    }
    single = parse_template(p, "single", specials, where);
    pair = parse_template(p, "pair", specials, where);
  }

  // BertProcessing: [CLS] $A [SEP], and [CLS] $A [SEP] $B [SEP]; RobertaProcessing doubles the middle [SEP].
  void set_bert(const json& p, bool roberta, const std::string& where) {
    auto token = [&](const char* k) {
      if (!p.contains(k) || !p[k].is_array() || p[k].size() != 2)
        throw DataError(where + "." + k + " is missing (a [token, id] pair)");
      return std::vector<uint32_t>{checked_id(p[k][1], where + "." + k)};
    };
    const auto cls = token("cls"), sep = token("sep");
    single = {{-1, cls}, {0, {}}, {-1, sep}};
    pair = {{-1, cls}, {0, {}}, {-1, sep}};
    if (roberta) pair.push_back({-1, sep});
    pair.push_back({1, {}});
    pair.push_back({-1, sep});
  }

  // The parts of a tokenizer.json, each loaded by one function (Tokenizer::from_hf_json_text calls them).
  void load_model(const json& model, const std::string& name);
  void load_normalizer(const json& n, const std::string& name);
  void load_pre_tokenizer(const json& p, const std::string& name);
  void load_split(const json& p, const std::string& name);
  void load_added_tokens(const json& added, const std::string& name);

  // ByteLevel post-processors change offsets only; HF runs a Sequence's processors in order, and a second
  // template would see one merged text (HF's own encode then fails), so a Sequence holds one at most.
  void load_post_processor(const json& p, const std::string& where, bool nested = false) {
    if (p.is_null()) return;
    const std::string t = p.is_object() && p.contains("type") ? p["type"].get<std::string>() : "";
    if (t == "ByteLevel") return;
    if (t == "TemplateProcessing") {
      set_template_processing(p, where);
    } else if (t == "BertProcessing" || t == "RobertaProcessing") {
      set_bert(p, t == "RobertaProcessing", where);
    } else if (t == "Sequence" && !nested) {
      if (!p.contains("processors") || !p["processors"].is_array())
        throw DataError(where + ".processors is missing (a list of post-processors)");
      int templates = 0;
      for (std::size_t i = 0; i < p["processors"].size(); ++i) {
        const json& x = p["processors"][i];
        const std::string xw = where + ".processors[" + std::to_string(i) + "]";
        const std::string xt = x.is_object() ? x.value("type", "") : "";
        if ((xt == "TemplateProcessing" || xt == "BertProcessing" || xt == "RobertaProcessing") && ++templates > 1)
          throw DataError(xw + ": a second template post-processor (one per Sequence)");
        load_post_processor(x, xw, true);
      }
    } else {
      throw DataError(where + ": unsupported type '" + t +
                      "' (supported: TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence)");
    }
  }

  // The ids around the text of the single template, when the text occurs in it once.
  void finish_template() {
    Affixes a;
    int texts = 0;
    for (const Piece& p : single) {
      auto& side = texts ? a.after : a.before;
      side.insert(side.end(), p.ids.begin(), p.ids.end());
      texts += p.seq == 0;
    }
    affixes.reset();
    if (texts == 1) affixes = std::move(a);
  }

  void encode_template(const Template& t, std::string_view a, std::string_view b, bool add_special, bool allow_special,
                       std::vector<uint32_t>& out) const {
    for (const Piece& p : t) {
      if (p.seq < 0) {
        if (add_special) out.insert(out.end(), p.ids.begin(), p.ids.end());
      } else {
        encode(p.seq == 0 ? a : b, out, allow_special);
      }
    }
  }

  // ---- encoding ----
  void bpe(std::string_view w, std::vector<uint32_t>& out, WordCache& cache) const {
    const uint64_t h = hash_bytes(w.data(), w.size());
    uint32_t n = 0;
    if (const uint32_t* ids = cache.find(w, h, &n)) {
      out.insert(out.end(), ids, ids + n);
      return;
    }
    const std::size_t start = out.size();
    if (w.size() == 1) {
      const uint32_t id = byte_id[static_cast<unsigned char>(w[0])];
      if (id != kNone) out.push_back(id);
    } else if (auto f = ignore_merges ? bytes_id.find(std::string(w)) : bytes_id.end(); f != bytes_id.end()) {
      out.push_back(f->second);  // ignore_merges: a whole word in the vocabulary is one token (Llama-3)
    } else {
      merge_word(w, out);
    }
    cache.insert(w, h, out.data() + start, uint32_t(out.size() - start));
  }

  // Long words (runs of thousands of letters, digits or spaces): the same merge order (lowest rank, then
  // leftmost) with a heap over a linked list, O(n log n) instead of O(n^2).
  void merge_long_word(const std::vector<uint32_t>& init, std::vector<uint32_t>& out) const {
    const std::size_t n = init.size();
    std::vector<uint32_t> id(init);
    std::vector<std::size_t> prev(n), next(n);
    std::vector<uint8_t> alive(n, 1);
    for (std::size_t i = 0; i < n; ++i) {
      prev[i] = i - 1;  // wraps to npos for i == 0
      next[i] = i + 1;
    }
    struct Entry {
      uint32_t rank;
      std::size_t pos;
      bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    auto push = [&](std::size_t i) {
      if (i >= n || next[i] >= n) return;
      const uint64_t m = merges.find(id[i], id[next[i]]);
      if (m != ~uint64_t(0)) heap.push({uint32_t(m >> 32), i});
    };
    for (std::size_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const Entry e = heap.top();
      heap.pop();
      const std::size_t i = e.pos;
      if (!alive[i] || next[i] >= n) continue;
      const uint64_t m = merges.find(id[i], id[next[i]]);
      if (m == ~uint64_t(0) || uint32_t(m >> 32) != e.rank) continue;  // stale
      const std::size_t j = next[i];
      id[i] = uint32_t(m);
      alive[j] = 0;
      next[i] = next[j];
      if (next[j] < n) prev[next[j]] = i;
      if (prev[i] < n) push(prev[i]);
      push(i);
    }
    for (std::size_t i = 0; i < n; i = next[i]) out.push_back(id[i]);
  }

  void merge_word(std::string_view w, std::vector<uint32_t>& out) const {
    thread_local std::vector<uint32_t> sym;
    thread_local std::vector<uint64_t> pr;  // (rank << 32 | merged id) of pair (i, i+1), ~0 when none
    sym.clear();
    for (unsigned char c : w)
      if (byte_id[c] != kNone) sym.push_back(byte_id[c]);
    std::size_t n = sym.size();
    if (n > 256) {
      merge_long_word(sym, out);
      return;
    }
    pr.resize(n);
    for (std::size_t i = 0; i + 1 < n; ++i) pr[i] = merges.find(sym[i], sym[i + 1]);
    while (n > 1) {
      uint64_t best = ~uint64_t(0);
      std::size_t bi = 0;
      for (std::size_t i = 0; i + 1 < n; ++i)
        if ((pr[i] >> 32) < (best >> 32)) {
          best = pr[i];
          bi = i;
        }
      if (best == ~uint64_t(0)) break;
      sym[bi] = uint32_t(best);
      std::memmove(&sym[bi + 1], &sym[bi + 2], (n - bi - 2) * sizeof(uint32_t));
      std::memmove(&pr[bi], &pr[bi + 1], (n - bi - 2) * sizeof(uint64_t));
      --n;
      if (bi > 0) pr[bi - 1] = merges.find(sym[bi - 1], sym[bi]);
      if (bi + 1 < n) pr[bi] = merges.find(sym[bi], sym[bi + 1]);
    }
    out.insert(out.end(), sym.begin(), sym.begin() + std::ptrdiff_t(n));
  }

  template <class Leaf>
  void pretok(std::size_t step, std::string_view s, Leaf& leaf) const {
    if (s.empty()) return;
    if (step == steps.size()) {
      leaf(s);
      return;
    }
    const Step& st = steps[step];
    if (st.kind == StepKind::PrefixSpace) {
      if (s[0] == ' ') {
        pretok(step + 1, s, leaf);
      } else {
        std::string t;
        t.reserve(s.size() + 1);
        t += ' ';
        t.append(s);
        pretok(step + 1, t, leaf);
      }
      return;
    }
    std::size_t pos = 0, b = 0, e = 0;
    while (pos < s.size() && st.re->find(s, pos, b, e)) {
      if (b > pos) pretok(step + 1, s.substr(pos, b - pos), leaf);
      if (e == b) {  // empty match: step over one character
        std::size_t i = b;
        if (i < s.size()) next_cp(s, i);
        if (st.kind == StepKind::Split) pretok(step + 1, s.substr(b, i - b), leaf);
        pos = i;
        continue;
      }
      if (st.kind == StepKind::Split) pretok(step + 1, s.substr(b, e - b), leaf);
      pos = e;
    }
    if (pos < s.size()) pretok(step + 1, s.substr(pos), leaf);
  }

  template <class Leaf>
  void section(std::string_view s, Leaf& leaf) const {
    if (s.empty()) return;
    if (nfc) {
      bool simple = true;  // code points below U+0300 are stable under NFC
      for (unsigned char c : s)
        if (c >= 0xCC) {
          simple = false;
          break;
        }
      if (!simple) {
        UErrorCode st = U_ZERO_ERROR;
        const icu::StringPiece sp(s.data(), int32_t(s.size()));
        if (!nfc_impl->isNormalizedUTF8(sp, st) || U_FAILURE(st)) {
          std::string norm;
          icu::StringByteSink<std::string> sink(&norm);
          st = U_ZERO_ERROR;
          nfc_impl->normalizeUTF8(0, sp, sink, nullptr, st);
          if (U_FAILURE(st)) throw DataError(source + ": NFC normalization failed: " + u_errorName(st));
          pretok(0, norm, leaf);
          return;
        }
      }
    }
    pretok(0, s, leaf);
  }

  // This thread's word cache for this tokenizer. Caches of tokenizers that no longer exist are dropped
  // when a thread makes a new one, so memory stays bounded by the live tokenizers.
  WordCache& cache() const {
    struct Slot {
      std::weak_ptr<const int> owner;
      std::unique_ptr<WordCache> cache;
    };
    thread_local std::unordered_map<uint64_t, Slot> caches;
    auto f = caches.find(instance);
    if (f != caches.end()) return *f->second.cache;
    for (auto it = caches.begin(); it != caches.end();)
      it = it->second.owner.expired() ? caches.erase(it) : std::next(it);
    Slot& s = caches[instance];
    s.owner = alive;
    s.cache = std::make_unique<WordCache>();
    return *s.cache;
  }

  void encode(std::string_view text, std::vector<uint32_t>& out, bool allow_special) const {
    WordCache& wc = cache();
    auto leaf = [&](std::string_view w) { bpe(w, out, wc); };
    auto special = [&](uint32_t id) { out.push_back(id); };
    run(text, allow_special, leaf, special);
  }

  // Cuts added tokens out of `text` (special(id) for each) and pre-tokenizes the rest (leaf(piece)).
  template <class Leaf, class Special>
  void run(std::string_view text, bool allow_special, Leaf& leaf, Special& special) const {
    const std::size_t bad = find_invalid_utf8(text);
    if (bad != std::string_view::npos)
      throw DataError("tokenizer: invalid UTF-8 in the input at byte offset " + std::to_string(bad));
    std::size_t sec = 0;  // start of the current plain section
    std::size_t i = 0;
    const std::size_t n = text.size();
    while (i < n) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      if (!added_first[c]) {
        ++i;
        continue;
      }
      const AddedToken* hit = nullptr;
      for (uint32_t k : added_by_first[c]) {
        const AddedToken& t = added[k];
        if (t.special && !allow_special) continue;
        if (t.content.size() > n - i || std::memcmp(text.data() + i, t.content.data(), t.content.size()) != 0) continue;
        if (t.single_word) {
          const std::size_t e = i + t.content.size();
          if ((i > 0 && is_word_byte(static_cast<unsigned char>(text[i - 1]))) ||
              (e < n && is_word_byte(static_cast<unsigned char>(text[e]))))
            continue;
        }
        hit = &t;
        break;
      }
      if (!hit) {
        ++i;
        continue;
      }
      std::size_t b = i, e = i + hit->content.size();
      if (hit->lstrip)
        while (b > sec && is_ascii_space(static_cast<unsigned char>(text[b - 1]))) --b;
      if (hit->rstrip)
        while (e < n && is_ascii_space(static_cast<unsigned char>(text[e]))) ++e;
      section(text.substr(sec, b - sec), leaf);
      special(hit->id);
      sec = i = e;
    }
    section(text.substr(sec), leaf);
  }
};

// =========================================================================================================
Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

const std::string& Tokenizer::byte_to_unicode(uint8_t b) { return byte_map().enc[b]; }

Tokenizer Tokenizer::from_hf_json(const std::string& path) { return from_hf_json_text(read_file(path), path); }

namespace {

std::string str_or_empty(const json& o, const char* k) {
  auto f = o.find(k);
  return (f == o.end() || f->is_null()) ? std::string() : f->get<std::string>();
}

// A merge as "a b" or ["a", "b"].
std::pair<std::string, std::string> merge_tokens(const json& mg, uint32_t rank, const std::string& name) {
  if (mg.is_string()) {
    const std::string s = mg.get<std::string>();
    const auto sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
      throw DataError(name + ": merge " + std::to_string(rank) + " ('" + s + "') is not two tokens");
    return {s.substr(0, sp), s.substr(sp + 1)};
  }
  if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string())
    return {mg[0].get<std::string>(), mg[1].get<std::string>()};
  throw DataError(name + ": merge " + std::to_string(rank) + " is neither \"a b\" nor [\"a\", \"b\"]");
}

void check_decoder(const json& d, const std::string& name) {
  if (d.is_null()) return;
  const std::string t = str_or_empty(d, "type");
  bool ok = t == "ByteLevel";
  if (t == "Sequence") {
    ok = true;
    for (const auto& x : d.at("decoders")) ok = ok && str_or_empty(x, "type") == "ByteLevel";
  }
  if (!ok) throw DataError(name + ": unsupported decoder type '" + t + "' (only ByteLevel)");
}

}  // namespace

void Tokenizer::Impl::load_model(const json& model, const std::string& name) {
  const std::string type = str_or_empty(model, "type");
  if (type != "BPE" && !(type.empty() && model.contains("merges")))
    throw DataError(name + ": unsupported model type '" + type + "' (only BPE)");
  if (model.value("byte_fallback", false)) throw DataError(name + ": unsupported model option byte_fallback=true");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0)
    throw DataError(name + ": unsupported model option dropout");
  if (!str_or_empty(model, "continuing_subword_prefix").empty() || !str_or_empty(model, "end_of_word_suffix").empty())
    throw DataError(name + ": unsupported model option continuing_subword_prefix/end_of_word_suffix");
  ignore_merges = model.value("ignore_merges", false);
  if (!model.contains("vocab")) throw DataError(name + ": model has no 'vocab'");
  const json& vocab = model["vocab"];
  load_vocab(vocab, name);
  const json& mgs = model.contains("merges") ? model["merges"] : json::array();
  if (!mgs.is_array()) throw DataError(name + ": model.merges must be an array");
  merges.init(mgs.size());
  uint32_t rank = 0;
  for (const auto& mg : mgs) {
    const auto [a, b] = merge_tokens(mg, rank, name);
    add_merge(vocab, a, b, rank, name);
    ++rank;
  }
}

void Tokenizer::Impl::load_normalizer(const json& n, const std::string& name) {
  if (n.is_null()) return;
  const std::string t = str_or_empty(n, "type");
  if (t == "NFC") {
    nfc = true;
  } else if (t == "Sequence") {
    for (const auto& x : n.at("normalizers")) load_normalizer(x, name);
  } else {
    throw DataError(name + ": unsupported normalizer type '" + t + "' (supported: NFC, Sequence)");
  }
}

void Tokenizer::Impl::load_pre_tokenizer(const json& p, const std::string& name) {
  if (p.is_null()) return;
  const std::string t = str_or_empty(p, "type");
  if (t == "Sequence") {
    for (const auto& x : p.at("pretokenizers")) load_pre_tokenizer(x, name);
  } else if (t == "ByteLevel") {
    if (p.value("add_prefix_space", false)) steps.push_back({StepKind::PrefixSpace, nullptr});
    if (p.value("use_regex", true))
      steps.push_back({StepKind::Split, std::make_shared<Regex>(kGpt2SplitPattern, name)});
  } else if (t == "Split") {
    load_split(p, name);
  } else {
    throw DataError(name + ": unsupported pre_tokenizer type '" + t + "' (supported: ByteLevel, Split, Sequence)");
  }
}

void Tokenizer::Impl::load_split(const json& p, const std::string& name) {
  const json& pat = p.at("pattern");
  std::string rx;
  if (pat.contains("Regex")) {
    rx = pat["Regex"].get<std::string>();
  } else if (pat.contains("String")) {
    for (char c : pat["String"].get<std::string>()) {
      if (std::strchr("\\^$.|?*+()[]{}", c)) rx += '\\';
      rx += c;
    }
  } else {
    throw DataError(name + ": pre_tokenizer Split without a Regex or String pattern");
  }
  if (p.value("invert", false)) throw DataError(name + ": unsupported pre_tokenizer Split option invert=true");
  const std::string beh = str_or_empty(p, "behavior");
  StepKind kind;
  if (beh == "Isolated")
    kind = StepKind::Split;
  else if (beh == "Removed")
    kind = StepKind::SplitRemoved;
  else
    throw DataError(name + ": unsupported pre_tokenizer Split behavior '" + beh + "' (Isolated, Removed)");
  steps.push_back({kind, std::make_shared<Regex>(rx, name)});
}

void Tokenizer::Impl::load_added_tokens(const json& added, const std::string& name) {
  if (!added.is_array()) return;
  for (const auto& a : added) {
    AddedToken t;
    t.id = a.at("id").get<uint32_t>();
    t.content = a.at("content").get<std::string>();
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.single_word = a.value("single_word", false);
    t.normalized = a.value("normalized", !t.special);
    if (find_invalid_utf8(t.content) != std::string::npos)
      throw DataError(name + ": added token " + std::to_string(t.id) + " is not valid UTF-8");
    add_added(std::move(t));
  }
}

Tokenizer Tokenizer::from_hf_json_text(const std::string& text, const std::string& name) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw DataError(name + ": not valid JSON (byte " + std::to_string(e.byte) + "): " + e.what());
  }
  if (!j.is_object()) throw DataError(name + ": not a tokenizer.json (top level is not an object)");
  auto m = std::make_unique<Impl>();
  m->source = name;
  try {
    if (!j.contains("model") || !j["model"].is_object()) throw DataError(name + ": no 'model' object");
    m->load_model(j["model"], name);
    if (j.contains("normalizer")) m->load_normalizer(j["normalizer"], name);
    if (m->nfc) {
      UErrorCode st = U_ZERO_ERROR;
      m->nfc_impl = icu::Normalizer2::getNFCInstance(st);
      if (U_FAILURE(st)) throw DataError(name + ": ICU NFC normalizer unavailable: " + u_errorName(st));
    }
    if (j.contains("pre_tokenizer")) m->load_pre_tokenizer(j["pre_tokenizer"], name);
    if (j.contains("decoder")) check_decoder(j["decoder"], name);
    if (j.contains("added_tokens")) m->load_added_tokens(j["added_tokens"], name);
    if (j.contains("post_processor")) m->load_post_processor(j["post_processor"], name + ": post_processor");
    m->finish_template();
  } catch (const json::exception& e) {
    throw DataError(name + ": malformed tokenizer.json: " + e.what());
  }
  m->finish();
  return Tokenizer(std::move(m));
}

Tokenizer Tokenizer::from_gpt2(const std::string& encoder_json, const std::string& vocab_bpe) {
  json enc;
  try {
    enc = json::parse(read_file(encoder_json));
  } catch (const json::parse_error& e) {
    throw DataError(encoder_json + ": not valid JSON (byte " + std::to_string(e.byte) + "): " + e.what());
  }
  auto m = std::make_unique<Impl>();
  m->source = encoder_json;
  m->load_vocab(enc, encoder_json);
  const std::string merges = read_file(vocab_bpe);
  std::vector<std::pair<std::string, std::string>> pairs;
  std::size_t line_no = 0, pos = 0;
  while (pos < merges.size()) {
    std::size_t e = merges.find('\n', pos);
    if (e == std::string::npos) e = merges.size();
    std::string line = merges.substr(pos, e - pos);
    pos = e + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const auto sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
      throw DataError(vocab_bpe + ":" + std::to_string(line_no) + ": not a merge ('a b'): '" + line + "'");
    pairs.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  m->merges.init(pairs.size());
  for (uint32_t r = 0; r < pairs.size(); ++r) m->add_merge(enc, pairs[r].first, pairs[r].second, r, vocab_bpe);
  m->steps.push_back({Impl::StepKind::Split, std::make_shared<Regex>(kGpt2SplitPattern, encoder_json)});
  if (enc.contains("<|endoftext|>")) {
    AddedToken t;
    t.id = enc["<|endoftext|>"].get<uint32_t>();
    t.content = "<|endoftext|>";
    t.special = true;
    m->add_added(std::move(t));
  }
  m->finish();
  return Tokenizer(std::move(m));
}

Tokenizer Tokenizer::load(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    if (::stat((path + "/tokenizer.json").c_str(), &st) == 0) return from_hf_json(path + "/tokenizer.json");
    if (::stat((path + "/encoder.json").c_str(), &st) == 0)
      return from_gpt2(path + "/encoder.json", path + "/vocab.bpe");
    throw DataError(path + ": directory holds neither tokenizer.json nor encoder.json + vocab.bpe");
  }
  return from_hf_json(path);
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out, bool allow_special) const {
  impl_->encode(text, out, allow_special);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 8);
  impl_->encode(text, out, allow_special);
  return out;
}

std::vector<uint32_t> Tokenizer::encode_single(std::string_view text, bool add_special_tokens,
                                               bool allow_special) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 8);
  impl_->encode_template(impl_->single, text, {}, add_special_tokens, allow_special, out);
  return out;
}

std::vector<uint32_t> Tokenizer::encode_pair(std::string_view a, std::string_view b, bool add_special_tokens,
                                             bool allow_special) const {
  std::vector<uint32_t> out;
  out.reserve((a.size() + b.size()) / 3 + 8);
  impl_->encode_template(impl_->pair, a, b, add_special_tokens, allow_special, out);
  return out;
}

const std::optional<Tokenizer::Affixes>& Tokenizer::single_affixes() const { return impl_->affixes; }

std::string Tokenizer::decode(const uint32_t* ids, std::size_t n, bool skip_special) const {
  const Impl& m = *impl_;
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t id = ids[i];
    if (id >= m.id_bytes.size() || !m.id_present[id])
      throw DataError(m.source + ": cannot decode id " + std::to_string(id) + " (position " + std::to_string(i) +
                      "): not in the vocabulary");
    if (skip_special && m.id_special[id]) continue;
    s += m.id_bytes[id];
  }
  return s;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids, bool skip_special) const {
  return decode(ids.data(), ids.size(), skip_special);
}

void Tokenizer::for_each_pretoken(std::string_view text, const std::function<void(std::string_view)>& f) const {
  auto leaf = [&](std::string_view w) { f(w); };
  auto special = [](uint32_t) {};
  impl_->run(text, true, leaf, special);
}

bool Tokenizer::splits_at_letter_spaces() const {
  const Impl& m = *impl_;
  if (m.steps.empty()) return false;
  for (const auto& st : m.steps) {
    if (st.kind != Impl::StepKind::Split) return false;
    const std::string& src = st.re->source();
    if (src != kGpt2SplitPattern && src != kLlama3SplitPattern && src != kQwen2SplitPattern) return false;
  }
  for (const auto& t : m.added)
    if (t.content.find(' ') != std::string::npos) return false;
  return true;
}

uint32_t Tokenizer::vocab_size() const { return uint32_t(impl_->id_bytes.size()); }

std::optional<uint32_t> Tokenizer::token_to_id(std::string_view token_bytes) const {
  auto f = impl_->bytes_id.find(std::string(token_bytes));
  if (f == impl_->bytes_id.end()) {
    f = impl_->added_id.find(std::string(token_bytes));
    if (f == impl_->added_id.end()) return std::nullopt;
  }
  return f->second;
}

const std::string& Tokenizer::id_to_bytes(uint32_t id) const {
  if (id >= impl_->id_bytes.size()) throw DataError(impl_->source + ": id " + std::to_string(id) + " out of range");
  return impl_->id_bytes[id];
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
std::optional<uint32_t> Tokenizer::eot_id() const { return impl_->eot; }
const std::string& Tokenizer::source() const { return impl_->source; }

std::size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t v;
      std::memcpy(&v, p + i, 8);
      if (v & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
      min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
      min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
      min = 0x10000;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (std::size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

}  // namespace mt::data
