#include "data/dataset_builder.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "data/loader.hpp"
#include "data/shard.hpp"

namespace mt::data {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string read_input(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw DataError(path + ": cannot open input");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// "file:line:column" of a byte offset.
// "file:line:column (byte offset N)" of offset `off` in `text`, a block of the file that starts at
// byte `base_off`, on line `line`, column `col`.
std::string where_in(const std::string& file, std::string_view text, std::size_t off, std::size_t line = 1,
                     std::size_t col = 1, std::size_t base_off = 0) {
  for (std::size_t i = 0; i < off && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return file + ":" + std::to_string(line) + ":" + std::to_string(col) + " (byte offset " +
         std::to_string(base_off + off) + ")";
}

bool ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string render(const std::string& tmpl, const std::vector<std::pair<std::string, std::string>>& vars) {
  std::string out;
  for (std::size_t i = 0; i < tmpl.size();) {
    if (tmpl[i] == '{') {
      bool hit = false;
      for (const auto& [k, v] : vars) {
        if (tmpl.compare(i + 1, k.size(), k) == 0 && i + 1 + k.size() < tmpl.size() && tmpl[i + 1 + k.size()] == '}') {
          out += v;
          i += k.size() + 2;
          hit = true;
          break;
        }
      }
      if (hit) continue;
    }
    out += tmpl[i++];
  }
  return out;
}

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct Item {
  std::size_t file = 0;    // index into the inputs
  std::size_t doc = 0;     // document number in the whole run
  bool starts_doc = true;  // the template's leading ids come before this item
  bool ends_doc = true;    // the template's trailing ids and the end-of-text token follow this item
  std::string_view text;   // a plain-text piece or a JSONL line
  std::size_t line = 0;    // JSONL line number
};

bool raw_records(InputFormat f) { return f == InputFormat::Chat || f == InputFormat::Tokens; }

struct Result {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  std::string error;
  bool empty_doc = false;
};

std::string get_string(const json& rec, const std::string& field, const std::string& where, bool required) {
  auto f = rec.find(field);
  if (f == rec.end() || f->is_null()) {
    if (required) throw DataError(where + ": record has no field '" + field + "'");
    return {};
  }
  if (!f->is_string()) throw DataError(where + ": field '" + field + "' is not a string");
  return f->get<std::string>();
}

// What every worker needs to encode an item.
struct EncodeContext {
  const Tokenizer& tok;
  const BuildOptions& o;
  const std::vector<uint32_t>& before;  // the post-processor template's ids before and after a document
  const std::vector<uint32_t>& after;
};

// An instruction record: the rendered prompt masked out, the response trained on.
void encode_instruct(const EncodeContext& c, const json& rec, const std::string& where, Result& r) {
  std::string instruction, input, output;
  if (rec.contains("instruction")) {
    instruction = get_string(rec, "instruction", where, true);
    input = get_string(rec, "input", where, false);
    output = get_string(rec, "output", where, true);
  } else if (rec.contains("prompt")) {
    instruction = get_string(rec, "prompt", where, true);
    output = get_string(rec, "response", where, true);
  } else {
    throw DataError(where + ": record has neither instruction/output nor prompt/response fields");
  }
  const std::vector<std::pair<std::string, std::string>> vars{{"instruction", instruction},
                                                              {"prompt", instruction},
                                                              {"input", input},
                                                              {"output", output},
                                                              {"response", output}};
  const std::string prompt = render(input.empty() ? c.o.instruct.prompt_no_input : c.o.instruct.prompt, vars);
  const std::string response = render(c.o.instruct.response, vars);
  c.tok.encode(prompt, r.ids);
  r.mask.assign(r.ids.size(), 0);
  c.tok.encode(response, r.ids);
  r.ids.insert(r.ids.end(), c.after.begin(), c.after.end());
  r.mask.resize(r.ids.size(), 1);
}

// A JSONL record in the run's format (runs on the workers).
void encode_record(const EncodeContext& c, const Item& it, const std::string& where, Result& r) {
  const std::size_t bad = find_invalid_utf8(it.text);
  if (bad != std::string_view::npos)
    throw DataError(where + ": invalid UTF-8 at byte " + std::to_string(bad + 1) + " of the line");
  json rec;
  try {
    rec = json::parse(it.text);
  } catch (const json::parse_error& e) {
    throw DataError(where + ": not valid JSON (column " + std::to_string(e.byte) + ")");
  }
  if (!rec.is_object()) throw DataError(where + ": not a JSON object");
  switch (c.o.format) {
    case InputFormat::Jsonl: {
      const std::string text = get_string(rec, c.o.text_field, where, true);
      if (text.empty()) r.empty_doc = true;
      c.tok.encode(text, r.ids);
      r.ids.insert(r.ids.end(), c.after.begin(), c.after.end());
      return;
    }
    case InputFormat::Tokens:
      if (!rec.contains("input_ids") && rec.contains(c.o.text_field))
        throw DataError(where + ": record has '" + c.o.text_field + "' but the file's first record is " +
                        "pre-tokenized (input_ids): one kind of record per run");
      read_token_record(rec, c.tok.vocab_size(), where, r.ids, r.mask);
      return;
    case InputFormat::Chat:
      encode_chat(c.tok, render_chat(c.o.chat, rec, where), where, r.ids, r.mask);
      return;
    default:
      encode_instruct(c, rec, where, r);
  }
}

// Encodes one item (runs on the workers). Chat and pre-tokenized records are taken as they are: no
// post-processor template (the chat template writes its own BOS) and no end-of-text separator.
void encode_item(const EncodeContext& c, const std::string& file, const Item& it, Result& r) {
  try {
    if (it.starts_doc && !raw_records(c.o.format)) r.ids = c.before;
    if (c.o.format == InputFormat::Text) {
      c.tok.encode(it.text, r.ids);
      if (it.ends_doc) r.ids.insert(r.ids.end(), c.after.begin(), c.after.end());
      return;
    }
    encode_record(c, it, file + ":" + std::to_string(it.line), r);
  } catch (const std::exception& e) {
    r.error = e.what();
    if (c.o.format == InputFormat::Text) r.error = file + ": " + r.error;
  }
}

// Persistent worker threads: run() hands every worker the same job and returns when all have finished it.
class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // Runs job on every worker (and on the caller too when `join`); meanwhile calls (*tick)() every 10 ms.
  void run(const std::function<void()>& job, bool join, const std::function<void()>* tick) {
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = &job;
      active_ = threads_.size();
      ++gen_;
    }
    cv_.notify_all();
    if (join) job();
    std::unique_lock<std::mutex> lk(m_);
    while (active_ > 0) {
      if (tick) {
        lk.unlock();
        (*tick)();
        lk.lock();
      }
      done_.wait_for(lk, std::chrono::milliseconds(10), [&] { return active_ == 0; });
    }
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void()>* job;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || gen_ != seen; });
        if (stop_) return;
        seen = gen_;
        job = job_;
      }
      (*job)();
      std::lock_guard<std::mutex> lk(m_);
      if (--active_ == 0) done_.notify_all();
    }
  }
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable cv_, done_;
  const std::function<void()>* job_ = nullptr;
  std::size_t active_ = 0;
  uint64_t gen_ = 0;
  bool stop_ = false;
};

