// One run's monitor: the status board the actors publish to, the event log, the audit log and (when
// monitor.enabled) the HTTP endpoint serving them. The engine (run_engine) owns one per run, so the
// node binary and an in-process run both get it. Discovery: start() prints
//   megatrain: monitor listening on http://HOST:PORT (token in FILE)
// and writes <output_dir>/monitor.json {"pid","url","host","port","token_file"}; stop() removes it.
#pragma once
#include <memory>
#include <string>

#include "config/train_config.hpp"
#include "monitor/audit_log.hpp"
#include "monitor/event_log.hpp"
#include "monitor/http_server.hpp"
#include "monitor/status_board.hpp"

namespace mt::monitor {

class Monitor {
 public:
  Monitor(const MonitorSection& options, std::string output_dir);
  ~Monitor();  // stop()

  // Starts the endpoint when enabled: the token (read or generated), the audit log, the server, the
  // discovery file. Throws std::runtime_error naming the key or file on failure.
  void start();
  void stop();

  StatusBoard& board() { return board_; }
  EventLog& events() { return events_; }
  AuditLog& audit() { return audit_; }
  bool serving() const { return server_ != nullptr; }
  int port() const;
  std::string url() const;

  // A control request's progress (took_effect, durable, failed): a `control` event and an audit line.
  void control_progress(const ControlRequest& r, const std::string& status, nlohmann::json extra = {});

 private:
  MonitorSection options_;
  std::string output_dir_;
  StatusBoard board_;
  EventLog events_;
  AuditLog audit_;
  std::unique_ptr<RouteContext> routes_;
  std::unique_ptr<HttpServer> server_;
  std::string discovery_path_;
};

}  // namespace mt::monitor
