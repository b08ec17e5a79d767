// Token shard formats: llm.c (uint16 / uint32) written and read back bit-exactly, masks, nanoGPT raw
// .bin, Megatron .bin/.idx; wrong magic / version / truncated bodies are errors naming file and offset.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include <sys/stat.h>

#include "data/shard.hpp"
#include "tests/data/test_util.hpp"

using namespace mt::data;
using namespace mt::data::test;

namespace {
std::vector<uint32_t> random_tokens(std::size_t n, uint32_t bound, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint32_t> v(n);
  for (auto& x : v) x = g() % bound;
  return v;
}
bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}
}  // namespace

TEST_CASE("llm.c shards round-trip bit-exactly (uint16 and uint32)", "[shards]") {
  TempDir d;
  const auto t16 = random_tokens(100003, 65536, 1);
  const auto t32 = random_tokens(77777, 151936, 2);
  write_shard(d / "a.bin", t16.data(), t16.size(), 2);
  write_shard(d / "b.bin", t32.data(), t32.size(), 4);
  CHECK(read_shard(d / "a.bin") == t16);
  CHECK(read_shard(d / "b.bin") == t32);
  // The exact bytes: header of 256 int32, then the tokens.
  const std::string raw = slurp(d / "a.bin");
  REQUIRE(raw.size() == 1024 + t16.size() * 2);
  int32_t h[3];
  std::memcpy(h, raw.data(), 12);
  CHECK(h[0] == 20240520);
  CHECK(h[1] == 1);
  CHECK(h[2] == int32_t(t16.size()));
  for (std::size_t i = 3; i < 256; ++i) CHECK(raw[i * 4] == 0);
  uint16_t first;
  std::memcpy(&first, raw.data() + 1024, 2);
  CHECK(first == t16[0]);
  const TokenShard s = TokenShard::open(d / "b.bin");
  CHECK(s.token_bytes() == 4);
  CHECK(s.size() == t32.size());
  CHECK(s[77776] == t32[77776]);
  CHECK(!s.has_mask());
  // No temporary files are left behind.
  std::string out;
  run("ls '" + d.path + "'", &out);
  CHECK(out == "a.bin\nb.bin\n");
}

TEST_CASE("streaming writer with mask, mask sidecar read beside the shard", "[shards]") {
  TempDir d;
  const auto t = random_tokens(5000, 50257, 3);
  std::vector<uint8_t> m(t.size());
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = (i / 7) % 2;
  {
    ShardWriter w(d / "x.bin", 2, true);
    w.append(t.data(), m.data(), 1234);
    CHECK(!exists(d / "x.bin"));  // nothing under the final name before commit
    w.append(t.data() + 1234, m.data() + 1234, t.size() - 1234);
    w.commit();
  }
  const TokenShard s = TokenShard::open(d / "x.bin");
  REQUIRE(s.has_mask());
  REQUIRE(s.size() == t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    REQUIRE(s[i] == t[i]);
    REQUIRE(s.mask(i) == m[i]);
  }
  {  // an uncommitted writer leaves nothing
    ShardWriter w(d / "y.bin", 2, true);
    w.append(t.data(), nullptr, 10);
  }
  CHECK(!exists(d / "y.bin"));
  CHECK(!exists(d / "y.mask"));
  std::string out;
  run("ls '" + d.path + "'", &out);
  CHECK(out == "x.bin\nx.mask\n");
  CHECK_THROWS_WITH(write_shard(d / "z.bin", std::vector<uint32_t>{70000}.data(), 1, 2),
                    Catch::Contains("does not fit uint16"));
  CHECK(!exists(d / "z.bin"));
}

