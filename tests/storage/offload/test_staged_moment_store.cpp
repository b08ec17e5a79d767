// The staged moment store: through many cycles of acquire / update / release in the optimizer's
// order (and in the reverse order), what a lease shows equals a plain in-RAM copy bit for bit (none,
// lossless; in RAM and in files), or within int8's bound; RAM stays bounded by the slots; reads run
// ahead (file reads happen, and most acquires do not wait for one); damage and a full disk are errors
// naming the file, and a failed write keeps the data.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>

#include "storage/offload/staged_moment_store.hpp"
#include "tests/storage/offload/offload_test_util.hpp"

using namespace mt;
using namespace mt::offload;

namespace {

const std::vector<std::size_t> kStageFloats = {4096, 70'000, 70'000, 70'000, 70'000, 70'000, 12'288};

// One optimizer-like update: deterministic in the old values.
void update(float* m, float* v, std::size_t n, int step) {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = std::sin(static_cast<float>(i * 13 + static_cast<std::size_t>(step)));
    m[i] = 0.9f * m[i] + 0.1f * g * 1e-2f;
    v[i] = 0.999f * v[i] + 0.001f * g * g * 1e-4f;
  }
}

void run_cycles(StagedMomentStore& store, bool exact, bool reverse, int steps) {
  const auto S = static_cast<std::int64_t>(kStageFloats.size());
  std::vector<std::vector<float>> ref_m, ref_v;
  for (auto n : kStageFloats) {
    ref_m.emplace_back(n, 0.0f);
    ref_v.emplace_back(n, 0.0f);
  }
  for (int step = 0; step < steps; ++step)
    for (std::int64_t k = 0; k < S; ++k) {
      const std::int64_t s = reverse ? S - 1 - k : k;
      const std::size_t n = kStageFloats[static_cast<std::size_t>(s)];
      MomentLease l(store, s);
      auto& rm = ref_m[static_cast<std::size_t>(s)];
      auto& rv = ref_v[static_cast<std::size_t>(s)];
      if (exact) {
        REQUIRE(std::memcmp(l.m(), rm.data(), n * 4) == 0);
        REQUIRE(std::memcmp(l.v(), rv.data(), n * 4) == 0);
      } else {
        const double rel = int8_relative_error_bound() * 4 * (step + 1);  // errors compound over updates
        for (std::size_t i = 0; i < n; i += 17) {
          REQUIRE(std::fabs(l.m()[i] - rm[i]) <= rel * std::fabs(rm[i]) + 2e-6);
          REQUIRE(std::fabs(l.v()[i] - rv[i]) <= rel * std::fabs(rv[i]) + 2e-9);
        }
        std::memcpy(rm.data(), l.m(), n * 4);  // continue from what the store holds
        std::memcpy(rv.data(), l.v(), n * 4);
      }
      update(l.m(), l.v(), n, step);
      update(rm.data(), rv.data(), n, step);
      l.mark_modified();
    }
  store.flush();
}

}  // namespace

