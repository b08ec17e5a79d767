// What every World does the same whatever its transport: the launcher check, the gather and the
// broadcast built on point-to-point transfers (so a timeout names the rank that did not answer).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cluster/world.hpp"

namespace mt::cluster {

bool launched_by_mpi_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != 0) return true;
  }
  return false;
}

std::string World::label() const { return "rank " + std::to_string(rank()) + " of " + std::to_string(size()); }

void World::allgather(Channel ch, const void* mine, std::size_t bytes, void* all, const std::string& what) {
  auto* out = static_cast<unsigned char*>(all);
  std::vector<std::unique_ptr<PendingRecv>> pending(static_cast<std::size_t>(size()));
  // Every receive is posted before any send, on every rank, so the blocking sends cannot wait on each other.
  for (int r = 0; r < size(); ++r)
    if (r != rank()) pending[static_cast<std::size_t>(r)] = start_recv(ch, r, out + r * bytes, bytes, what);
  std::memcpy(out + rank() * bytes, mine, bytes);
  for (int r = 0; r < size(); ++r)
    if (r != rank()) send(ch, r, mine, bytes, what);
  for (auto& p : pending)
    if (p) p->wait();
}

void World::broadcast(Channel ch, int root, std::string& text, const std::string& what) {
  if (rank() == root) {
    const std::uint64_t n = text.size();
    for (int r = 0; r < size(); ++r) {
      if (r == root) continue;
      send(ch, r, &n, sizeof n, what);
      send(ch, r, text.data(), text.size(), what);
    }
    return;
  }
  std::uint64_t n = 0;
  recv(ch, root, &n, sizeof n, what);
  text.assign(static_cast<std::size_t>(n), '\0');
  recv(ch, root, text.data(), text.size(), what);
}

}  // namespace mt::cluster
