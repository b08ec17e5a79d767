#include "monitor/status_board.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

namespace mt::monitor {

namespace {
constexpr std::size_t kHistoryLimit = 100000;  // step records kept for /history (about 30 MB at most)
}

const char* actor_name(ActorId a) {
  static const char* const names[kActorCount] = {"loader",    "prefetcher",   "compute", "collector",
                                                 "optimizer", "checkpointer", "node"};
  return names[static_cast<int>(a)];
}

const char* actor_state_name(ActorState s) {
  switch (s) {
    case ActorState::running:
      return "running";
    case ActorState::restarting:
      return "restarting";
    case ActorState::stopped:
      return "stopped";
  }
  return "?";
}

const char* run_state_name(RunState s) {
  switch (s) {
    case RunState::starting:
      return "starting";
    case RunState::running:
      return "running";
    case RunState::paused:
      return "paused";
    case RunState::stopping:
      return "stopping";
    case RunState::done:
      return "done";
    case RunState::failed:
      return "failed";
  }
  return "?";
}

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// --- ActorProbe ---------------------------------------------------------------------------------

void ActorProbe::enter(const char* handler, std::size_t mailbox_depth) {
  const std::int64_t now = steady_ns();
  const std::int64_t idle = idle_since_ns_.load(std::memory_order_relaxed);
  if (idle > 0) wait_ns_.fetch_add(now - idle, std::memory_order_relaxed);
  mailbox_.store(static_cast<std::int64_t>(mailbox_depth), std::memory_order_relaxed);
  since_ns_.store(now, std::memory_order_relaxed);
  handler_.store(handler, std::memory_order_release);
}

void ActorProbe::leave() {
  const std::int64_t now = steady_ns();
  busy_ns_.fetch_add(now - since_ns_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  handler_.store(nullptr, std::memory_order_release);
  idle_since_ns_.store(now, std::memory_order_relaxed);
}

void ActorProbe::unit(std::int64_t step, std::int64_t micro_batch, std::int64_t stage, const char* phase) {
  unit_seq_.fetch_add(1, std::memory_order_acq_rel);  // odd: being written
  unit_step_.store(step, std::memory_order_relaxed);
  unit_mb_.store(micro_batch, std::memory_order_relaxed);
  unit_stage_.store(stage, std::memory_order_relaxed);
  unit_phase_.store(phase, std::memory_order_relaxed);
  unit_seq_.fetch_add(1, std::memory_order_release);
}

void ActorProbe::set_last_failure(const std::string& why) {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  last_failure_ = why;
}

ActorProbe::View ActorProbe::view(std::int64_t now_ns) const {
  View v;
  v.state = static_cast<ActorState>(state_.load(std::memory_order_relaxed));
  const char* h = handler_.load(std::memory_order_acquire);
  const std::int64_t since = since_ns_.load(std::memory_order_relaxed);
  std::int64_t busy = busy_ns_.load(std::memory_order_relaxed);
  std::int64_t wait = wait_ns_.load(std::memory_order_relaxed);
  if (h != nullptr) {
    v.handler = h;
    v.in_handler_s = std::max<std::int64_t>(0, now_ns - since) * 1e-9;
    busy += std::max<std::int64_t>(0, now_ns - since);
  } else {
    const std::int64_t idle = idle_since_ns_.load(std::memory_order_relaxed);
    if (idle > 0) wait += std::max<std::int64_t>(0, now_ns - idle);
  }
  v.busy_s = busy * 1e-9;
  v.wait_s = wait * 1e-9;
  v.mailbox = mailbox_.load(std::memory_order_relaxed);
  v.restarts = restarts_.load(std::memory_order_relaxed);
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::uint32_t s0 = unit_seq_.load(std::memory_order_acquire);
    if (s0 & 1u) continue;
    // Acquire loads, not a fence: ThreadSanitizer does not model fences (-Wtsan).
    const std::int64_t step = unit_step_.load(std::memory_order_acquire);
    const std::int64_t mb = unit_mb_.load(std::memory_order_acquire);
    const std::int64_t stage = unit_stage_.load(std::memory_order_acquire);
    const char* phase = unit_phase_.load(std::memory_order_acquire);
    if (unit_seq_.load(std::memory_order_acquire) != s0) continue;
    if (phase == nullptr) break;
    std::string text;
    if (step >= 0) text += "step " + std::to_string(step);
    if (mb >= 0) text += " micro-batch " + std::to_string(mb);
    if (stage >= 0) text += " stage " + std::to_string(stage);
    text += std::string(text.empty() ? "" : " ") + phase;
    v.last_unit = text;
    break;
  }
  std::lock_guard<std::mutex> lock(failure_mutex_);
  v.last_failure = last_failure_;
  return v;
}

// --- RunFigures ----------------------------------------------------------------------------------

double RunFigures::goodput() const {
  if (wall_s <= 0) return 0.0;
  return std::clamp((wall_s - paused_s - checkpoint_wait_s - restart_s) / wall_s, 0.0, 1.0);
}

double RunFigures::eta_s() const {
  if (tokens_per_s <= 0 || step >= max_steps || step <= first_step || wall_s <= 0) return 0.0;
  // Mean step time of this run's steps so far, pauses excluded.
  const double per_step = std::max(0.0, wall_s - paused_s) / static_cast<double>(step - first_step);
  return per_step * static_cast<double>(max_steps - step);
}

// --- StatusBoard ---------------------------------------------------------------------------------

StatusBoard::StatusBoard() = default;

void StatusBoard::set_run_info(RunInfo info) {
  std::lock_guard<std::mutex> lock(mutex_);
  figures_.max_steps = info.max_steps;
  info_ = std::move(info);
}

RunInfo StatusBoard::run_info() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return info_;
}

