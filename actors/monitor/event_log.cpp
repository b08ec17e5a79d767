#include "actors/monitor/event_log.hpp"

namespace mt::monitor {

std::uint64_t EventLog::append(const std::string& type, const nlohmann::json& data) {
  // Invalid UTF-8 (an error text from a file name, say) is replaced rather than thrown on.
  std::string text = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::lock_guard<std::mutex> lock(mutex_);
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

std::uint64_t EventLog::last_id() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_id_ - 1;
}

}  // namespace mt::monitor
