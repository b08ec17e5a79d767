// The engine's data loader: packing, deterministic shuffling, exact cursor save/restore (through JSON),
// loss masks to -100, data-parallel ranks, token-id validation.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include <nlohmann/json.hpp>

#include "data/dataset_builder.hpp"
#include "data/loader.hpp"
#include "tests/data/test_util.hpp"

using namespace mt::data;
using namespace mt::data::test;

namespace {
// Shards whose token i is (base + i) % 50000, so every window is recognisable.
void make_shards(const TempDir& d) {
  for (int s = 0; s < 3; ++s) {
    std::vector<uint32_t> t(1000 + 137 * std::size_t(s));
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = uint32_t((s * 10000 + i) % 50000);
    write_shard(d / ("train_00000" + std::to_string(s) + ".bin"), t.data(), t.size(), 2);
  }
}
LoaderOptions opts(const TempDir& d) {
  LoaderOptions o;
  o.shards = {d / "train_*.bin"};
  o.batch_size = 4;
  o.seq_len = 16;
  o.seed = 42;
  return o;
}
}  // namespace

TEST_CASE("batches are packed windows: targets are inputs shifted by one", "[loader]") {
  TempDir d;
  make_shards(d);
  DataLoader dl(opts(d));
  CHECK(dl.shard_paths().size() == 3);
  CHECK(dl.tokens() == 1000 + 1137 + 1274);
  CHECK(dl.windows_per_epoch() == 999 / 16 + 1136 / 16 + 1273 / 16);
  const Batch b = dl.next();
  REQUIRE(b.inputs.size() == 64);
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < 16; ++t) {
      const int32_t x = b.inputs[std::size_t(r) * 16 + std::size_t(t)],
                    y = b.targets[std::size_t(r) * 16 + std::size_t(t)];
      CHECK(y == (x + 1) % 50000);
    }
  CHECK(b.loss_tokens == 64);
}

TEST_CASE("each epoch visits every window once, in a seed-determined order", "[loader]") {
  TempDir d;
  make_shards(d);
  auto o = opts(d);
  o.batch_size = 1;
  DataLoader a(o), b(o);
  std::set<int32_t> starts;
  std::vector<int32_t> order_a, order_b;
  for (uint64_t i = 0; i < a.windows_per_epoch(); ++i) {
    const Batch x = a.next(), y = b.next();
    order_a.push_back(x.inputs[0]);
    order_b.push_back(y.inputs[0]);
    starts.insert(x.inputs[0]);
    CHECK(x.epoch == 0);
  }
  CHECK(starts.size() == a.windows_per_epoch());
  CHECK(order_a == order_b);
  o.seed = 43;
  DataLoader c(o);
  std::vector<int32_t> order_c;
  for (uint64_t i = 0; i < c.windows_per_epoch(); ++i) order_c.push_back(c.next().inputs[0]);
  CHECK(order_c != order_a);
  CHECK(a.next().epoch == 1);  // then the next epoch starts, in another order
}

TEST_CASE("the cursor round-trips exactly through JSON", "[loader]") {
  TempDir d;
  make_shards(d);
  DataLoader a(opts(d));
  for (int i = 0; i < 37; ++i) a.next();  // past the first epoch boundary (56 windows / 4 = 14 per epoch)
  const nlohmann::json j = a.cursor();
  const Cursor back = j.get<Cursor>();
  CHECK(back == a.cursor());
  DataLoader b(opts(d));
  b.restore(back);
  for (int i = 0; i < 40; ++i) {
    const Batch x = a.next(), y = b.next();
    REQUIRE(x.inputs == y.inputs);
    REQUIRE(x.targets == y.targets);
    REQUIRE(x.epoch == y.epoch);
  }
  CHECK(a.cursor() == b.cursor());
  auto other = opts(d);
  other.seq_len = 32;
  DataLoader c(other);
  CHECK_THROWS_WITH(c.restore(back), Catch::Contains("seq_len is 16 in the cursor but 32 here"));
}

TEST_CASE("seek(g) gives micro-batch g, across epochs", "[loader]") {
  TempDir d;
  make_shards(d);
  DataLoader a(opts(d));
  std::vector<Batch> seq;
  seq.reserve(45);
  for (int i = 0; i < 45; ++i) seq.push_back(a.next());
  DataLoader b(opts(d));
  for (uint64_t g : {44u, 0u, 13u, 14u, 28u, 27u, 5u}) {
    b.seek(g);
    const Batch x = b.next();
    INFO("batch " << g);
    CHECK(x.inputs == seq[g].inputs);
    CHECK(x.targets == seq[g].targets);
    CHECK(x.epoch == seq[g].epoch);
    CHECK(x.index == g);
  }
}

