// What every World does the same whatever its transport: the launcher check, the gather and the
// broadcast built on point-to-point transfers (so a timeout names the rank that did not answer).
#include <chrono>
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

namespace {
std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

const char* channel_name(Channel ch) {
  switch (ch) {
    case Channel::control:
      return "control";
    case Channel::grads:
      return "grads";
    case Channel::losses:
      return "losses";
    case Channel::weights:
      return "weights";
    case Channel::checkpoint:
      return "checkpoint";
  }
  return "?";
}

void World::begin_wait(Channel ch, int peer, const std::string& what, bool sending) const {
  const std::lock_guard<std::mutex> lock(waits_mutex_);
  waits_[static_cast<int>(ch)] = Wait{peer, what, sending, steady_ns(), 0};
}

void World::end_wait(Channel ch) const {
  const std::lock_guard<std::mutex> lock(waits_mutex_);
  waits_[static_cast<int>(ch)].end_ns = steady_ns();
}

std::optional<TransferView> World::last_transfer() const {
  const std::int64_t now = steady_ns();
  const std::lock_guard<std::mutex> lock(waits_mutex_);
  int waiting = -1, finished = -1;
  for (int c = 0; c < kChannels; ++c) {
    const Wait& w = waits_[c];
    if (w.start_ns == 0) continue;
    if (w.end_ns == 0) {
      if (waiting < 0 || w.start_ns < waits_[waiting].start_ns) waiting = c;
    } else if (finished < 0 || w.end_ns > waits_[finished].end_ns) {
      finished = c;
    }
  }
  const int c = waiting >= 0 ? waiting : finished;
  if (c < 0) return std::nullopt;
  const Wait& w = waits_[c];
  return TransferView{static_cast<Channel>(c),
                      w.peer,
                      w.what,
                      w.sending,
                      w.end_ns != 0,
                      static_cast<double>((w.end_ns != 0 ? w.end_ns : now) - w.start_ns) * 1e-9};
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

void World::send_text(Channel ch, int peer, const std::string& text, const std::string& what) {
  const std::uint64_t n = text.size();
  send(ch, peer, &n, sizeof n, what);
  send(ch, peer, text.data(), text.size(), what);
}

std::string World::recv_text(Channel ch, int peer, const std::string& what) {
  std::uint64_t n = 0;
  recv(ch, peer, &n, sizeof n, what);
  std::string text(static_cast<std::size_t>(n), '\0');
  recv(ch, peer, text.data(), text.size(), what);
  return text;
}

void World::broadcast(Channel ch, int root, std::string& text, const std::string& what) {
  if (rank() == root) {
    for (int r = 0; r < size(); ++r)
      if (r != root) send_text(ch, r, text, what);
    return;
  }
  text = recv_text(ch, root, what);
}

}  // namespace mt::cluster
