// <output_dir>/audit.jsonl: every control request (who asked, what, the outcome), one JSON line each,
// appended and flushed as it happens, from the HTTP server (accepted / refused) and the node (took
// effect, durable, failed).
#pragma once
#include <fstream>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

namespace mt::monitor {

class AuditLog {
 public:
  AuditLog() = default;
  void open(const std::string& path);  // throws naming the path
  // Appends {"t": unix seconds, ...fields}. A no-op before open().
  void append(nlohmann::json fields);

 private:
  std::mutex mutex_;
  std::ofstream out_;
};

}  // namespace mt::monitor
