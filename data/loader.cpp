#include "data/loader.hpp"

#include <glob.h>
#include <sys/stat.h>
#include <algorithm>

#include <nlohmann/json.hpp>

namespace mt::data {

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, n) without modulo bias (rejection of the short top range).
uint64_t bounded(uint64_t& s, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;
  uint64_t r;
  do r = splitmix64(s);
  while (r < threshold);
  return r % n;
}

}  // namespace

bool Cursor::operator==(const Cursor& o) const {
  return seed == o.seed && epoch == o.epoch && position == o.position && batches == o.batches && windows == o.windows &&
         tokens == o.tokens && batch_size == o.batch_size && seq_len == o.seq_len && world_size == o.world_size &&
         shuffle == o.shuffle;
}

void to_json(nlohmann::json& j, const Cursor& c) {
  j = nlohmann::json{{"seed", c.seed},
                     {"epoch", c.epoch},
                     {"position", c.position},
                     {"batches", c.batches},
                     {"windows", c.windows},
                     {"tokens", c.tokens},
                     {"batch_size", c.batch_size},
                     {"seq_len", c.seq_len},
                     {"world_size", c.world_size},
                     {"shuffle", c.shuffle}};
}

void from_json(const nlohmann::json& j, Cursor& c) {
  j.at("seed").get_to(c.seed);
  j.at("epoch").get_to(c.epoch);
  j.at("position").get_to(c.position);
  j.at("batches").get_to(c.batches);
  j.at("windows").get_to(c.windows);
  j.at("tokens").get_to(c.tokens);
  j.at("batch_size").get_to(c.batch_size);
  j.at("seq_len").get_to(c.seq_len);
  j.at("world_size").get_to(c.world_size);
  j.at("shuffle").get_to(c.shuffle);
}

