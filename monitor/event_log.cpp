#include "monitor/event_log.hpp"

#include <stdexcept>

#include "monitor/status_board.hpp"

namespace mt::monitor {

std::uint64_t EventLog::append(const std::string& type, const nlohmann::json& data) {
  // Invalid UTF-8 (an error text from a file name, say) is replaced rather than thrown on.
  std::string text = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::lock_guard<std::mutex> lock(mutex_);
  if (mirror_.is_open() && mirror_types_.count(type)) {
    nlohmann::json line{{"event", type}, {"t", unix_seconds()}};
    if (data.is_object()) line.update(data);
    mirror_ << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    mirror_.flush();
  }
  const std::uint64_t id = next_id_++;
  events_.push_back(Event{id, type, std::move(text)});
  if (events_.size() > backlog_) events_.pop_front();
  return id;
}

std::vector<Event> EventLog::since(std::uint64_t after) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Event> out;
  for (auto it = events_.rbegin(); it != events_.rend() && it->id > after; ++it) out.push_back(*it);
  return {out.rbegin(), out.rend()};
}

void EventLog::mirror_to(const std::string& path, std::set<std::string> types) {
  std::lock_guard<std::mutex> lock(mutex_);
  mirror_.open(path, std::ios::app);
  if (!mirror_) throw std::runtime_error("cannot write " + path + " (log.events_jsonl / train.output_dir)");
  mirror_types_ = std::move(types);
}

std::uint64_t EventLog::last_id() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_id_ - 1;
}

}  // namespace mt::monitor