TEST_CASE("data-parallel ranks take disjoint windows of the same order", "[loader]") {
  TempDir d;
  make_shards(d);
  auto o = opts(d);
  o.world_size = 2;
  std::set<int32_t> seen;
  std::size_t total = 0;
  for (int r = 0; r < 2; ++r) {
    o.rank = r;
    DataLoader dl(o);
    for (uint64_t i = 0; i < dl.batches_per_epoch(); ++i) {
      const Batch b = dl.next();
      for (int k = 0; k < 4; ++k) seen.insert(b.inputs[std::size_t(k) * 16]);
      total += 4;
    }
  }
  CHECK(seen.size() == total);
}

TEST_CASE("loss mask excludes targets as -100", "[loader]") {
  TempDir d;
  std::vector<uint32_t> t(200);
  std::vector<uint8_t> m(200);
  for (std::size_t i = 0; i < t.size(); ++i) {
    t[i] = uint32_t(i);
    m[i] = (i % 10) >= 5;
  }
  {
    ShardWriter w(d / "sft.bin", 2, true);
    w.append(t.data(), m.data(), t.size());
    w.commit();
  }
  LoaderOptions o;
  o.shards = {d / "sft.bin"};
  o.batch_size = 2;
  o.seq_len = 8;
  o.shuffle = false;
  DataLoader dl(o);
  const Batch b = dl.next();
  std::size_t kept = 0;
  for (std::size_t i = 0; i < b.targets.size(); ++i) {
    const int32_t x = b.inputs[i];
    const int32_t want = ((x + 1) % 10) >= 5 ? x + 1 : -100;
    CHECK(b.targets[i] == want);
    kept += want != -100;
  }
  CHECK(b.loss_tokens == kept);
}

TEST_CASE("tokens outside the vocabulary, missing shards and too little data are clear errors", "[loader][errors]") {
  TempDir d;
  std::vector<uint32_t> t(100, 5);
  t[50] = 60000;
  write_shard(d / "v.bin", t.data(), t.size(), 2);
  LoaderOptions o;
  o.shards = {d / "v.bin"};
  o.batch_size = 1;
  o.seq_len = 10;
  o.shuffle = false;
  o.vocab_size = 50257;
  DataLoader dl(o);
  for (int i = 0; i < 4; ++i) dl.next();
  CHECK_THROWS_WITH(dl.next(), Catch::Contains("v.bin: token 60000 at token offset 50 is outside the vocabulary"));
  o.shards = {d / "nothing_*.bin"};
  CHECK_THROWS_WITH(DataLoader(o), Catch::Contains("pattern matches no shard"));
  o.shards = {d / "v.bin"};
  o.seq_len = 100;
  CHECK_THROWS_WITH(DataLoader(o), Catch::Contains("fewer than one step needs"));
  CHECK_THROWS_AS(DataLoader(o), TooFewTokens);  // the node runs on without evaluating on such validation files
}

namespace {
// Documents of lengths 3, 5, 1, 9, 2, 7, ... (cycling over kLengths) written through ShardWriter one
// document per begin_document(); token i is i, mask 0 on each document's first two tokens (a prompt).
const std::vector<std::size_t> kLengths = {3, 5, 1, 9, 2, 7, 23, 4};
std::vector<uint64_t> write_documents(const std::string& path, std::size_t tokens) {
  ShardWriter w(path, 2, true);
  std::vector<uint64_t> starts;
  std::size_t at = 0;
  for (std::size_t k = 0; at < tokens; ++k) {
    const std::size_t n = std::min(kLengths[k % kLengths.size()], tokens - at);
    std::vector<uint32_t> ids(n);
    std::vector<uint8_t> mask(n);
    for (std::size_t i = 0; i < n; ++i) ids[i] = uint32_t(at + i), mask[i] = i >= 2;
    starts.push_back(at);
    w.begin_document();
    w.append(ids.data(), mask.data(), n);
    at += n;
  }
  w.commit();
  return starts;
}
}  // namespace