// How documents are framed in the shards: the tokenizer's template and separator, the token width.
struct Framing {
  uint32_t eot = 0;
  int width = 2;
  bool masked = false;                  // a `.mask` is written beside each shard
  std::vector<uint32_t> before, after;  // the post-processor template's ids around a document
  bool eot_after = true;                // the end-of-text token follows each document
};

Framing document_framing(const Tokenizer& tok, const BuildOptions& o) {
  if (o.inputs.empty()) throw DataError("megatrain-data: no input files");
  Framing f;
  const auto eot = tok.eot_id();
  if (!eot) throw DataError(tok.source() + ": the tokenizer has no end-of-text (special) token to separate documents");
  f.eot = *eot;
  f.width = o.token_bytes ? o.token_bytes : (tok.vocab_size() <= 65536 ? 2 : 4);
  if (f.width == 2 && tok.vocab_size() > 65536)
    throw DataError("megatrain-data: vocabulary of " + std::to_string(tok.vocab_size()) +
                    " does not fit uint16 tokens");
  f.masked = o.format == InputFormat::Instruct || raw_records(o.format);
  const auto& affixes = tok.single_affixes();
  if (o.add_special_tokens && !affixes)
    throw DataError(tok.source() + ": post_processor's single template does not hold the text once: " +
                    "documents cannot be wrapped in it (add_special_tokens off leaves it out)");
  if (o.add_special_tokens) {
    f.before = affixes->before;
    f.after = affixes->after;
  }
  // A template that ends documents with the end-of-text token (e.g. "$A <|endoftext|>"), or begins them
  // with it, already separates them: no second separator.
  f.eot_after = (f.after.empty() || f.after.back() != f.eot) && (f.before.empty() || f.before.front() != f.eot) &&
                !raw_records(o.format);
  if (o.shard_tokens == 0 || o.shard_tokens > uint64_t(INT32_MAX))
    throw DataError("megatrain-data: shard_tokens must be in [1, 2^31)");
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) throw DataError(o.out_dir + ": cannot create the output directory: " + ec.message());
  return f;
}

