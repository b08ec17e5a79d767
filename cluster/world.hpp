// The ranks of a multi-process job: one node process per rank, started by an MPI launcher (`mpirun -np
// N megatrain train ...`, or Slurm's `srun`), every rank with its own actor pipeline on its own
// micro-batches. This header has no MPI (and no CAF) in it: world_mpi.cpp is the only file that
// includes <mpi.h>, and a build without MPI links world_alone.cpp instead (the node then runs alone).
//
// Every transfer blocks its calling thread until it is done or `timeout_s` passed; a timeout throws
// ClusterError naming this rank, the rank it was waiting for and what for, so no rank hangs forever in
// a collective when a peer died or stopped. Transfers are thread-safe (MPI_THREAD_MULTIPLE): each
// Channel is a communicator of its own, used by one thread of every rank in the same order (the
// collector: gradients; the optimizer: losses; the node's thread: control), so messages of different
// threads never match each other.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

namespace mt::cluster {

class ClusterError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// weights: the optimizer's (cluster.shard_state), on the same thread as losses but counted apart;
// checkpoint: the checkpointers' (the owners' moments to rank 0, cluster.shard_state).
enum class Channel { control = 0, grads = 1, losses = 2, weights = 3, checkpoint = 4 };
constexpr int kChannels = 5;
const char* channel_name(Channel ch);  // "grads", "losses", ...

// A transfer this rank waited for (the monitor's "last collective"): with whom, what, how long.
struct TransferView {
  Channel channel = Channel::control;
  int peer = -1;
  std::string what;
  bool sending = false;
  bool done = true;      // false: still waiting for it
  double seconds = 0.0;  // waited so far (in progress) or in all (done)
};

// True when this build has MPI (world_mpi.cpp), false for world_alone.cpp.
bool built_with_mpi();
// True when the environment is an MPI launcher's (mpirun / mpiexec: OMPI_COMM_WORLD_SIZE, PMIX_RANK;
// srun and other PMI launchers: PMI_SIZE, PMI_RANK, PMIX_RANK). Only decides whether MPI is initialised:
// the rank and the number of ranks then come from MPI itself.
bool launched_by_mpi_launcher();

class World {
 public:
  // cluster.mode: "auto" joins the job when a launcher started this process (else returns null: run
  // alone), "on" joins or throws (no launcher, or a build without MPI), "off" returns null. The job's
  // timeout for every transfer: cluster.collective_timeout_s. Call once per process, before any thread
  // that uses the world starts; the world finalizes MPI when destroyed.
  static std::unique_ptr<World> join(const std::string& mode, double timeout_s);
  virtual ~World() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The ranks of this job on this host (they share its cores), and this rank's place among them (0 ..
  // local_size - 1, in rank order): a rank's GPU is its local rank on the host.
  virtual int local_size() const { return 1; }
  virtual int local_rank() const { return 0; }
  double timeout_s() const { return timeout_s_; }

  // Point-to-point, blocking with the timeout. `what` says what the bytes are (in a timeout's error).
  virtual void send(Channel ch, int peer, const void* data, std::size_t bytes, const std::string& what) = 0;
  virtual void recv(Channel ch, int peer, void* data, std::size_t bytes, const std::string& what) = 0;

  // An asynchronous receive (the owner's gather posts one per rank, then adds them in rank order as
  // each lands): start() returns a handle, wait() blocks until that receive is complete (timeout).
  class PendingRecv {
   public:
    virtual ~PendingRecv() = default;
    virtual void wait() = 0;
  };
  virtual std::unique_ptr<PendingRecv> start_recv(Channel ch, int peer, void* data, std::size_t bytes,
                                                  const std::string& what) = 0;

  // Every rank's `bytes` bytes, in rank order, into `all` (size() * bytes): point-to-point, so a
  // timeout names the rank that did not answer.
  void allgather(Channel ch, const void* mine, std::size_t bytes, void* all, const std::string& what);
  // Rank `root`'s text to every rank.
  void broadcast(Channel ch, int root, std::string& text, const std::string& what);
  // A text of any length to one peer (its length first, then its bytes), and its receipt.
  void send_text(Channel ch, int peer, const std::string& text, const std::string& what);
  std::string recv_text(Channel ch, int peer, const std::string& what);

  // Ends every rank of the job at once with `code` (after this rank failed: its peers would otherwise
  // wait for it until their timeout).
  [[noreturn]] virtual void abort(int code) = 0;

  // "rank R of N" for messages.
  std::string label() const;

  // Bytes this rank has sent on `ch` so far (every transfer's payload, counted once it is done).
  std::uint64_t bytes_sent(Channel ch) const { return sent_[static_cast<int>(ch)].load(); }

  // What this rank waited for last, over every channel: the transfer it has been waiting for longest
  // if any is in progress (a hung or slow peer is named by what its peers wait for), else the one
  // that finished last; nullopt before the first. Any thread may ask (the monitor's tick).
  std::optional<TransferView> last_transfer() const;
  // A wait for one transfer begins / ends (a wait that throws stays "in progress"): the World's own, and
  // a device transport's (device/grad_transport.hpp), so last_transfer shows those too.
  void begin_wait(Channel ch, int peer, const std::string& what, bool sending) const;
  void end_wait(Channel ch) const;

 protected:
  explicit World(double timeout_s) : timeout_s_(timeout_s) {}
  void count_sent(Channel ch, std::size_t bytes) { sent_[static_cast<int>(ch)].fetch_add(bytes); }

 private:
  double timeout_s_;
  std::atomic<std::uint64_t> sent_[kChannels] = {};
  struct Wait {  // one channel's current or last wait (steady-clock ns; end 0 = in progress)
    int peer = -1;
    std::string what;
    bool sending = false;
    std::int64_t start_ns = 0, end_ns = 0;
  };
  mutable std::mutex waits_mutex_;  // a transfer's wait is long beside this lock
  mutable Wait waits_[kChannels];
};

}  // namespace mt::cluster