std::vector<std::string> expand_shard_paths(const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  for (const auto& p : patterns) {
    if (p.find_first_of("*?[") == std::string::npos) {
      struct stat st;
      if (::stat(p.c_str(), &st) != 0) throw DataError(p + ": no such shard");
      out.push_back(p);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(p.c_str(), 0, nullptr, &g);
    if (rc != 0) {
      ::globfree(&g);
      throw DataError(p + ": pattern matches no shard");
    }
    std::vector<std::string> m(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    ::globfree(&g);
    std::sort(m.begin(), m.end());
    out.insert(out.end(), m.begin(), m.end());
  }
  return out;
}

struct DataLoader::Impl {
  LoaderOptions opt;
  std::vector<std::string> paths;
  std::vector<TokenShard> shards;
  std::vector<uint64_t> first_window;  // prefix sums of windows per shard (size shards+1)
  std::vector<uint64_t> order;         // this epoch's window order (empty when not shuffling)
  uint64_t order_epoch = ~uint64_t(0);
  Cursor cur;
  std::vector<uint32_t> buf;

  void build_order() {
    if (!opt.shuffle || order_epoch == cur.epoch) return;
    const uint64_t n = cur.windows;
    order.resize(n);
    for (uint64_t i = 0; i < n; ++i) order[i] = i;
    uint64_t s = cur.seed ^ (0xA0761D6478BD642Full * (cur.epoch + 1));
    for (uint64_t i = n; i > 1; --i) std::swap(order[i - 1], order[bounded(s, i)]);
    order_epoch = cur.epoch;
  }
};

DataLoader::DataLoader(LoaderOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = std::move(options);
  const LoaderOptions& o = m.opt;
  if (o.batch_size < 1 || o.seq_len < 1) throw DataError("data loader: batch_size and seq_len must be >= 1");
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    throw DataError("data loader: rank " + std::to_string(o.rank) + " outside world of " +
                    std::to_string(o.world_size));
  if (o.shards.empty()) throw DataError("data loader: no shards given");
  m.paths = expand_shard_paths(o.shards);
  m.first_window.push_back(0);
  uint64_t tokens = 0;
  for (const auto& p : m.paths) {
    m.shards.push_back(TokenShard::open(p, o.format, o.use_mask, o.documents));
    const uint64_t n = m.shards.back().size();
    tokens += n;
    const uint64_t w = n > uint64_t(o.seq_len) ? (n - 1) / uint64_t(o.seq_len) : 0;
    m.first_window.push_back(m.first_window.back() + w);
  }
  m.cur.seed = o.seed;
  m.cur.windows = m.first_window.back();
  m.cur.tokens = tokens;
  m.cur.batch_size = o.batch_size;
  m.cur.seq_len = o.seq_len;
  m.cur.world_size = o.world_size;
  m.cur.shuffle = o.shuffle;
  const uint64_t per_step = uint64_t(o.batch_size) * uint64_t(o.world_size);
  if (m.cur.windows < per_step)
    throw TooFewTokens("data loader: " + std::to_string(tokens) + " tokens in " + std::to_string(m.paths.size()) +
                       " shard(s) give " + std::to_string(m.cur.windows) + " sequences of " +
                       std::to_string(o.seq_len) + "+1 tokens, fewer than one step needs (" + std::to_string(per_step) +
                       ")");
  m.buf.resize(std::size_t(o.seq_len) + 1);
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

Batch DataLoader::next() {
  Batch b;
  next(b);
  return b;
}

void DataLoader::next(Batch& out) {
  Impl& m = *impl_;
  const LoaderOptions& o = m.opt;
  const uint64_t per_step = uint64_t(o.batch_size) * uint64_t(o.world_size);
  if (m.cur.position + per_step > m.cur.windows) {
    ++m.cur.epoch;
    m.cur.position = 0;
  }
  m.build_order();
  const std::size_t T = std::size_t(o.seq_len);
  out.batch_size = o.batch_size;
  out.seq_len = o.seq_len;
  out.inputs.resize(std::size_t(o.batch_size) * T);
  out.targets.resize(std::size_t(o.batch_size) * T);
  out.positions.resize(o.documents ? std::size_t(o.batch_size) * T : 0);
  out.epoch = m.cur.epoch;
  out.index = m.cur.batches;
  out.loss_tokens = 0;
  for (int b = 0; b < o.batch_size; ++b) {
    const uint64_t slot = m.cur.position + uint64_t(o.rank) * uint64_t(o.batch_size) + uint64_t(b);
    const uint64_t w = o.shuffle ? m.order[slot] : slot;
    const std::size_t si =
        std::size_t(std::upper_bound(m.first_window.begin(), m.first_window.end(), w) - m.first_window.begin() - 1);
    const TokenShard& sh = m.shards[si];
    const uint64_t start = (w - m.first_window[si]) * T;
    sh.copy(start, T + 1, m.buf.data());
    if (o.vocab_size > 0) {
      for (std::size_t t = 0; t <= T; ++t)
        if (m.buf[t] >= o.vocab_size)
          throw DataError(sh.path() + ": token " + std::to_string(m.buf[t]) + " at token offset " +
                          std::to_string(start + t) + " is outside the vocabulary (size " +
                          std::to_string(o.vocab_size) + ")");
    }
    int32_t* in = out.inputs.data() + std::size_t(b) * T;
    int32_t* tg = out.targets.data() + std::size_t(b) * T;
    int32_t* pos = o.documents ? out.positions.data() + std::size_t(b) * T : nullptr;
    for (std::size_t t = 0; t < T; ++t) {
      in[t] = int32_t(m.buf[t]);
      bool keep = !sh.has_mask() || sh.mask(start + t + 1) != 0;
      if (pos) {
        pos[t] = t == 0 || sh.starts_document(start + t) ? 0 : pos[t - 1] + 1;
        keep = keep && !sh.starts_document(start + t + 1);
      }
      tg[t] = keep ? int32_t(m.buf[t + 1]) : Batch::kIgnoreIndex;
      out.loss_tokens += keep;
    }
  }
  m.cur.position += per_step;
  ++m.cur.batches;
}

const Cursor& DataLoader::cursor() const { return impl_->cur; }

void DataLoader::restore(const Cursor& c) {
  const Cursor& k = impl_->cur;
  auto bad = [&](const std::string& what, const std::string& have, const std::string& want) {
    throw DataError("data loader: cannot restore cursor: " + what + " is " + have + " in the cursor but " + want +
                    " here");
  };
  if (c.batch_size != k.batch_size) bad("batch_size", std::to_string(c.batch_size), std::to_string(k.batch_size));
  if (c.seq_len != k.seq_len) bad("seq_len", std::to_string(c.seq_len), std::to_string(k.seq_len));
  if (c.world_size != k.world_size) bad("world_size", std::to_string(c.world_size), std::to_string(k.world_size));
  if (c.shuffle != k.shuffle) bad("shuffle", c.shuffle ? "on" : "off", k.shuffle ? "on" : "off");
  if (c.tokens != k.tokens || c.windows != k.windows)
    bad("data (tokens/windows)", std::to_string(c.tokens) + "/" + std::to_string(c.windows),
        std::to_string(k.tokens) + "/" + std::to_string(k.windows));
  if (c.position > c.windows) bad("position", std::to_string(c.position), "at most " + std::to_string(c.windows));
  impl_->cur = c;
  impl_->order_epoch = ~uint64_t(0);
}

void DataLoader::seek(uint64_t batch_index) {
  const uint64_t per_step = uint64_t(impl_->opt.batch_size) * uint64_t(impl_->opt.world_size);
  const uint64_t bpe = impl_->cur.windows / per_step;
  impl_->cur.epoch = batch_index / bpe;
  impl_->cur.position = (batch_index % bpe) * per_step;
  impl_->cur.batches = batch_index;
}

double document_pairs_per_window(const std::vector<std::string>& shards, int seq_len, std::size_t max_windows) {
  std::vector<TokenShard> open;
  std::vector<uint64_t> first{0};
  const uint64_t T = uint64_t(std::max(seq_len, 1));
  for (const auto& p : expand_shard_paths(shards)) {
    open.push_back(TokenShard::open(p, ShardFormat::Auto, false, true));
    const uint64_t n = open.back().size();
    first.push_back(first.back() + (n > T ? (n - 1) / T : 0));
  }
  const uint64_t windows = first.back();
  if (windows == 0) return 0.0;
  const uint64_t samples = std::min<uint64_t>(windows, std::max<std::size_t>(max_windows, 1));
  double sum = 0;
  for (uint64_t i = 0; i < samples; ++i) {
    const uint64_t w = i * windows / samples;
    const std::size_t si = std::size_t(std::upper_bound(first.begin(), first.end(), w) - first.begin() - 1);
    const uint64_t start = (w - first[si]) * T;
    double piece = 0;
    for (uint64_t t = 0; t < T; ++t) {
      if (t > 0 && open[si].starts_document(start + t)) {
        sum += piece * (piece + 1) / 2;
        piece = 0;
      }
      ++piece;
    }
    sum += piece * (piece + 1) / 2;
  }
  return sum / double(samples);
}

const LoaderOptions& DataLoader::options() const { return impl_->opt; }
const std::vector<std::string>& DataLoader::shard_paths() const { return impl_->paths; }
uint64_t DataLoader::tokens() const { return impl_->cur.tokens; }
uint64_t DataLoader::windows_per_epoch() const { return impl_->cur.windows; }
uint64_t DataLoader::batches_per_epoch() const {
  return impl_->cur.windows / (uint64_t(impl_->opt.batch_size) * uint64_t(impl_->opt.world_size));
}

}  // namespace mt::data
