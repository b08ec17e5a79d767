// The engine's data loader: packing, deterministic shuffling, exact cursor save/restore (through JSON),
// loss masks to -100, data-parallel ranks, token-id validation.
#include <catch2/catch.hpp>

#include <set>

#include <nlohmann/json.hpp>

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