TEST_CASE("bad shards: wrong magic, version, truncated header or body", "[shards][errors]") {
  TempDir d;
  const auto t = random_tokens(1000, 50000, 4);
  write_shard(d / "ok.bin", t.data(), t.size(), 2);
  std::string raw = slurp(d / "ok.bin");
  auto write_variant = [&](const std::string& name, const std::string& bytes) {
    spit(d / name, bytes);
    return d / name;
  };
  std::string bad_magic = raw;
  bad_magic[0] = 1;
  CHECK_THROWS_WITH(TokenShard::open(write_variant("m.bin", bad_magic), ShardFormat::LlmC),
                    Catch::Contains("m.bin: wrong magic") && Catch::Contains("at offset 0"));
  CHECK_THROWS_WITH(TokenShard::open(d / "m.bin"), Catch::Contains("m.bin: not an llm.c shard"));
  std::string bad_version = raw;
  bad_version[4] = 7;
  CHECK_THROWS_WITH(TokenShard::open(write_variant("v.bin", bad_version)),
                    Catch::Contains("v.bin: unsupported version 7 at offset 4"));
  CHECK_THROWS_WITH(TokenShard::open(write_variant("h.bin", raw.substr(0, 100)), ShardFormat::LlmC),
                    Catch::Contains("h.bin: truncated header"));
  CHECK_THROWS_WITH(
      TokenShard::open(write_variant("t.bin", raw.substr(0, raw.size() - 3))),
      Catch::Contains("t.bin: truncated body: header says 1000 tokens") && Catch::Contains("file ends at offset 3021"));
  CHECK_THROWS_WITH(TokenShard::open(write_variant("x.bin", raw + "zz")), Catch::Contains("x.bin: 2 unexpected bytes"));
  CHECK_THROWS_WITH(read_shard(d / "missing.bin"), Catch::Contains("missing.bin: cannot open"));
  // A mask of the wrong length is an error too.
  std::vector<uint8_t> m(999, 1);
  write_mask(d / "ok.mask", m.data(), m.size());
  CHECK_THROWS_WITH(TokenShard::open(d / "ok.bin"), Catch::Contains("ok.mask: mask has 999 entries"));
}

TEST_CASE("nanoGPT raw uint16 .bin and Megatron .bin/.idx are readable", "[shards]") {
  TempDir d;
  const auto t = random_tokens(4097, 50257, 5);
  std::vector<uint16_t> raw(t.begin(), t.end());
  spit(d / "train.bin", std::string(reinterpret_cast<const char*>(raw.data()), raw.size() * 2));
  const TokenShard n = TokenShard::open(d / "train.bin", ShardFormat::NanoGpt);
  REQUIRE(n.size() == t.size());
  for (std::size_t i = 0; i < t.size(); ++i) REQUIRE(n[i] == t[i]);
  spit(d / "odd.bin", "abc");
  CHECK_THROWS_WITH(TokenShard::open(d / "odd.bin", ShardFormat::NanoGpt),
                    Catch::Contains("odd.bin: raw uint16 file has an odd size"));

  for (int width : {2, 4}) {
    std::vector<std::vector<uint32_t>> docs{random_tokens(10, 50000, 6), random_tokens(0, 1, 7),
                                            random_tokens(333, 50000, 8)};
    write_megatron(d / "meg", docs, width);
    const TokenShard m = TokenShard::open(d / "meg.bin");  // auto-detected through meg.idx
    CHECK(m.format() == ShardFormat::Megatron);
    CHECK(m.token_bytes() == width);
    REQUIRE(m.size() == 343);
    CHECK(m.sequence_offsets() == std::vector<uint64_t>{0, 10, 10, 343});
    CHECK(m[0] == docs[0][0]);
    CHECK(m[342] == docs[2][332]);
  }
  std::string idx = slurp(d / "meg.idx");
  // An absurd sequence / document count is a clear error naming the file, not a length_error or bad_alloc.
  for (const std::uint64_t absurd : {std::uint64_t{1} << 62, ~std::uint64_t{0}, std::uint64_t{1} << 40}) {
    for (const int at : {18, 26}) {
      std::string bad = idx;
      std::memcpy(&bad[static_cast<std::size_t>(at)], &absurd, 8);
      spit(d / "bad.idx", bad);
      spit(d / "bad.bin", slurp(d / "meg.bin"));
      CHECK_THROWS_WITH(TokenShard::open(d / "bad.bin", ShardFormat::Megatron),
                        Catch::Contains("bad.idx: ") && Catch::Contains("cannot fit"));
    }
  }
  idx[0] = 'X';
  spit(d / "meg.idx", idx);
  CHECK_THROWS_WITH(TokenShard::open(d / "meg.bin", ShardFormat::Megatron),
                    Catch::Contains("meg.idx: not a Megatron index"));
}