uint64_t input_bytes(const BuildOptions& o) {
  uint64_t total = 0;
  for (const auto& in : o.inputs) {
    struct stat st;
    if (::stat(in.c_str(), &st) != 0) throw DataError(in + ": no such input file");
    total += uint64_t(st.st_size);
  }
  return total;
}

// Where a block read from a file ends: after its last line (JSONL), or before a space between two ASCII
// letters (plain text, where the split regexes split anyway); 0 when there is no such place yet.
std::size_t block_cut(const std::string& block, bool lines, bool text_cuttable) {
  if (lines) {
    const std::size_t nl = block.rfind('\n');
    return nl != std::string::npos ? nl + 1 : 0;
  }
  if (!text_cuttable) return 0;
  for (std::size_t c = block.size() - 1; c > 0; --c)
    if (block[c] == ' ' && c + 1 < block.size() && ascii_alpha(block[c - 1]) && ascii_alpha(block[c + 1])) return c;
  return 0;
}

// Where a file's next block starts: lines before it, its start column and byte offset.
struct FilePosition {
  std::size_t line = 0, col = 1, off = 0;
  bool any = false;  // a text document has started
};

// The work items of one block: pieces of the file's text document, or its JSONL lines (one document each).
void block_items(const Tokenizer& tok, const BuildOptions& o, std::size_t fi, const std::string& buf, bool eof,
                 FilePosition& at, std::size_t& doc, std::vector<Item>& items) {
  const std::string& file = o.inputs[fi];
  if (o.format == InputFormat::Text) {
    const std::size_t bad = find_invalid_utf8(buf);
    if (bad != std::string::npos)
      throw DataError(where_in(file, buf, bad, at.line + 1, at.col, at.off) + ": invalid UTF-8");
    if (!buf.empty()) {
      const auto pieces = split_for_parallel(tok, buf, o.chunk_bytes);
      for (std::size_t i = 0; i < pieces.size(); ++i)
        items.push_back({fi, doc, !at.any && i == 0, eof && i + 1 == pieces.size(), pieces[i], 0});
      at.any = true;
    }
    const std::size_t nls = std::size_t(std::count(buf.begin(), buf.end(), '\n'));
    at.line += nls;
    at.col = nls ? buf.size() - buf.rfind('\n') : at.col + buf.size();
  } else {
    std::size_t pos = 0;
    while (pos < buf.size()) {
      std::size_t e = buf.find('\n', pos);
      if (e == std::string::npos) e = buf.size();
      ++at.line;
      std::string_view l(buf.data() + pos, e - pos);
      if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
      if (l.find_first_not_of(" \t") != std::string_view::npos) items.push_back({fi, doc++, true, true, l, at.line});
      pos = e + 1;
    }
  }
  at.off += buf.size();
}

