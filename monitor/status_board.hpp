// The status board: what the running engine publishes for the monitor endpoint to read. No CAF, no
// Boost. Actors write their own probe with relaxed atomics (never a lock on their hot path); the node
// writes the run's figures once per step and once per tick under a short mutex; the HTTP server only
// reads (copies a snapshot) and posts control requests into a queue the node drains. Neither side
// ever waits for the other.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::monitor {

// Every actor of a run, in the order /status and /metrics list them.
enum class ActorId : int { loader, prefetcher, compute, collector, optimizer, checkpointer, node };
inline constexpr int kActorCount = 7;
const char* actor_name(ActorId a);

enum class ActorState : int { running, restarting, stopped };
const char* actor_state_name(ActorState s);

enum class RunState : int { starting, running, paused, stopping, done, failed };
const char* run_state_name(RunState s);

// Nanoseconds on the steady clock (the probes' time base).
std::int64_t steady_ns();
double unix_seconds();

// What one actor is doing. Written only by the actor's own thread (enter/leave/unit) or, for the
// state, restarts and last failure, by the node; read by anyone. Survives the actor's restarts.
class ActorProbe {
 public:
  // A handler starts: the time since the last one ended counts as mailbox wait.
  void enter(const char* handler, std::size_t mailbox_depth);
  // The handler ends: its time counts as busy.
  void leave();
  // The last unit of work completed (step, micro-batch, stage; -1 = not applicable) and its phase name.
  void unit(std::int64_t step, std::int64_t micro_batch, std::int64_t stage, const char* phase);

  void set_state(ActorState s) { state_.store(static_cast<int>(s), std::memory_order_relaxed); }
  void count_restart() { restarts_.fetch_add(1, std::memory_order_relaxed); }
  void set_last_failure(const std::string& why);

  struct View {
    ActorState state = ActorState::running;
    std::string handler = "idle";  // the message name, or "idle"
    double in_handler_s = 0.0;     // 0 when idle
    std::string last_unit;         // "step 5 micro-batch 0 stage 3 backward", "" when none yet
    double busy_s = 0.0, wait_s = 0.0;
    std::int64_t mailbox = 0, restarts = 0;
    std::string last_failure;
  };
  View view(std::int64_t now_ns) const;

 private:
  std::atomic<const char*> handler_{nullptr};   // a string literal; nullptr = idle
  std::atomic<std::int64_t> since_ns_{0};       // the handler's start
  std::atomic<std::int64_t> idle_since_ns_{0};  // the last handler's end (0 = never ran)
  std::atomic<std::int64_t> busy_ns_{0}, wait_ns_{0};
  std::atomic<std::int64_t> mailbox_{0}, restarts_{0};
  std::atomic<int> state_{0};
  // The last unit, published with a sequence counter (odd while being written).
  std::atomic<std::uint32_t> unit_seq_{0};
  std::atomic<std::int64_t> unit_step_{-1}, unit_mb_{-1}, unit_stage_{-1};
  std::atomic<const char*> unit_phase_{nullptr};
  mutable std::mutex failure_mutex_;
  std::string last_failure_;
};

// RAII: enter on construction, leave on destruction (also when the handler throws).
class HandlerScope {
 public:
  HandlerScope(ActorProbe& p, const char* handler, std::size_t mailbox_depth) : p_(p) {
    p_.enter(handler, mailbox_depth);
  }
  ~HandlerScope() { p_.leave(); }
  HandlerScope(const HandlerScope&) = delete;
  HandlerScope& operator=(const HandlerScope&) = delete;

 private:
  ActorProbe& p_;
};

// The run's configuration summary (/status "run"); set once before the endpoint starts.
struct RunInfo {
  std::string model, arch, backend, output_dir;
  nlohmann::json kernel_choices = nlohmann::json::object();  // kernels chosen by measurement, and why
  std::int64_t params = 0, layers = 0, max_steps = 0, batch = 0, seq = 0, micro_batches = 0;
  bool bf16 = false;
  long pid = 0;
  std::int64_t tokens_per_step = 0;
};

// One checkpoint published.
struct CheckpointFigures {
  std::int64_t step = 0;
  std::string path;
  std::uint64_t bytes = 0;
  double seconds = 0.0;
};