TEST_CASE("staged moments equal a plain copy bit for bit (none and lossless, RAM and files, both orders)") {
  test::OffloadTempDir tmp;
  for (MomentCodec c : {MomentCodec::none, MomentCodec::lossless})
    for (bool files : {false, true})
      for (bool reverse : {false, true}) {
        StagedMomentStoreOptions o;
        o.codec = c;
        o.dir = files ? tmp.path() : "";
        o.staging_stages = 3;
        o.io_chunk_bytes = 64 * 1024;
        if (reverse)  // the optimizer without clipping: its order is the store's visit order
          for (std::size_t k = 0; k < kStageFloats.size(); ++k)
            o.visit_order.push_back(static_cast<std::int64_t>(kStageFloats.size() - 1 - k));
        StagedMomentStore store(kStageFloats, o);
        INFO(store.describe() << (reverse ? ", reverse order" : ""));
        run_cycles(store, true, reverse, 4);
        const auto st = store.stats();
        CHECK(st.stores == 4 * kStageFloats.size());
        CHECK(st.loads >= 3 * (kStageFloats.size() - 3));  // 7 stages through 3 slots: real loads every step
        if (files) CHECK(st.file_bytes_read > 0);
        if (c == MomentCodec::lossless) CHECK(st.encoded_bytes < st.raw_bytes);
        // Bounded by the slots (each: the largest stage in fp32 and encoded, plus the file header),
        // whatever the number of stages; in RAM the encodings come on top.
        const std::size_t slot_bytes = 2 * (2 * 70'000 * 4) + 3 * 4096 + 8 * 1024;
        if (files) CHECK(store.ram_bytes() <= 3 * slot_bytes);
      }
  CHECK(std::filesystem::is_empty(tmp.path()));  // each store removed its own files
}

TEST_CASE("int8 staged moments stay within the quantiser's bound and take ~2 bytes per parameter") {
  StagedMomentStoreOptions o;
  o.codec = MomentCodec::int8;
  o.staging_stages = 3;
  StagedMomentStore store(kStageFloats, o);
  run_cycles(store, false, false, 3);
  const auto st = store.stats();
  CHECK(static_cast<double>(st.encoded_bytes) / static_cast<double>(st.raw_bytes) < 2.05 / 8);
}

TEST_CASE("a damaged or truncated stage file fails the acquire naming the file and other stages still load") {
  test::OffloadTempDir tmp;
  StagedMomentStoreOptions o;
  o.dir = tmp.path();
  o.staging_stages = 3;
  StagedMomentStore store(kStageFloats, o);
  run_cycles(store, true, false, 1);
  store.evict_all();
  const std::string p3 = store.file_path(3), p4 = store.file_path(4);
  {
    std::fstream f(p3, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20000);
    f.put('\x5a');
  }
  REQUIRE(::truncate(p4.c_str(), 8192) == 0);
  auto error_of = [&](std::int64_t s) -> std::string {
    try {
      MomentLease l(store, s);
    } catch (const MomentStoreError& e) {
      return e.what();
    }
    return "";
  };
  CHECK_THAT(error_of(3), Catch::Contains(p3) && Catch::Contains("checksum"));
  CHECK_THAT(error_of(4), Catch::Contains(p4) && Catch::Contains("truncated"));
  CHECK(error_of(5).empty());
  CHECK(error_of(0).empty());
}

TEST_CASE("a full disk fails the write-behind: later acquires and flush name the file") {
  test::OffloadTempDir tmp;
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    StagedMomentStoreOptions o;
    o.dir = tmp.path();
    o.staging_stages = 3;
    StagedMomentStore store(kStageFloats, o);
    rlimit lim{200'000, 200'000};  // stage 0 fits (~45 KB), the 70k-float stages (~560 KB) do not
    ::setrlimit(RLIMIT_FSIZE, &lim);
    std::string e;
    try {
      run_cycles(store, true, false, 1);
    } catch (const MomentStoreError& x) {
      e = x.what();
    }
    // Two writes run at once: the first to fail may be stage 1's or stage 2's.
    const bool ok =
        (e.find(store.file_path(1)) != std::string::npos || e.find(store.file_path(2)) != std::string::npos) &&
        e.find("write") != std::string::npos;
    if (!ok) std::fprintf(stderr, "unexpected: '%s'\n", e.c_str());
    std::_Exit(ok ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("an overwrite pass reads nothing ahead, and the masters travel with the moments") {
  test::OffloadTempDir tmp;
  for (const MomentCodec codec : {MomentCodec::none, MomentCodec::lossless, MomentCodec::int8}) {
    StagedMomentStoreOptions o;
    o.dir = tmp.path();
    o.staging_stages = 3;
    o.with_masters = true;
    o.codec = codec;
    StagedMomentStore store(kStageFloats, o);
    REQUIRE(store.holds_masters());
    const auto S = static_cast<std::int64_t>(kStageFloats.size());
    for (int pass = 0; pass < 2; ++pass)  // the second pass overwrites stages that are in the files
      for (std::int64_t s = 0; s < S; ++s) {
        const std::size_t n = kStageFloats[static_cast<std::size_t>(s)];
        MomentLease l(store, s, MomentLease::Use::overwrite);
        REQUIRE(l.master() != nullptr);
        for (std::size_t i = 0; i < n; ++i) {
          l.master()[i] = static_cast<float>(s) + static_cast<float>(i) * 1e-3f;
          l.m()[i] = 0.0f;
          l.v()[i] = 0.0f;
        }
      }
    store.flush();
    INFO(store.describe());
    CHECK(store.stats().loads == 0);  // the overwrites never waited for a read of what they replace
    CHECK(store.stats().file_bytes_read == 0);
    store.evict_all();
    for (std::int64_t s = 0; s < S; ++s) {  // the masters come back exactly, whatever the moments' codec
      const std::size_t n = kStageFloats[static_cast<std::size_t>(s)];
      MomentLease l(store, s);
      bool same = true;
      for (std::size_t i = 0; i < n; ++i)
        same = same && l.master()[i] == static_cast<float>(s) + static_cast<float>(i) * 1e-3f;
      CHECK(same);
    }
    CHECK(store.stats().file_bytes_read > 0);
    const auto fp = StagedMomentStore::footprint(kStageFloats, o);
    CHECK(fp.ram == store.ram_bytes());
    CHECK(fp.disk == store.disk_bytes());
  }
}