// Reads input fi in blocks of about o.block_bytes, cut where block_cut() says (a text whose regex is not
// known to split there is read whole); each block goes to `bufs`, its items to `items`, then
// on_block(block bytes) runs.
void read_file(const Tokenizer& tok, const BuildOptions& o, std::size_t fi, std::size_t& doc,
               std::vector<std::unique_ptr<std::string>>& bufs, std::vector<Item>& items,
               const std::function<void(std::size_t)>& on_block) {
  const std::size_t kBlockBytes = std::max<std::size_t>(o.block_bytes, 1);
  const bool text_cuttable = o.format != InputFormat::Text || tok.splits_at_letter_spaces();
  const std::string& file = o.inputs[fi];
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError(file + ": cannot open input");
  std::string carry;
  FilePosition at;
  for (bool eof = false; !eof;) {
    std::string block = std::move(carry);
    carry.clear();
    const std::size_t had = block.size();
    block.resize(had + kBlockBytes);
    in.read(&block[had], std::streamsize(kBlockBytes));
    block.resize(had + std::size_t(in.gcount()));
    eof = in.eof() || in.gcount() == 0;
    if (in.bad()) throw DataError(file + ": read error at byte offset " + std::to_string(at.off + had));
    if (!eof) {
      const std::size_t cut = block_cut(block, o.format != InputFormat::Text, text_cuttable);
      if (cut == 0) {  // no place to cut yet: read more
        carry = std::move(block);
        continue;
      }
      carry = block.substr(cut);
      block.resize(cut);
    }
    bufs.push_back(std::make_unique<std::string>(std::move(block)));
    const std::string& buf = *bufs.back();
    block_items(tok, o, fi, buf, eof, at, doc, items);
    on_block(buf.size());
  }
  if (at.any) ++doc;
}

// `<prefix>dataset.json`: what was built, with which tokenizer and options.
ojson dataset_meta(const Tokenizer& tok, const BuildOptions& o, const BuildSummary& sum, uint32_t eot,
                   const std::vector<uint32_t>& before, const std::vector<uint32_t>& after, bool eot_after, int width,
                   bool masked, const std::vector<std::pair<std::string, uint64_t>> (&shards)[2]) {
  static const char* const kFormats[] = {"text", "jsonl", "instruct", "chat", "jsonl-tokens"};
  ojson meta;
  meta["created_by"] = "megatrain-data";
  meta["tokenizer"] = tok.source();
  meta["vocab_size"] = tok.vocab_size();
  meta["eot_id"] = eot;
  meta["add_special_tokens"] = o.add_special_tokens;
  meta["template"] = {{"before", before}, {"after", after}, {"eot_appended", eot_after}};
  meta["token_bytes"] = width;
  meta["format"] = kFormats[int(o.format)];
  if (o.format == InputFormat::Chat) meta["chat_template"] = o.chat.name;
  meta["loss_mask"] = masked;
  meta["val_fraction"] = o.val_fraction;
  meta["seed"] = o.seed;
  meta["documents"] = {{"train", sum.train_documents}, {"val", sum.val_documents}};
  meta["tokens"] = {{"train", sum.train_tokens}, {"val", sum.val_tokens}, {"masked", sum.masked_tokens}};
  const char* const split_names[2] = {"train", "val"};
  for (int k = 0; k < 2; ++k) {
    meta["shards"][split_names[k]] = ojson::array();
    for (const auto& [name, n] : shards[k]) meta["shards"][split_names[k]].push_back({{"file", name}, {"tokens", n}});
  }
  meta["inputs"] = o.inputs;
  return meta;
}

// Shards of an earlier run under the same names (train_NNNNNN / val_NNNNNN) that this run did not write
// would be picked up by a glob: removes them.
void remove_stale_shards(const BuildOptions& o, const std::vector<std::string>& committed, bool masked) {
  std::vector<std::filesystem::path> stale;
  for (const auto& e : std::filesystem::directory_iterator(o.out_dir)) {
    const std::string n = e.path().filename().string();
    for (const char* split : {"train_", "val_"}) {
      const std::string head = o.prefix + split;
      if (n.size() < head.size() + 6 || n.compare(0, head.size(), head) != 0) continue;
      const std::string rest = n.substr(head.size());
      if (rest.size() < 7 || rest.find_first_not_of("0123456789") != 6) continue;
      const std::string ext = rest.substr(6);
      if (ext != ".bin" && ext != ".mask" && ext != ".docs") continue;
      const std::string bin = o.out_dir + "/" + head + rest.substr(0, 6) + ".bin";
      const bool ours = std::find(committed.begin(), committed.end(), bin) != committed.end();
      if (!ours || (ext == ".mask" && !masked)) stale.push_back(e.path());
    }
  }
  for (const auto& p : stale) std::filesystem::remove(p);
}