// The run's figures (the node writes them; readers copy them).
struct RunFigures {
  RunState state = RunState::starting;
  std::int64_t first_step = 0, step = 0, tokens = 0;
  double loss = 0.0, lr = 0.0, grad_norm = 0.0, tokens_per_s = 0.0, model_flops_per_s = 0.0;
  double last_step_unix = 0.0;  // 0 = no step yet
  std::uint64_t h2d_bytes = 0, d2h_bytes = 0;
  double h2d_bytes_per_s = 0.0, d2h_bytes_per_s = 0.0;  // over the last step
  std::uint64_t h2d_at_last_step = 0, d2h_at_last_step = 0;
  std::uint64_t arena_in_use = 0, arena_peak = 0, arena_budget = 0;
  std::int64_t checkpoints = 0;
  std::uint64_t checkpoint_bytes = 0;
  double checkpoint_seconds = 0.0;
  std::optional<CheckpointFigures> last_checkpoint;
  // Goodput: wall time since the start, minus time paused, waiting for checkpoints and restarting.
  // All four are the run's: wall_s counts from the first training segment's start (evaluations between
  // segments included), and each segment's pause and restart seconds add to those of the ones before.
  double wall_s = 0.0, paused_s = 0.0, checkpoint_wait_s = 0.0, restart_s = 0.0;
  std::int64_t run_started = 0, segment_started = 0;     // steady-clock ticks; 0 = no segment yet
  double paused_before_s = 0.0, restart_before_s = 0.0;  // the segments' before this one
  std::string last_error;
  double goodput() const;
  double eta_s() const;  // 0 when unknown
  std::int64_t max_steps = 0;
  // Cores other processes take from this run (threads.adapt_to_load) and the host threads it runs.
  int cores = 0, host_threads = 0;
  double others_cores = 0.0, steal_cores = 0.0;
  bool losing_cores = false;
};

// A control request the server accepted, for the node to carry out.
struct ControlRequest {
  std::string id;      // "c-N"
  std::string action;  // checkpoint | pause | resume | stop | restart | fault
  std::string actor;   // restart / fault
  std::string peer;    // who asked (address:port)
};

class StatusBoard {
 public:
  StatusBoard();

  ActorProbe& probe(ActorId a) { return probes_[static_cast<int>(a)]; }
  const ActorProbe& probe(ActorId a) const { return probes_[static_cast<int>(a)]; }
  // device.gpus = N: devices 1..N-1 have a prefetcher and a compute probe of their own, listed as
  // "prefetcher[d]" and "compute[d]" after device 0's (the plain names). Call once, before any actor
  // runs. probe(a, d) is probe(a) for device 0 and for the roles that are not per device.
  void set_devices(int n);
  ActorProbe& probe(ActorId a, int device);
  // Every probe with its name, in the order /status and /metrics list them.
  std::vector<std::pair<std::string, const ActorProbe*>> named_probes() const;

  void set_run_info(RunInfo info);
  RunInfo run_info() const;

  // The node: read-modify-write of the figures under the board's mutex.
  template <class F>
  void update(F&& f) {
    std::lock_guard<std::mutex> lock(mutex_);
    f(figures_);
  }
  RunFigures figures() const;

  // Step records (the train.jsonl fields + "t", "h2d_bytes", "d2h_bytes"), bounded.
  void add_history(nlohmann::json record);
  nlohmann::json history_since(std::int64_t step) const;  // a JSON array of records with "step" > step

  // Control: the server posts, the node takes (FIFO). Ids are numbered here.
  std::string next_control_id();
  void post_control(ControlRequest r);
  std::vector<ControlRequest> take_controls();
  void put_back_controls(std::vector<ControlRequest> rs);  // the node could not do them yet (front)

  // A job of several ranks: every rank's status as the last loss gather carried it (a JSON array by
  // rank: step, slowest_actor, slowest_busy_s, last_collective, updated_unix), and this rank's own
  // last transfer live (set each tick), shown in its entry with "live": true. /status "ranks".
  void set_ranks(nlohmann::json ranks);
  void set_rank_live(int rank, nlohmann::json last_collective);

  // /status as JSON.
  nlohmann::json status_json() const;

 private:
  ActorProbe probes_[kActorCount];
  std::deque<ActorProbe> device_probes_;  // devices 1..N-1: prefetcher, compute, in device order
  mutable std::mutex mutex_;
  RunInfo info_;
  RunFigures figures_;
  std::deque<nlohmann::json> history_;
  nlohmann::json ranks_ = nlohmann::json::array();
  int own_rank_ = -1;
  nlohmann::json own_live_;
  std::mutex control_mutex_;
  std::deque<ControlRequest> controls_;
  std::atomic<std::int64_t> control_seq_{0};
};

// Resident set size of this process (from /proc/self/statm), 0 when unknown.
std::uint64_t host_resident_bytes();

}  // namespace mt::monitor
