// megatrain-data: tokenizers, token shards and the demo corpus, from the command line.
//   megatrain-data extract-austen [--package-dir DIR] [--chapters] [--out FILE]
//   megatrain-data train-tokenizer --out tokenizer.json [--vocab-size N] [--special TOKEN]... [--pattern P] FILES...
//   megatrain-data shards --tokenizer PATH --out DIR [options] FILES...
//   megatrain-data inspect [--tokenizer PATH] [--format F] [--show N] SHARDS...
//   megatrain-data encode --tokenizer PATH [--no-special] [--no-add-special-tokens] [TEXT]   (stdin when no TEXT)
//   megatrain-data decode --tokenizer PATH IDS...
//   megatrain-data render-chat [--chat-template T] [--tokenizer PATH] FILE.jsonl
// Errors print one line naming the file and line or offset, and exit 1; usage errors exit 2.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "data/bpe_trainer.hpp"
#include "data/dataset_builder.hpp"
#include "data/rdata.hpp"
#include "data/shard.hpp"
#include "data/tokenizer.hpp"

using namespace mt::data;

namespace {

const char* kUsage = R"(usage: megatrain-data COMMAND [OPTIONS]

commands:
  extract-austen    Jane Austen's six novels from Debian's r-cran-janeaustenr (no R needed)
      --package-dir DIR   default /usr/lib/R/site-library/janeaustenr
      --chapters          JSONL, one {"text", "book", "chapter"} record per chapter (default: plain text)
      --out FILE          default: standard output
  train-tokenizer   learn a byte-level BPE vocabulary; writes a Hugging Face tokenizer.json
      --out FILE          (required)
      --vocab-size N      default 4096 (bytes + merges + special tokens)
      --special TOKEN     special token (repeatable; default <|endoftext|>)
      --pattern P         split regex: gpt2 (default), llama3, qwen2, or a regex
      --min-frequency N   default 2
      --format F          text (default: each file is text) or jsonl (with --text-field, default text)
  shards            encode text, JSONL or instruction records into llm.c token shards
      --tokenizer PATH    tokenizer.json, or a directory with tokenizer.json or encoder.json + vocab.bpe
      --out DIR           (required) output directory
      --format F          text (each file one document), jsonl (one document per line; records with
                          input_ids, optional labels and attention_mask, are taken as tokens: labels
                          -100 and padding masked), instruct (JSONL records instruction/input/output or
                          prompt/response; prompt masked), chat (JSONL {"messages": [{"role", "content"}]}
                          rendered with --chat-template; only assistant turns are trained on)
      --chat-template T   qwen3, llama3, mistral, or a JSON role template (data/README.md); default:
                          chosen by the tokenizer's special tokens
      --text-field NAME   JSONL field holding the text (default text)
      --template T        instruct template: alpaca (default), plain, or a JSON file with
                          "prompt", "prompt_no_input", "response" ({instruction} {input} {prompt}
                          {output} {response} placeholders)
      --no-add-special-tokens   leave out the tokenizer's post-processor template (the BOS/EOS that
                          Hugging Face's tokenizer(text) adds by default, e.g. Llama-3's <|begin_of_text|>)
      --val-fraction F    share of documents for validation (default 0)
      --seed S            of the train/validation split (default 1337)
      --shard-tokens N    tokens per shard (default 100000000)
      --token-bytes B     2 or 4 (default: 2 when the vocabulary fits uint16)
      --threads N         encoding threads (default: all cores)
      --prefix P          shard name prefix (earlier <P>train_NNNNNN / <P>val_NNNNNN shards in DIR are replaced)
      --progress / --no-progress   progress bar on stderr (default: when stderr is a terminal)
  render-chat       print each chat record as the chat format renders it: JSON lines with "text" and
                    "trained" (byte ranges), and "ids", "mask" with --tokenizer
      --chat-template T   as for shards (required without --tokenizer)
      --tokenizer PATH    also encode, as shards does
  inspect           print a shard's format, token count and first tokens
      --tokenizer PATH    also decode the first tokens
      --format F          auto (default), llmc, nanogpt, megatron
      --show N            tokens to show (default 16)
  encode            print the ids of TEXT (or of standard input) as Hugging Face's tokenizer(text) gives them
      --tokenizer PATH
      --no-special        special tokens in the text as plain text
      --no-add-special-tokens   without the post-processor's BOS/EOS (add_special_tokens=False)
  decode            print the text of IDS
      --tokenizer PATH
)";