// `--format jsonl` whose first record holds input_ids is pre-tokenized (InputFormat::Tokens); a chat run
// checks that the tokenizer holds its template's special tokens.
BuildOptions resolve_format(const Tokenizer& tok, const BuildOptions& options) {
  BuildOptions o = options;
  if (o.format == InputFormat::Chat) check_chat_tokens(o.chat, tok);
  if (o.format != InputFormat::Jsonl || o.inputs.empty()) return o;
  std::ifstream in(o.inputs[0], std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json rec = json::parse(line, nullptr, false);
    if (rec.is_object() && rec.contains("input_ids")) o.format = InputFormat::Tokens;
    break;
  }
  return o;
}

// Encodes a batch of items on the pool (and the caller, without a progress callback, which otherwise
// reports every 200 ms); results in item order.
std::vector<Result> encode_batch(Pool& pool, const EncodeContext& c, const std::vector<Item>& items,
                                 const std::function<void(const BuildProgress&)>& progress, const BuildProgress& prog,
                                 const std::function<double()>& elapsed) {
  std::vector<Result> res(items.size());
  std::atomic<std::size_t> next{0}, bytes{0};
  const std::function<void()> job = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < items.size();) {
      encode_item(c, c.o.inputs[items[i].file], items[i], res[i]);
      bytes += items[i].text.size() + (c.o.format == InputFormat::Text ? 0 : 1);
    }
  };
  int tick = 0;
  const std::function<void()> report = [&] {
    if (tick++ % 20 != 0) return;
    BuildProgress p = prog;
    p.bytes_done += bytes.load();
    p.seconds = elapsed();
    progress(p);
  };
  pool.run(job, !progress, progress ? &report : nullptr);
  return res;
}

// The split of a document: validation for a seeded hash of its number below val_fraction.
bool in_validation(const BuildOptions& o, std::size_t doc) {
  if (o.val_fraction <= 0) return false;
  return double(mix(o.seed ^ mix(doc)) >> 11) * (1.0 / 9007199254740992.0) < o.val_fraction;
}

// The shards of one split being written: the open writer and those committed.
struct Split {
  explicit Split(std::string n) : name(std::move(n)) {}
  std::string name;
  std::unique_ptr<ShardWriter> w;
  int index = 0;
  std::vector<std::pair<std::string, uint64_t>> shards;  // file name, tokens
  bool doc_starts = false;                               // the next token written starts a document
};

// On error: every shard of the run goes, open temporaries and committed shards (with their masks).
void remove_shards(Split (&splits)[2], const std::vector<std::string>& committed) {
  for (auto& s : splits) s.w.reset();  // removes the open temporaries
  for (const auto& p : committed) {
    std::remove(p.c_str());
    std::remove(mask_path_for(p).c_str());
    std::remove(docs_path_for(p).c_str());
  }
}

void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << text;
    if (!f) throw DataError(tmp + ": cannot write");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw DataError(path + ": cannot rename " + tmp + " onto it");
}

}  // namespace

InstructTemplate InstructTemplate::alpaca() {
  InstructTemplate t;
  t.prompt =
      "Below is an instruction that describes a task, paired with an input that provides further context. "
      "Write a response that appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n"
      "### Input:\n{input}\n\n### Response:\n";
  t.prompt_no_input =
      "Below is an instruction that describes a task. Write a response that appropriately completes the "
      "request.\n\n### Instruction:\n{instruction}\n\n### Response:\n";
  t.response = "{output}";
  return t;
}

InstructTemplate InstructTemplate::plain() {
  InstructTemplate t;
  t.prompt = "{instruction}\n{input}\n";
  t.prompt_no_input = "{instruction}\n";
  t.response = "{output}";
  return t;
}