TEST_CASE("documents: positions restart at each document, a document's last token has no target",
          "[loader][documents]") {
  TempDir d;
  const auto starts = write_documents(d / "docs_000000.bin", 997);
  const std::set<uint64_t> start_set(starts.begin(), starts.end());
  LoaderOptions o;
  o.shards = {d / "docs_*.bin"};
  o.batch_size = 3;
  o.seq_len = 16;
  o.seed = 7;
  o.documents = true;
  o.world_size = 2;
  for (int rank = 0; rank < 2; ++rank) {
    o.rank = rank;
    DataLoader dl(o);
    LoaderOptions stream = o;
    stream.documents = false;
    DataLoader plain(stream);  // the same windows without documents
    for (int step = 0; step < 40; ++step) {
      const Batch b = dl.next(), s = plain.next();
      REQUIRE(b.positions.size() == b.inputs.size());
      CHECK(s.positions.empty());
      CHECK(b.inputs == s.inputs);
      std::size_t kept = 0;
      for (std::size_t r = 0; r < 3; ++r)
        for (std::size_t t = 0; t < 16; ++t) {
          const std::size_t i = r * 16 + t;
          const uint64_t tok = uint64_t(b.inputs[i]);  // token value = its offset in the shard
          // position: 0 at the window's start and at a document's start, else the previous one's + 1
          const int32_t want_pos = t == 0 || start_set.count(tok) ? 0 : b.positions[i - 1] + 1;
          CHECK(b.positions[i] == want_pos);
          // the target: the next token, unless it starts a document or is a masked prompt token
          const uint64_t next = tok + 1;
          const uint64_t doc_start = *std::prev(start_set.upper_bound(next));
          const bool prompt = next - doc_start < 2;
          const int32_t want = start_set.count(next) || prompt ? Batch::kIgnoreIndex : int32_t(next);
          CHECK(b.targets[i] == want);
          CHECK(s.targets[i] == (prompt ? Batch::kIgnoreIndex : int32_t(next)));  // the stream's: mask only
          kept += want != Batch::kIgnoreIndex;
        }
      CHECK(b.loss_tokens == kept);
    }
  }
}

TEST_CASE("documents: a restored cursor serves the same positions and targets", "[loader][documents]") {
  TempDir d;
  write_documents(d / "docs_000000.bin", 700);
  write_documents(d / "docs_000001.bin", 333);
  LoaderOptions o;
  o.shards = {d / "docs_*.bin"};
  o.batch_size = 2;
  o.seq_len = 12;
  o.seed = 3;
  o.documents = true;
  DataLoader a(o);
  for (int i = 0; i < 29; ++i) a.next();  // into the second epoch
  const nlohmann::json saved = a.cursor();
  std::vector<Batch> want;
  for (int i = 0; i < 10; ++i) want.push_back(a.next());
  DataLoader b(o);
  b.restore(saved.get<Cursor>());
  for (const Batch& w : want) {
    const Batch got = b.next();
    CHECK(got.inputs == w.inputs);
    CHECK(got.targets == w.targets);
    CHECK(got.positions == w.positions);
  }
}

TEST_CASE("documents: a shard without .docs, or a bad one, is a clear error naming the file",
          "[loader][documents][errors]") {
  TempDir d;
  std::vector<uint32_t> t(100, 5);
  write_shard(d / "plain.bin", t.data(), t.size(), 2);  // told of no documents: no .docs
  LoaderOptions o;
  o.shards = {d / "plain.bin"};
  o.batch_size = 1;
  o.seq_len = 8;
  o.documents = true;
  CHECK_THROWS_WITH(DataLoader(o), Catch::Contains("plain.docs: missing") &&
                                       Catch::Contains("data.packing = documents") &&
                                       Catch::Contains("megatrain-data shards"));
  o.documents = false;
  CHECK_NOTHROW(DataLoader(o));  // the stream needs none
  o.documents = true;
  CHECK_THROWS_WITH(write_docs(d / "plain.docs", {0, 40, 30}, 100),
                    Catch::Contains("document 2 would start at token 30"));
  {  // a hand-made sidecar whose starts are out of order
    std::vector<int32_t> h(256, 0);
    h[0] = kDocsMagic, h[1] = 1, h[2] = 3;
    const uint64_t s[3] = {0, 40, 30};
    std::FILE* f = std::fopen((d / "plain.docs").c_str(), "wb");
    std::fwrite(h.data(), 4, 256, f);
    std::fwrite(s, 8, 3, f);
    std::fclose(f);
  }
  CHECK_THROWS_WITH(DataLoader(o), Catch::Contains("plain.docs: document 2 starts at token 30"));
  {  // a wrong magic
    std::vector<int32_t> h(256, 0);
    h[0] = kMaskMagic, h[1] = 1, h[2] = 0;
    std::FILE* f = std::fopen((d / "plain.docs").c_str(), "wb");
    std::fwrite(h.data(), 4, 256, f);
    std::fclose(f);
  }
  CHECK_THROWS_WITH(DataLoader(o), Catch::Contains("plain.docs: wrong magic"));
}