RunFigures StatusBoard::figures() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return figures_;
}

void StatusBoard::add_history(nlohmann::json record) {
  std::lock_guard<std::mutex> lock(mutex_);
  history_.push_back(std::move(record));
  if (history_.size() > kHistoryLimit) history_.pop_front();
}

nlohmann::json StatusBoard::history_since(std::int64_t step) const {
  nlohmann::json out = nlohmann::json::array();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& r : history_)
    if (r.value("step", std::int64_t{0}) > step) out.push_back(r);
  return out;
}

std::string StatusBoard::next_control_id() { return "c-" + std::to_string(control_seq_.fetch_add(1) + 1); }

void StatusBoard::post_control(ControlRequest r) {
  std::lock_guard<std::mutex> lock(control_mutex_);
  controls_.push_back(std::move(r));
}

std::vector<ControlRequest> StatusBoard::take_controls() {
  std::lock_guard<std::mutex> lock(control_mutex_);
  std::vector<ControlRequest> out(controls_.begin(), controls_.end());
  controls_.clear();
  return out;
}

void StatusBoard::put_back_controls(std::vector<ControlRequest> rs) {
  std::lock_guard<std::mutex> lock(control_mutex_);
  controls_.insert(controls_.begin(), rs.begin(), rs.end());
}

void StatusBoard::set_devices(int n) {
  device_probes_.clear();
  for (int d = 1; d < n; ++d) {
    device_probes_.emplace_back();  // prefetcher[d]
    device_probes_.emplace_back();  // compute[d]
  }
}

ActorProbe& StatusBoard::probe(ActorId a, int device) {
  if (device <= 0 || (a != ActorId::prefetcher && a != ActorId::compute)) return probe(a);
  return device_probes_.at(static_cast<std::size_t>(2 * (device - 1) + (a == ActorId::compute ? 1 : 0)));
}