InstructTemplate InstructTemplate::load(const std::string& name_or_path) {
  if (name_or_path == "alpaca") return alpaca();
  if (name_or_path == "plain") return plain();
  json j;
  try {
    j = json::parse(read_input(name_or_path));
  } catch (const json::parse_error& e) {
    throw DataError(name_or_path + ": template is not valid JSON: " + e.what());
  }
  InstructTemplate t;
  try {
    t.prompt = j.at("prompt").get<std::string>();
    t.prompt_no_input = j.value("prompt_no_input", t.prompt);
    t.response = j.value("response", std::string("{output}"));
  } catch (const json::exception& e) {
    throw DataError(name_or_path +
                    ": template needs a string 'prompt' (and optional 'prompt_no_input', 'response'): " + e.what());
  }
  return t;
}

std::vector<std::string_view> split_for_parallel(const Tokenizer& tok, std::string_view text, std::size_t target) {
  std::vector<std::string_view> out;
  if (target == 0 || text.size() <= target || !tok.splits_at_letter_spaces()) {
    out.push_back(text);
    return out;
  }
  std::size_t pos = 0;
  while (text.size() - pos > target) {
    std::size_t c = pos + target, cut = std::string_view::npos;
    while (c + 1 < text.size()) {
      const void* sp = std::memchr(text.data() + c, ' ', text.size() - c - 1);
      if (!sp) break;
      c = std::size_t(static_cast<const char*>(sp) - text.data());
      if (c > pos && ascii_alpha(text[c - 1]) && ascii_alpha(text[c + 1])) {
        cut = c;
        break;
      }
      ++c;
    }
    if (cut == std::string_view::npos) break;
    out.push_back(text.substr(pos, cut - pos));
    pos = cut;
  }
  out.push_back(text.substr(pos));
  return out;
}

