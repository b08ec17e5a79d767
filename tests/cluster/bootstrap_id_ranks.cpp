// Run under mpirun by test_bootstrap_id.cpp: every rank joins the World and takes rank 0's 128-byte id
// through cluster::share_bootstrap_id, as the NCCL transport does before ncclCommInitRank (here the id is
// random bytes: nothing of NCCL). Prints one line per rank, "rank R of N: id <checksum> <first bytes>",
// and exits 0; an error is printed as "error: rank R of N: ..." and exits 3.
//   bootstrap_id_ranks ok              every rank gets rank 0's bytes
//   bootstrap_id_ranks tamper          the last rank flips a byte after the broadcast: every rank refuses
//   bootstrap_id_ranks late TIMEOUT_S  the last rank joins TIMEOUT_S x 3 late: rank 0 names it
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "cluster/bootstrap_id.hpp"

using namespace mt::cluster;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  const double timeout_s = argc > 2 ? std::stod(argv[2]) : 30.0;
  std::unique_ptr<World> world;
  try {
    world = World::join("on", timeout_s);
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 3;
  }
  const bool last = world->rank() == world->size() - 1;
  try {
    if (mode == "late" && last) std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s * 3));
    auto make = [] {
      BootstrapId id{};
      std::random_device random;
      for (auto& b : id) b = static_cast<unsigned char>(random());
      return id;
    };
    const std::string what = "the test's id";
    BootstrapId id = broadcast_bootstrap_id(*world, Channel::control, make, what);
    if (mode == "tamper" && last) id[77] ^= 1;
    check_same_bootstrap_id(*world, Channel::control, id, what);
    std::printf("%s: id %016llx %02x%02x%02x%02x\n", world->label().c_str(),
                static_cast<unsigned long long>(bootstrap_id_checksum(id)), id[0], id[1], id[2], id[3]);
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());  // a ClusterError says which rank it is
    std::fflush(stdout);
    // A rank that timed out ends the job (its peer may sleep or hang). A refusal is every rank's: each
    // waits until every rank printed its own (mpirun ends the job at the first non-zero exit).
    if (mode == "late") world->abort(3);
    char printed = 1;
    std::string every(static_cast<std::size_t>(world->size()), '\0');
    world->allgather(Channel::control, &printed, 1, every.data(), "every rank's error printed");
    return 3;
  }
  std::fflush(stdout);
  return 0;
}
