// What megatrain-top shows, as plain text lines: the run, step progress, loss and tokens/s sparklines,
// link rates, every actor (state, busy share, mailbox, restarts, handler and for how long), the last
// events; in a job of several ranks every rank's step, busiest actor and last collective (a rank
// behind or waiting long named). The live view and --once print the same lines; the live view adds colour.
#pragma once
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::monitor_client {

// Per-step series for the sparklines, fed from /history and `step` events (each step once).
struct StepSeries {
  std::int64_t last_step = -1;
  std::vector<double> loss, tokens_per_s;
  // Adds a step record (a /history element or a `step` event's data); false if already seen.
  bool add(const nlohmann::json& record);
};

struct SnapshotInput {
  nlohmann::json status;                 // /status
  std::optional<nlohmann::json> before;  // an earlier /status: busy shares over the interval between
  double interval_s = 0;                 // seconds between `before` and `status`
  const StepSeries* series = nullptr;
  std::deque<std::string> events;  // newest last, already formatted (format_event)
  std::string url;
  double stuck_after_s = 30;  // an actor in one handler this long is flagged STUCK
  int width = 100;            // the sparklines' and lines' width budget
  bool colour = false;        // ANSI colours (live view)
};

std::vector<std::string> render_snapshot(const SnapshotInput& in);
// One line for an event of /events (type, JSON data), e.g. "checkpoint_saved  step 40 -> out/step-40 (...)".
std::string format_event(const std::string& type, const std::string& data);
// Sparkline of the last `width` values with block characters (UTF-8).
std::string sparkline(const std::vector<double>& values, int width);

}  // namespace mt::monitor_client
