#include "data/bpe_trainer.hpp"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "data/tokenizer.hpp"

namespace mt::data {

namespace {

using ojson = nlohmann::ordered_json;

inline uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }

// A tokenizer.json with the 256 byte tokens, no merges, and the trainer's pre-tokenizer and specials.
ojson skeleton(const BpeTrainerOptions& o) {
  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = ojson::array();
  j["normalizer"] = nullptr;
  if (o.split_pattern.empty() || o.split_pattern == kGpt2SplitPattern) {
    j["pre_tokenizer"] = {
        {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  } else {
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", ojson::array({ojson{{"type", "Split"},
                                                                {"pattern", {{"Regex", o.split_pattern}}},
                                                                {"behavior", "Isolated"},
                                                                {"invert", false}},
                                                          ojson{{"type", "ByteLevel"},
                                                                {"add_prefix_space", false},
                                                                {"trim_offsets", false},
                                                                {"use_regex", false}}})}};
  }
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  ojson vocab = ojson::object();
  for (int b = 0; b < 256; ++b) vocab[Tokenizer::byte_to_unicode(uint8_t(b))] = b;
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", ojson::array()}};
  return j;
}

std::string to_bytelevel(const std::string& raw) {
  std::string s;
  for (unsigned char c : raw) s += Tokenizer::byte_to_unicode(c);
  return s;
}

// The words being merged (each a sequence of token ids, with its count) and every adjacent pair's count
// over them, with the words each pair may occur in (stale entries allowed: a merge rechecks).
struct PairCounts {
  std::vector<std::vector<uint32_t>> words;
  std::vector<uint64_t> freq;
  std::unordered_map<uint64_t, int64_t> pc;                   // pair -> count
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;  // pair -> words

  // Adds (sign +1) or removes (-1) word w's pairs; `changed` collects the pairs touched.
  void count(uint32_t w, int sign, std::vector<uint64_t>* changed) {
    const auto& s = words[w];
    const int64_t fw = sign * int64_t(freq[w]);
    for (std::size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = pair_key(s[i], s[i + 1]);
      pc[k] += fw;
      if (changed) changed->push_back(k);
      if (sign < 0) continue;
      auto& v = where[k];
      if (v.empty() || v.back() != w) v.push_back(w);
    }
  }

  // Replaces every (a, b) in the words that hold it by `merged`; returns the pairs whose count changed.
  std::vector<uint64_t> merge(uint32_t a, uint32_t b, uint32_t merged) {
    const uint64_t key = pair_key(a, b);
    std::vector<uint64_t> changed;
    std::vector<uint32_t> ws = std::move(where[key]);
    where.erase(key);
    for (uint32_t w : ws) {
      auto& s = words[w];
      bool has = false;
      for (std::size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;
      count(w, -1, &changed);
      std::size_t out = 0;
      for (std::size_t i = 0; i < s.size();) {
        const bool hit = i + 1 < s.size() && s[i] == a && s[i + 1] == b;
        s[out++] = hit ? merged : s[i];
        i += hit ? 2 : 1;
      }
      s.resize(out);
      count(w, +1, &changed);
    }
    pc.erase(key);
    std::sort(changed.begin(), changed.end());
    changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
    return changed;
  }
};

// A special token's added_tokens entry, matched verbatim.
ojson special_token(uint32_t id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

// The trained tokenizer.json: the merged tokens, the merges in order, then the special tokens.
ojson trained_json(const BpeTrainerOptions& o, const std::vector<std::string>& tok,
                   const std::vector<std::pair<uint32_t, uint32_t>>& merges) {
  ojson j = skeleton(o);
  ojson& vocab = j["model"]["vocab"];
  for (uint32_t id = 256; id < tok.size(); ++id) vocab[to_bytelevel(tok[id])] = id;
  ojson& jm = j["model"]["merges"];
  for (const auto& [a, b] : merges) jm.push_back(to_bytelevel(tok[a]) + " " + to_bytelevel(tok[b]));
  uint32_t id = uint32_t(tok.size());
  for (const auto& s : o.special_tokens) {
    j["added_tokens"].push_back(special_token(id, s));
    vocab[s] = id++;
  }
  return j;
}

}  // namespace

struct BpeTrainer::Impl {
  BpeTrainerOptions opt;
  Tokenizer pre;  // pre-tokenizer only
  std::unordered_map<std::string, uint64_t> counts;
  uint64_t word_tokens = 0;