std::vector<std::pair<std::string, const ActorProbe*>> StatusBoard::named_probes() const {
  std::vector<std::pair<std::string, const ActorProbe*>> out;
  for (int i = 0; i < kActorCount; ++i) {
    out.emplace_back(actor_name(static_cast<ActorId>(i)), &probes_[i]);
    if (static_cast<ActorId>(i) == ActorId::compute)
      for (std::size_t k = 0; k < device_probes_.size(); ++k)
        out.emplace_back(std::string(k % 2 == 0 ? "prefetcher[" : "compute[") + std::to_string(k / 2 + 1) + "]",
                         &device_probes_[k]);
  }
  return out;
}

void StatusBoard::set_ranks(nlohmann::json ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  ranks_ = std::move(ranks);
}

void StatusBoard::set_rank_live(int rank, nlohmann::json last_collective) {
  std::lock_guard<std::mutex> lock(mutex_);
  own_rank_ = rank;
  own_live_ = std::move(last_collective);
}

nlohmann::json StatusBoard::status_json() const {
  const RunInfo info = run_info();
  const RunFigures f = figures();
  nlohmann::json ranks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ranks = ranks_;
    if (own_rank_ >= 0 && own_rank_ < static_cast<int>(ranks.size())) {
      ranks[static_cast<std::size_t>(own_rank_)]["last_collective"] = own_live_;
      ranks[static_cast<std::size_t>(own_rank_)]["live"] = true;
    }
  }
  nlohmann::json run{{"model", info.model},
                     {"arch", info.arch},
                     {"params", info.params},
                     {"layers", info.layers},
                     {"max_steps", info.max_steps},
                     {"batch", info.batch},
                     {"seq", info.seq},
                     {"micro_batches", info.micro_batches},
                     {"backend", info.backend},
                     {"kernel_choices", info.kernel_choices},
                     {"bf16", info.bf16},
                     {"output_dir", info.output_dir},
                     {"pid", info.pid}};
  nlohmann::json actors = nlohmann::json::array();
  const std::int64_t now = steady_ns();
  for (const auto& [name, probe] : named_probes()) {
    const ActorProbe::View v = probe->view(now);
    actors.push_back({{"name", name},
                      {"state", actor_state_name(v.state)},
                      {"handler", v.handler},
                      {"in_handler_s", v.in_handler_s},
                      {"last_unit", v.last_unit},
                      {"busy_s", v.busy_s},
                      {"wait_s", v.wait_s},
                      {"mailbox", v.mailbox},
                      {"restarts", v.restarts},
                      {"last_failure", v.last_failure}});
  }
  nlohmann::json last_ckpt = nullptr;
  if (f.last_checkpoint)
    last_ckpt = {{"step", f.last_checkpoint->step},
                 {"path", f.last_checkpoint->path},
                 {"bytes", f.last_checkpoint->bytes},
                 {"seconds", f.last_checkpoint->seconds}};
  return {{"run", run},
          {"state", run_state_name(f.state)},
          {"step", f.step},
          {"tokens", f.tokens},
          {"loss", f.loss},
          {"lr", f.lr},
          {"grad_norm", f.grad_norm},
          {"tokens_per_s", f.tokens_per_s},
          {"eta_s", f.eta_s()},
          {"wall_s", f.wall_s},
          {"goodput", f.goodput()},
          {"link",
           {{"h2d_bytes", f.h2d_bytes},
            {"d2h_bytes", f.d2h_bytes},
            {"h2d_bytes_per_s", f.h2d_bytes_per_s},
            {"d2h_bytes_per_s", f.d2h_bytes_per_s}}},
          {"arena", {{"in_use", f.arena_in_use}, {"peak", f.arena_peak}, {"budget", f.arena_budget}}},
          {"cores",
           {{"cores", f.cores},
            {"host_threads", f.host_threads},
            {"others_cores", f.others_cores},
            {"steal_cores", f.steal_cores},
            {"losing_cores", f.losing_cores}}},
          {"host_resident_bytes", host_resident_bytes()},
          {"actors", actors},
          {"last_checkpoint", last_ckpt},
          {"ranks", ranks},
          {"last_error", f.last_error}};
}

std::uint64_t host_resident_bytes() {
  std::ifstream in("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace mt::monitor
