#include "monitor/audit_log.hpp"

#include <stdexcept>

#include "monitor/status_board.hpp"

namespace mt::monitor {

void AuditLog::open(const std::string& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  out_.open(path, std::ios::app);
  if (!out_) throw std::runtime_error("cannot write the monitor audit log " + path);
}

void AuditLog::append(nlohmann::json fields) {
  nlohmann::json line{{"t", unix_seconds()}};
  line.update(fields);
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!out_.is_open()) return;
  out_ << text << '\n';
  out_.flush();
}

}  // namespace mt::monitor