struct Args {
  std::map<std::string, std::vector<std::string>> opt;
  std::vector<std::string> pos;
  bool has(const std::string& k) const { return opt.count(k) > 0; }
  std::string get(const std::string& k, const std::string& def = "") const {
    auto f = opt.find(k);
    return f == opt.end() ? def : f->second.back();
  }
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "megatrain-data: %s\n(run megatrain-data --help for usage)\n", msg.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv, int first, const std::vector<std::string>& flags,
           const std::vector<std::string>& valued) {
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) == 0 && s.size() > 2) {
      std::string val;
      const auto eq = s.find('=');
      bool has_val = false;
      if (eq != std::string::npos) {
        val = s.substr(eq + 1);
        s = s.substr(0, eq);
        has_val = true;
      }
      const std::string k = s.substr(2);
      if (std::find(flags.begin(), flags.end(), k) != flags.end()) {
        if (has_val) usage_error("option --" + k + " takes no value");
        a.opt[k].push_back("1");
      } else if (std::find(valued.begin(), valued.end(), k) != valued.end()) {
        if (!has_val) {
          if (i + 1 >= argc) usage_error("option --" + k + " needs a value");
          val = argv[++i];
        }
        a.opt[k].push_back(val);
      } else {
        usage_error("unknown option --" + k);
      }
    } else {
      a.pos.push_back(s);
    }
  }
  return a;
}