  explicit Impl(BpeTrainerOptions o)
      : opt(std::move(o)), pre(Tokenizer::from_hf_json_text(skeleton_with_specials(opt).dump(), "bpe-trainer")) {}

  static ojson skeleton_with_specials(const BpeTrainerOptions& o) {
    ojson j = skeleton(o);
    uint32_t id = 256;
    for (const auto& s : o.special_tokens) j["added_tokens"].push_back(special_token(id++, s));
    return j;
  }
};

BpeTrainer::BpeTrainer(BpeTrainerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  const uint32_t floor = 256 + uint32_t(impl_->opt.special_tokens.size());
  if (impl_->opt.vocab_size < floor)
    throw DataError("bpe trainer: vocab_size " + std::to_string(impl_->opt.vocab_size) + " is below " +
                    std::to_string(floor) + " (256 bytes + special tokens)");
}

BpeTrainer::~BpeTrainer() = default;

void BpeTrainer::add_text(std::string_view text) {
  Impl& m = *impl_;
  std::string key;
  m.pre.for_each_pretoken(text, [&](std::string_view w) {
    key.assign(w.data(), w.size());
    ++m.counts[key];
    ++m.word_tokens;
  });
}

std::string BpeTrainer::train(BpeTrainStats* stats) {
  Impl& m = *impl_;
  const BpeTrainerOptions& o = m.opt;
  // Words, in a deterministic order.
  std::vector<std::pair<std::string, uint64_t>> wc(m.counts.begin(), m.counts.end());
  std::sort(wc.begin(), wc.end());
  PairCounts pairs;
  pairs.words.resize(wc.size());
  pairs.freq.resize(wc.size());
  for (std::size_t i = 0; i < wc.size(); ++i) {
    for (unsigned char c : wc[i].first) pairs.words[i].push_back(c);
    pairs.freq[i] = wc[i].second;
  }
  std::vector<std::string> tok(256);  // id -> raw bytes
  for (int b = 0; b < 256; ++b) tok[std::size_t(b)] = std::string(1, char(b));
  std::unordered_map<std::string, uint32_t> tok_id;
  for (uint32_t b = 0; b < 256; ++b) tok_id[tok[b]] = b;
  for (uint32_t w = 0; w < pairs.words.size(); ++w) pairs.count(w, +1, nullptr);

  struct Cand {
    int64_t count;
    uint64_t key;
  };
  auto less = [&](const Cand& x, const Cand& y) {  // priority: count, then smaller bytes of (a, b)
    if (x.count != y.count) return x.count < y.count;
    const std::string& xa = tok[x.key >> 32];
    const std::string& ya = tok[y.key >> 32];
    if (xa != ya) return xa > ya;
    return tok[uint32_t(x.key)] > tok[uint32_t(y.key)];
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(less)> pq(less);
  for (const auto& [k, c] : pairs.pc) pq.push({c, k});

  const uint32_t target = o.vocab_size - uint32_t(o.special_tokens.size());
  std::vector<std::pair<uint32_t, uint32_t>> merges;
  uint32_t nvocab = 256;
  while (nvocab < target && !pq.empty()) {
    const Cand c = pq.top();
    pq.pop();
    auto it = pairs.pc.find(c.key);
    const int64_t cur = it == pairs.pc.end() ? 0 : it->second;
    if (cur != c.count) {  // stale entry: requeue with the current count
      if (cur > 0) pq.push({cur, c.key});
      continue;
    }
    if (cur < int64_t(o.min_frequency) || cur <= 0) break;
    const uint32_t a = uint32_t(c.key >> 32), b = uint32_t(c.key);
    const std::string merged = tok[a] + tok[b];
    auto [found, added] = tok_id.emplace(merged, uint32_t(tok.size()));
    if (added) {
      tok.push_back(merged);
      ++nvocab;
    }
    merges.emplace_back(a, b);
    for (uint64_t k : pairs.merge(a, b, found->second)) {
      auto pit = pairs.pc.find(k);
      if (pit == pairs.pc.end()) continue;
      if (pit->second <= 0) {
        pairs.pc.erase(pit);
        continue;
      }
      pq.push({pit->second, k});
    }
  }

  const ojson j = trained_json(o, tok, merges);
  if (stats) {
    stats->words = wc.size();
    stats->word_tokens = m.word_tokens;
    stats->merges = uint32_t(merges.size());
    stats->vocab_size = uint32_t(tok.size() + o.special_tokens.size());
  }
  return j.dump(1);
}

}  // namespace mt::data
