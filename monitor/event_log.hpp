// The monitor's event log: numbered events (step, checkpoint_saved, control, watchdog, ...) kept in a
// bounded backlog that /events streams as server-sent events and replays after Last-Event-ID. Writers
// (the node, the HTTP server) append under a short mutex; readers copy what is newer than their last id.
#pragma once
#include <cstdint>
#include <deque>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::monitor {

struct Event {
  std::uint64_t id = 0;  // 1, 2, ... in order
  std::string type;      // step, checkpoint_saved, control, watchdog, ...
  std::string data;      // one line of JSON
};

class EventLog {
 public:
  explicit EventLog(std::size_t backlog = 4096) : backlog_(backlog) {}
  std::uint64_t append(const std::string& type, const nlohmann::json& data);
  // Events with id > after, oldest first (at most the backlog).
  std::vector<Event> since(std::uint64_t after) const;
  std::uint64_t last_id() const;
  // Also appends events of these types to `path` as JSONL ({"event": type, "t": unix seconds, ...data}),
  // flushed per line: a durable record beside the bounded backlog. Throws naming the path.
  void mirror_to(const std::string& path, std::set<std::string> types);

 private:
  std::size_t backlog_;
  mutable std::mutex mutex_;
  std::deque<Event> events_;
  std::uint64_t next_id_ = 1;
  std::ofstream mirror_;
  std::set<std::string> mirror_types_;
};

}  // namespace mt::monitor