TEST_CASE("documents: ShardWriter's .docs holds each begun document, the shard's first token among them",
          "[loader][documents]") {
  TempDir d;
  std::vector<uint32_t> t(10, 1);
  {
    ShardWriter w(d / "a.bin", 2, false);
    w.append(t.data(), nullptr, 4);  // a continuation: the shard's first token starts a piece anyway
    w.begin_document();
    w.begin_document();  // twice at the same token: one start
    w.append(t.data(), nullptr, 6);
    w.begin_document();  // begun, nothing appended: no start past the end
    w.commit();
  }
  const TokenShard s = TokenShard::open(d / "a.bin", ShardFormat::Auto, true, true);
  REQUIRE(s.has_docs());
  for (std::size_t i = 0; i < 10; ++i) CHECK(s.starts_document(i) == (i == 0 || i == 4));
  {  // told of documents, none begun (a shard holding one document's continuation): its first token starts one
    ShardWriter w(d / "c.bin", 2, false, true);
    w.append(t.data(), nullptr, 10);
    w.commit();
  }
  const TokenShard c = TokenShard::open(d / "c.bin", ShardFormat::Auto, true, true);
  for (std::size_t i = 0; i < 10; ++i) CHECK(c.starts_document(i) == (i == 0));
  {  // uncommitted: nothing left behind
    ShardWriter w(d / "b.bin", 2, false);
    w.begin_document();
    w.append(t.data(), nullptr, 3);
  }
  CHECK(!std::filesystem::exists(d / "b.docs"));
  CHECK(!std::filesystem::exists(d / "b.bin"));
}

TEST_CASE("documents: the planner's pairs per window are the sum over pieces of L (L + 1) / 2", "[loader][documents]") {
  TempDir d;
  const auto starts = write_documents(d / "docs_000000.bin", 997);
  const std::set<uint64_t> start_set(starts.begin(), starts.end());
  const int T = 16;
  double expect = 0;
  const uint64_t windows = (997 - 1) / T;
  for (uint64_t w = 0; w < windows; ++w) {
    double piece = 0;
    for (uint64_t t = 0; t < uint64_t(T); ++t) {
      if (t > 0 && start_set.count(w * T + t)) expect += piece * (piece + 1) / 2, piece = 0;
      ++piece;
    }
    expect += piece * (piece + 1) / 2;
  }
  CHECK(document_pairs_per_window({d / "docs_*.bin"}, T) == Approx(expect / double(windows)));
  CHECK(document_pairs_per_window({d / "docs_*.bin"}, T) < T * (T + 1) / 2.0);
  std::vector<uint32_t> t(100, 5);
  write_shard(d / "plain.bin", t.data(), t.size(), 2);
  CHECK_THROWS_WITH(document_pairs_per_window({d / "plain.bin"}, T), Catch::Contains("plain.docs: missing"));
}

TEST_CASE("data.packing = auto: documents for shards megatrain-data made from records, stream for text",
          "[loader][documents]") {
  TempDir d;
  make_shards(d);
  const std::string glob = d / "train_*.bin";
  CHECK(resolved_packing("auto", glob) == "stream");  // no dataset.json beside them
  auto meta = [&](const std::string& name, const std::string& format) {
    std::ofstream(d / name) << nlohmann::json{{"created_by", "megatrain-data"}, {"format", format}}.dump();
  };
  for (const char* format : {"instruct", "chat", "jsonl-tokens"}) {
    INFO(format);
    meta("dataset.json", format);
    CHECK(resolved_packing("auto", glob) == "documents");
    CHECK(resolved_packing("stream", glob) == "stream");  // an explicit value stays
  }
  for (const char* format : {"text", "jsonl"}) {
    meta("dataset.json", format);
    CHECK(resolved_packing("auto", glob) == "stream");
    CHECK(resolved_packing("documents", glob) == "documents");
  }
  // A prefix (megatrain-data shards --prefix): its own dataset.json.
  std::vector<uint32_t> t(100, 7);
  write_shard(d / "sft_train_000000.bin", t.data(), t.size(), 2);
  meta("sft_dataset.json", "chat");
  CHECK(resolved_packing("auto", d / "sft_train_*.bin") == "documents");
  std::ofstream(d / "sft_dataset.json") << "not json";
  CHECK(resolved_packing("auto", d / "sft_train_*.bin") == "stream");
  CHECK(resolved_packing("auto", d / "missing_*.bin") == "stream");  // the loader names missing shards
}
