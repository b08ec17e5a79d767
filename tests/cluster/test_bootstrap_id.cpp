// The bootstrap of a communicator across ranks (cluster/bootstrap_id.hpp: NCCL's 128-byte id from rank 0
// to every rank, then checked by checksum), on the CPU under mpirun with 2 and 3 ranks: every rank ends
// with rank 0's bytes; a rank holding other bytes is refused on every rank, named; a rank that does not
// join is named by the timeout. Exit 77 (skipped) without MPI or mpirun.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>

#include "cluster/bootstrap_id.hpp"
#include "tests/cluster/mpi_launch.hpp"

namespace fs = std::filesystem;
using namespace mt::test;

namespace {

const std::string kProbe = MEGATRAIN_BOOTSTRAP_PROBE;

Outcome run_probe(int ranks, const std::string& args) {
  const fs::path log = fs::temp_directory_path() / ("mt_bootstrap_" + std::to_string(::getpid()) + ".log");
  Outcome o = sh(mpirun(ranks) + kProbe + " " + args, log);
  fs::remove(log);
  return o;
}

// The "id CHECKSUM BYTES" part of every rank's line.
std::set<std::string> ids_of(const std::string& out, int ranks) {
  std::set<std::string> ids;
  for (int r = 0; r < ranks; ++r) {
    const std::string tag = "rank " + std::to_string(r) + " of " + std::to_string(ranks) + ": id ";
    const std::size_t at = out.find(tag);
    if (at == std::string::npos) continue;
    ids.insert(out.substr(at + tag.size(), out.find('\n', at) - at - tag.size()));
  }
  return ids;
}

}  // namespace

TEST_CASE("the bootstrap id's checksum is XXH3-64 of the 128 bytes: equal ids agree, one bit differs", "[cluster]") {
  mt::cluster::BootstrapId a{}, b{};
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = b[i] = static_cast<unsigned char>(i * 7);
  CHECK(mt::cluster::bootstrap_id_checksum(a) == mt::cluster::bootstrap_id_checksum(b));
  b[127] ^= 0x80;
  CHECK(mt::cluster::bootstrap_id_checksum(a) != mt::cluster::bootstrap_id_checksum(b));
}

TEST_CASE("2 and 3 ranks: every rank holds rank 0's id, and each run makes a new one", "[cluster]") {
  require_mpi();
  for (int ranks : {2, 3}) {
    const Outcome a = run_probe(ranks, "ok");
    INFO(a.out);
    REQUIRE(a.code == 0);
    const std::set<std::string> ids = ids_of(a.out, ranks);
    CHECK(ids.size() == 1);  // one id: every rank printed the same checksum and bytes
    const Outcome b = run_probe(ranks, "ok");
    REQUIRE(b.code == 0);
    CHECK(ids_of(b.out, ranks).size() == 1);
    CHECK(ids_of(b.out, ranks) != ids);  // rank 0 made another (random) id
  }
}

TEST_CASE("a rank holding other bytes is refused on every rank, named, before any communicator", "[cluster]") {
  require_mpi();
  for (int ranks : {2, 3}) {
    const Outcome o = run_probe(ranks, "tamper");
    INFO(o.out);
    CHECK(o.code != 0);
    const std::string named =
        "rank(s) " + std::to_string(ranks - 1) + " received another id than rank 0 sent (checksums differ)";
    for (int r = 0; r < ranks; ++r)
      CHECK(o.out.find("error: rank " + std::to_string(r) + " of " + std::to_string(ranks) +
                       ": the test's id: " + named) != std::string::npos);
  }
}

TEST_CASE("a rank that does not join is named by the timeout (cluster.collective_timeout_s)", "[cluster]") {
  require_mpi();
  for (int ranks : {2, 3}) {
    const Outcome o = run_probe(ranks, "late 1");
    INFO(o.out);
    CHECK(o.code != 0);
    CHECK(o.out.find("no answer from rank " + std::to_string(ranks - 1) +
                     " within 1 s (cluster.collective_timeout_s) while waiting for the test's id") !=
          std::string::npos);
  }
}
