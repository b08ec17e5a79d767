// The World over MPI (OpenMPI from Debian): MPI_THREAD_MULTIPLE, one duplicated communicator per
// Channel, errors returned (not fatal) so they become ClusterError. Every transfer is non-blocking
// underneath (MPI_Isend / MPI_Irecv in chunks of at most 1 GiB, MPI's counts being int) and polled
// with MPI_Testall and a short, growing sleep until done or the timeout: MPI's own blocking calls
// cannot time out, and a busy poll would take a core from compute on a small machine.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "cluster/world.hpp"

namespace mt::cluster {

bool built_with_mpi() { return true; }

namespace {

constexpr std::size_t kChunkBytes = std::size_t{1} << 30;

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<std::size_t>(len));
}

class MpiWorld;

// The requests of one transfer with one peer and what it is, waited for with the world's timeout.
struct Transfer {
  const MpiWorld* world = nullptr;
  Channel channel = Channel::control;
  int peer = 0;
  bool sending = false;
  std::string what;
  std::vector<MPI_Request> requests;
  void wait();
};

class MpiWorld final : public World {
 public:
  explicit MpiWorld(double timeout_s) : World(timeout_s) {
    int provided = 0;
    if (const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided); rc != MPI_SUCCESS)
      throw ClusterError("MPI_Init_thread failed: " + mpi_error(rc));
    if (provided < MPI_THREAD_MULTIPLE) {
      MPI_Finalize();
      throw ClusterError(
          "this MPI library does not provide MPI_THREAD_MULTIPLE (the collector and the optimizer "
          "transfer from their own threads)");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm host = MPI_COMM_NULL;  // the ranks sharing this host's memory (and cores)
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host) == MPI_SUCCESS &&
        host != MPI_COMM_NULL) {
      MPI_Comm_size(host, &local_size_);
      MPI_Comm_rank(host, &local_rank_);  // key 0: the host's ranks keep their world order
      MPI_Comm_free(&host);
    }
    for (MPI_Comm& c : comms_) {
      MPI_Comm_dup(MPI_COMM_WORLD, &c);
      MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    }
  }
  ~MpiWorld() override {
    for (MPI_Comm& c : comms_) MPI_Comm_free(&c);
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }
  int local_rank() const override { return local_rank_; }

  void send(Channel ch, int peer, const void* data, std::size_t bytes, const std::string& what) override {
    Transfer t = post(ch, peer, const_cast<void*>(data), bytes, what, true);
    t.wait();
    count_sent(ch, bytes);
  }
  void recv(Channel ch, int peer, void* data, std::size_t bytes, const std::string& what) override {
    Transfer t = post(ch, peer, data, bytes, what, false);
    t.wait();
  }

  class MpiPendingRecv final : public PendingRecv {
   public:
    explicit MpiPendingRecv(Transfer t) : t_(std::move(t)) {}
    void wait() override {
      if (!done_) t_.wait();
      done_ = true;
    }

   private:
    Transfer t_;
    bool done_ = false;
  };
  std::unique_ptr<PendingRecv> start_recv(Channel ch, int peer, void* data, std::size_t bytes,
                                          const std::string& what) override {
    return std::make_unique<MpiPendingRecv>(post(ch, peer, data, bytes, what, false));
  }

  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

  void begin(const Transfer& t) const { begin_wait(t.channel, t.peer, t.what, t.sending); }
  void end(const Transfer& t) const { end_wait(t.channel); }

  void check(int rc, const Transfer& t) const {
    if (rc != MPI_SUCCESS)
      throw ClusterError(label() + ": MPI failed with rank " + std::to_string(t.peer) + " (" + t.what +
                         "): " + mpi_error(rc));
  }

 private:
  Transfer post(Channel ch, int peer, void* data, std::size_t bytes, const std::string& what, bool sending) {
    if (peer < 0 || peer >= size_ || peer == rank_)
      throw ClusterError(label() + ": no transfer with rank " + std::to_string(peer) + " (" + what + ")");
    Transfer t{this, ch, peer, sending, what, {}};
    MPI_Comm comm = comms_[static_cast<int>(ch)];
    auto* p = static_cast<unsigned char*>(data);
    // One message per chunk, in order on the same tag: MPI does not let messages of one sender, tag and
    // communicator overtake each other, so the chunks land where they belong. A transfer of 0 bytes is
    // still one (empty) message, so both sides always agree on the count.
    std::size_t off = 0;
    do {
      const std::size_t n = std::min(kChunkBytes, bytes - off);
      MPI_Request r = MPI_REQUEST_NULL;
      const int count = static_cast<int>(n);
      const int rc = sending ? MPI_Isend(p + off, count, MPI_BYTE, peer, 0, comm, &r)
                             : MPI_Irecv(p + off, count, MPI_BYTE, peer, 0, comm, &r);
      check(rc, t);
      t.requests.push_back(r);
      off += n;
    } while (off < bytes);
    return t;
  }

  int rank_ = 0, size_ = 1, local_size_ = 1, local_rank_ = 0;
  MPI_Comm comms_[kChannels] = {};
};

constexpr std::chrono::milliseconds kSpinFor{100};

void Transfer::wait() {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto limit = std::chrono::duration<double>(world->timeout_s());
  auto pause = std::chrono::microseconds(2);
  world->begin(*this);
  for (;;) {
    int done = 0;
    world->check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), *this);
    if (done) {
      world->end(*this);
      return;
    }
    if (Clock::now() - start > limit) {
      // The requests stay posted (their buffers must outlive them): the caller's error ends the
      // process, and MPI_Abort the job.
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", world->timeout_s());
      throw ClusterError(world->label() + ": no answer from rank " + std::to_string(peer) + " within " + secs +
                         " s (cluster.collective_timeout_s) while waiting for " + what + ": rank " +
                         std::to_string(peer) + " died, hangs or is far behind");
    }
    // MPI moves a large message (in fragments through shared memory, or a socket) only inside its calls:
    // a sleeping poll throttles it to a few fragments per wake-up (a 6 MB stage took ~80 ms, and the
    // demo's 2-rank step 1.01 s against 0.55 s for one rank alone). So poll at once, yielding the core to
    // any thread that wants it, for the first kSpinFor (measured on the demo, 2 ranks x 1 thread: 1 ms
    // 0.90 s a step, 5 ms 0.86, 20 ms 0.71, 100 ms 0.63); then sleep in growing steps (a peer far
    // behind, or a hang, costs no core).
    if (Clock::now() - start < kSpinFor) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
  }
}

}  // namespace

std::unique_ptr<World> World::join(const std::string& mode, double timeout_s) {
  if (mode == "off") return nullptr;
  if (!launched_by_mpi_launcher()) {
    if (mode == "on")
      throw ClusterError(
          "cluster.mode=on, but no MPI launcher started this process (run it as "
          "`mpirun -np N megatrain train ...` or with srun)");
    return nullptr;
  }
  return std::make_unique<MpiWorld>(timeout_s);
}

}  // namespace mt::cluster