uint64_t to_u64(const std::string& k, const std::string& v) {
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || *end || v[0] == '-') usage_error("--" + k + " needs a non-negative integer, not '" + v + "'");
  return x;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw DataError(path + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Writes `data` to `path` atomically (temporary name, then rename); "-" or "" is standard output.
void write_out(const std::string& path, const std::string& data) {
  if (path.empty() || path == "-") {
    std::fwrite(data.data(), 1, data.size(), stdout);
    return;
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(data.data(), std::streamsize(data.size()));
    if (!f) {
      std::remove(tmp.c_str());
      throw DataError(tmp + ": cannot write");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw DataError(path + ": cannot rename " + tmp + " onto it");
  }
}

std::string human(double v, const char* unit) {
  char b[64];
  if (v >= 1e9)
    std::snprintf(b, sizeof b, "%.2f G%s", v / 1e9, unit);
  else if (v >= 1e6)
    std::snprintf(b, sizeof b, "%.2f M%s", v / 1e6, unit);
  else if (v >= 1e3)
    std::snprintf(b, sizeof b, "%.1f k%s", v / 1e3, unit);
  else
    std::snprintf(b, sizeof b, "%.0f %s", v, unit);
  return b;
}

// ---------------------------------------------------------------------------------------------------------
int cmd_extract_austen(int argc, char** argv) {
  const Args a = parse(argc, argv, 2, {"chapters"}, {"package-dir", "out"});
  const std::string dir = a.get("package-dir", "/usr/lib/R/site-library/janeaustenr");
  std::string out;
  if (!a.has("chapters")) {
    out = janeaustenr_text(dir);
  } else {
    for (const auto& book : read_janeaustenr(dir)) {
      std::string text;
      int chapter = 0;
      auto flush = [&] {
        if (text.find_first_not_of(" \n") == std::string::npos) return;
        nlohmann::ordered_json j{{"text", text}, {"book", book.name}, {"chapter", chapter}};
        out += j.dump() + "\n";
        text.clear();
      };
      for (const auto& line : book.values) {
        if ((line.rfind("CHAPTER ", 0) == 0 || line.rfind("Chapter ", 0) == 0) && chapter++ > 0) flush();
        text += line;
        text += '\n';
      }
      flush();
    }
  }
  write_out(a.get("out"), out);
  return 0;
}

int cmd_train_tokenizer(int argc, char** argv) {
  const Args a =
      parse(argc, argv, 2, {}, {"out", "vocab-size", "special", "pattern", "min-frequency", "format", "text-field"});
  if (!a.has("out")) usage_error("train-tokenizer needs --out FILE");
  if (a.pos.empty()) usage_error("train-tokenizer needs input files");
  BpeTrainerOptions o;
  o.vocab_size = uint32_t(to_u64("vocab-size", a.get("vocab-size", "4096")));
  if (a.has("special")) o.special_tokens = a.opt.at("special");
  const std::string p = a.get("pattern", "gpt2");
  o.split_pattern = p == "gpt2"     ? kGpt2SplitPattern
                    : p == "llama3" ? kLlama3SplitPattern
                    : p == "qwen2"  ? kQwen2SplitPattern
                                    : p;
  o.min_frequency = to_u64("min-frequency", a.get("min-frequency", "2"));
  const std::string fmt = a.get("format", "text"), field = a.get("text-field", "text");
  if (fmt != "text" && fmt != "jsonl") usage_error("--format must be text or jsonl");
  const auto t0 = std::chrono::steady_clock::now();
  BpeTrainer tr(o);
  uint64_t bytes = 0;
  for (const auto& f : a.pos) {
    const std::string text = read_text(f);
    bytes += text.size();
    if (fmt == "text") {
      const std::size_t bad = find_invalid_utf8(text);
      if (bad != std::string::npos) {
        const std::size_t line = 1 + std::size_t(std::count(text.begin(), text.begin() + std::ptrdiff_t(bad), '\n'));
        throw DataError(f + ":" + std::to_string(line) + ": invalid UTF-8 at byte offset " + std::to_string(bad));
      }
      tr.add_text(text);
      continue;
    }
    std::istringstream in(text);
    std::string line;
    for (std::size_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        throw DataError(f + ":" + std::to_string(n) + ": not valid JSON (column " + std::to_string(e.byte) + ")");
      }
      if (!j.is_object() || !j.contains(field) || !j[field].is_string())
        throw DataError(f + ":" + std::to_string(n) + ": record has no string field '" + field + "'");
      tr.add_text(j[field].get<std::string>());
    }
  }
  BpeTrainStats st;
  const std::string js = tr.train(&st);
  write_out(a.get("out"), js);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("train-tokenizer: %s of text, %lu distinct words, %u merges, vocabulary %u, %.2f s -> %s\n",
              human(double(bytes), "B").c_str(), (unsigned long)st.words, st.merges, st.vocab_size, s,
              a.get("out").c_str());
  return 0;
}

int cmd_shards(int argc, char** argv) {
  const Args a = parse(argc, argv, 2, {"progress", "no-progress", "no-add-special-tokens"},
                       {"tokenizer", "out", "format", "text-field", "template", "chat-template", "val-fraction", "seed",
                        "shard-tokens", "token-bytes", "threads", "prefix", "chunk-bytes"});
  if (!a.has("tokenizer")) usage_error("shards needs --tokenizer PATH");
  if (!a.has("out")) usage_error("shards needs --out DIR");
  if (a.pos.empty()) usage_error("shards needs input files");
  BuildOptions o;
  o.inputs = a.pos;
  o.out_dir = a.get("out");
  o.prefix = a.get("prefix");
  const std::string fmt = a.get("format", "text");
  if (fmt == "text")
    o.format = InputFormat::Text;
  else if (fmt == "jsonl")
    o.format = InputFormat::Jsonl;
  else if (fmt == "instruct")
    o.format = InputFormat::Instruct;
  else if (fmt == "chat")
    o.format = InputFormat::Chat;
  else
    usage_error("--format must be text, jsonl, instruct or chat, not '" + fmt + "'");
  o.text_field = a.get("text-field", "text");
  o.add_special_tokens = !a.has("no-add-special-tokens");
  if (a.has("template")) o.instruct = InstructTemplate::load(a.get("template"));
  const std::string vf = a.get("val-fraction", "0");
  char* end = nullptr;
  o.val_fraction = std::strtod(vf.c_str(), &end);
  if (*end || o.val_fraction < 0 || o.val_fraction >= 1) usage_error("--val-fraction must be in [0, 1)");
  o.seed = to_u64("seed", a.get("seed", "1337"));
  o.shard_tokens = to_u64("shard-tokens", a.get("shard-tokens", "100000000"));
  if (o.shard_tokens == 0 || o.shard_tokens > uint64_t(INT32_MAX)) usage_error("--shard-tokens must be in [1, 2^31)");
  o.token_bytes = int(to_u64("token-bytes", a.get("token-bytes", "0")));
  if (o.token_bytes != 0 && o.token_bytes != 2 && o.token_bytes != 4) usage_error("--token-bytes must be 2 or 4");
  o.threads =
      int(to_u64("threads", a.get("threads", std::to_string(std::max(1u, std::thread::hardware_concurrency())))));
  if (a.has("chunk-bytes")) o.chunk_bytes = to_u64("chunk-bytes", a.get("chunk-bytes"));
  const bool show = a.has("progress") || (!a.has("no-progress") && ::isatty(2));
  const Tokenizer tok = Tokenizer::load(a.get("tokenizer"));
  if (o.format == InputFormat::Chat)
    o.chat = a.has("chat-template") ? ChatTemplate::load(a.get("chat-template")) : ChatTemplate::for_tokenizer(tok);
  std::function<void(const BuildProgress&)> bar;
  if (show) {
    bar = [](const BuildProgress& p) {
      const double f = p.bytes_total ? double(p.bytes_done) / double(p.bytes_total) : 1.0;
      const int w = 30, n = int(f * w);
      std::string b(std::size_t(n), '=');
      if (n < w) b += '>';
      b.resize(w, ' ');
      std::fprintf(stderr, "\r[%s] %5.1f%%  %s  %s/s  %s docs  %s  ", b.c_str(), 100 * f,
                   human(double(p.bytes_done), "B").c_str(),
                   human(double(p.bytes_done) / std::max(p.seconds, 1e-9), "B").c_str(),
                   human(double(p.documents), "").c_str(), human(double(p.tokens), "tok").c_str());
      std::fflush(stderr);
    };
  }
  const BuildSummary s = build_shards(tok, o, bar);
  if (show) std::fprintf(stderr, "\n");
  std::printf(
      "shards: %lu documents (%lu train, %lu val), %lu tokens (%lu train, %lu val%s), %s in, %s out, %zu shard(s)\n",
      (unsigned long)s.documents, (unsigned long)s.train_documents, (unsigned long)s.val_documents,
      (unsigned long)s.tokens, (unsigned long)s.train_tokens, (unsigned long)s.val_tokens,
      o.format != InputFormat::Text && o.format != InputFormat::Jsonl
          ? (", " + std::to_string(s.masked_tokens) + " masked").c_str()
          : "",
      human(double(s.bytes_in), "B").c_str(), human(double(s.bytes_out), "B").c_str(), s.shards.size());
  std::printf("shards: %.2f s, %s/s, %s/s, %d thread(s) -> %s\n", s.seconds,
              human(double(s.tokens) / s.seconds, "tok").c_str(), human(double(s.bytes_in) / s.seconds, "B").c_str(),
              o.threads, o.out_dir.c_str());
  return 0;
}

int cmd_inspect(int argc, char** argv) {
  const Args a = parse(argc, argv, 2, {}, {"tokenizer", "format", "show"});
  if (a.pos.empty()) usage_error("inspect needs shard files");
  const std::string f = a.get("format", "auto");
  ShardFormat fmt = ShardFormat::Auto;
  if (f == "llmc")
    fmt = ShardFormat::LlmC;
  else if (f == "nanogpt")
    fmt = ShardFormat::NanoGpt;
  else if (f == "megatron")
    fmt = ShardFormat::Megatron;
  else if (f != "auto")
    usage_error("--format must be auto, llmc, nanogpt or megatron");
  const std::size_t show = to_u64("show", a.get("show", "16"));
  std::unique_ptr<Tokenizer> tok;
  if (a.has("tokenizer")) tok = std::make_unique<Tokenizer>(Tokenizer::load(a.get("tokenizer")));
  for (const auto& p : a.pos) {
    const TokenShard s = TokenShard::open(p, fmt);
    const char* fn = s.format() == ShardFormat::LlmC      ? "llm.c"
                     : s.format() == ShardFormat::NanoGpt ? "nanogpt"
                                                          : "megatron";
    uint32_t mx = 0;
    std::size_t masked = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      mx = std::max(mx, s[i]);
      masked += s.mask(i) == 0;
    }
    std::printf("%s: %s, %d-byte tokens, %zu tokens, max id %u%s", p.c_str(), fn, s.token_bytes(), s.size(), mx,
                s.has_mask() ? "" : "\n");
    if (s.has_mask()) std::printf(", mask: %zu of %zu tokens excluded from the loss\n", masked, s.size());
    std::vector<uint32_t> head(std::min(show, s.size()));
    s.copy(0, head.size(), head.data());
    std::printf("  first ids:");
    for (uint32_t x : head) std::printf(" %u", x);
    std::printf("\n");
    if (tok)
      std::printf(
          "  text: %s\n",
          nlohmann::json(tok->decode(head)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return 0;
}

int cmd_encode(int argc, char** argv) {
  const Args a = parse(argc, argv, 2, {"no-special", "no-add-special-tokens"}, {"tokenizer"});
  if (!a.has("tokenizer")) usage_error("encode needs --tokenizer PATH");
  const Tokenizer tok = Tokenizer::load(a.get("tokenizer"));
  std::string text;
  if (a.pos.empty()) {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    text = ss.str();
  } else {
    for (std::size_t i = 0; i < a.pos.size(); ++i) text += (i ? " " : "") + a.pos[i];
  }
  const auto ids = tok.encode_single(text, !a.has("no-add-special-tokens"), !a.has("no-special"));
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
  std::printf("%s\n", out.c_str());
  return 0;
}

int cmd_render_chat(int argc, char** argv) {
  const Args a = parse(argc, argv, 2, {}, {"chat-template", "tokenizer"});
  if (!a.has("chat-template") && !a.has("tokenizer")) usage_error("render-chat needs --chat-template or --tokenizer");
  if (a.pos.size() != 1) usage_error("render-chat needs one JSONL file");
  std::optional<Tokenizer> tok;
  if (a.has("tokenizer")) tok.emplace(Tokenizer::load(a.get("tokenizer")));
  const ChatTemplate t =
      a.has("chat-template") ? ChatTemplate::load(a.get("chat-template")) : ChatTemplate::for_tokenizer(*tok);
  std::ifstream in(a.pos[0], std::ios::binary);
  if (!in) throw DataError(a.pos[0] + ": cannot open input");
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = a.pos[0] + ":" + std::to_string(n);
    nlohmann::json rec;
    try {
      rec = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw DataError(where + ": not valid JSON (column " + std::to_string(e.byte) + ")");
    }
    const RenderedChat chat = render_chat(t, rec, where);
    nlohmann::json out{{"text", chat.text}, {"trained", chat.trained}};
    if (tok) {
      std::vector<uint32_t> ids;
      std::vector<uint8_t> mask;
      encode_chat(*tok, chat, where, ids, mask);
      out["ids"] = ids;
      out["mask"] = mask;
    }
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

int cmd_decode(int argc, char** argv) {
  const Args a = parse(argc, argv, 2, {}, {"tokenizer"});
  if (!a.has("tokenizer")) usage_error("decode needs --tokenizer PATH");
  const Tokenizer tok = Tokenizer::load(a.get("tokenizer"));
  std::vector<uint32_t> ids;
  for (const auto& p : a.pos) ids.push_back(uint32_t(to_u64("ids", p)));
  const std::string s = tok.decode(ids);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "extract-austen") return cmd_extract_austen(argc, argv);
    if (cmd == "train-tokenizer") return cmd_train_tokenizer(argc, argv);
    if (cmd == "shards") return cmd_shards(argc, argv);
    if (cmd == "inspect") return cmd_inspect(argc, argv);
    if (cmd == "encode") return cmd_encode(argc, argv);
    if (cmd == "decode") return cmd_decode(argc, argv);
    if (cmd == "render-chat") return cmd_render_chat(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain-data: error: %s\n", e.what());
    return 1;
  }
  usage_error("unknown command '" + cmd + "'");
}