BuildSummary build_shards(const Tokenizer& tok, const BuildOptions& options,
                          const std::function<void(const BuildProgress&)>& progress) {
  const BuildOptions o = resolve_format(tok, options);
  const auto t0 = std::chrono::steady_clock::now();
  const std::function<double()> elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const Framing fr = document_framing(tok, o);
  const bool masked = fr.masked;
  const int threads = std::max(1, o.threads);
  if (o.shard_tokens == 0 || o.shard_tokens > uint64_t(INT32_MAX))
    throw DataError("megatrain-data: shard_tokens must be in [1, 2^31)");
  {
    std::error_code ec;
    std::filesystem::create_directories(o.out_dir, ec);
    if (ec) throw DataError(o.out_dir + ": cannot create the output directory: " + ec.message());
  }

  BuildSummary sum;
  BuildProgress prog;
  prog.bytes_total = input_bytes(o);

  Split splits[2] = {Split("train"), Split("val")};
  std::vector<std::string> committed;
  auto commit = [&](Split& s) {
    if (!s.w) return;
    s.w->commit();
    committed.push_back(s.w->path());
    sum.bytes_out += s.w->bytes() + (masked ? kShardHeaderBytes + s.w->tokens() : 0);
    const std::string& p = s.w->path();
    s.shards.emplace_back(p.substr(p.find_last_of('/') + 1), s.w->tokens());
    s.w.reset();
  };
  auto write = [&](Split& s, const uint32_t* ids, const uint8_t* mask, std::size_t n) {
    while (n > 0) {
      if (!s.w) {
        char name[64];
        std::snprintf(name, sizeof name, "%s_%06d.bin", s.name.c_str(), s.index++);
        s.w = std::make_unique<ShardWriter>(o.out_dir + "/" + o.prefix + name, fr.width, masked, true);
      }
      if (std::exchange(s.doc_starts, false)) s.w->begin_document();  // the `.docs` sidecar records it
      const std::size_t room = std::size_t(o.shard_tokens) - s.w->tokens();
      const std::size_t k = std::min(room, n);
      s.w->append(ids, mask, k);
      ids += k;
      if (mask) mask += k;
      n -= k;
      if (s.w->tokens() >= o.shard_tokens) commit(s);
    }
  };

  const EncodeContext ctx{tok, o, fr.before, fr.after};

  // With a progress callback the calling thread reports while `threads` workers encode; without, it is
  // one of the workers. The pool lives for the whole run, so each worker's word cache stays warm.
  Pool pool(progress ? threads : threads - 1);
  try {
    std::size_t doc = 0;
    // Files are read into batches of about kBatchBytes (many small files are encoded together), each
    // batch is encoded by the pool, then written in order.
    const std::size_t kBatchBytes = 2 * std::max<std::size_t>(o.block_bytes, 1);
    std::vector<std::unique_ptr<std::string>> bufs;
    std::vector<Item> items;
    std::size_t batch_bytes = 0;
    std::size_t last_doc = ~std::size_t(0);  // a text document may span batches
    auto flush = [&] {
      std::vector<Result> res = encode_batch(pool, ctx, items, progress, prog, elapsed);
      // In order: the output does not depend on the thread count.
      for (std::size_t i = 0; i < items.size(); ++i) {
        Result& r = res[i];
        if (!r.error.empty()) throw DataError(r.error);
        Split& s = splits[in_validation(o, items[i].doc) ? 1 : 0];
        if (items[i].doc != last_doc) {
          s.doc_starts = true;
          last_doc = items[i].doc;
          ++sum.documents;
          ++(&s == &splits[1] ? sum.val_documents : sum.train_documents);
        }
        if (items[i].ends_doc && fr.eot_after) {
          r.ids.push_back(fr.eot);
          if (masked) r.mask.push_back(1);
        }
        write(s, r.ids.data(), masked ? r.mask.data() : nullptr, r.ids.size());
        (&s == &splits[1] ? sum.val_tokens : sum.train_tokens) += r.ids.size();
        if (masked) sum.masked_tokens += uint64_t(std::count(r.mask.begin(), r.mask.end(), uint8_t(0)));
        std::vector<uint32_t>().swap(r.ids);
        std::vector<uint8_t>().swap(r.mask);
      }
      prog.bytes_done += batch_bytes;
      prog.tokens = sum.train_tokens + sum.val_tokens;
      prog.documents = sum.documents;
      prog.seconds = elapsed();
      if (progress) progress(prog);
      items.clear();
      bufs.clear();
      batch_bytes = 0;
    };
    for (std::size_t fi = 0; fi < o.inputs.size(); ++fi)
      read_file(tok, o, fi, doc, bufs, items, [&](std::size_t bytes) {
        batch_bytes += bytes;
        if (batch_bytes >= kBatchBytes) flush();
      });
    flush();
    commit(splits[0]);
    commit(splits[1]);
    sum.tokens = sum.train_tokens + sum.val_tokens;
    sum.bytes_in = prog.bytes_total;
    const std::vector<std::pair<std::string, uint64_t>> shards[2] = {splits[0].shards, splits[1].shards};
    const ojson meta = dataset_meta(tok, o, sum, fr.eot, fr.before, fr.after, fr.eot_after, fr.width, masked, shards);
    remove_stale_shards(o, committed, masked);
    write_atomically(o.out_dir + "/" + o.prefix + "dataset.json", meta.dump(2) + "\n");
  } catch (...) {
    remove_shards(splits, committed);
    throw;
  }
  sum.shards = committed;
  sum.seconds = elapsed();
  return sum;
}

std::string resolved_packing(const std::string& packing, const std::string& train_files) {
  if (packing != "auto") return packing;
  std::vector<std::string> shards;
  try {
    shards = expand_shard_paths({train_files});
  } catch (const DataError&) {
    return "stream";  // the loader names the missing shards
  }
  if (shards.empty()) return "stream";
  // <dir>/<prefix>train_000000.bin -> <dir>/<prefix>dataset.json
  const std::filesystem::path first(shards.front());
  const std::string name = first.filename().string();
  std::string prefix;
  for (const char* split : {"train_", "val_"})
    if (const auto at = name.rfind(split); at != std::string::npos) prefix = name.substr(0, at);
  const std::filesystem::path meta_path = first.parent_path() / (prefix + "dataset.json");
  std::ifstream in(meta_path);
  if (!in) return "stream";
  const ojson meta = ojson::parse(in, nullptr, false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("format") || !meta["format"].is_string())
    return "stream";
  const std::string format = meta["format"].get<std::string>();
  return format == "instruct" || format == "chat" || format == "jsonl-tokens" ? "documents" : "stream";
}

}  // namespace mt::data
