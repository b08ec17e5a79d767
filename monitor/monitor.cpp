#include "monitor/monitor.hpp"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "monitor/token.hpp"

namespace mt::monitor {

Monitor::Monitor(const MonitorSection& options, std::string output_dir)
    : options_(options), output_dir_(std::move(output_dir)) {}

Monitor::~Monitor() { stop(); }

void Monitor::start() {
  if (!options_.enabled || server_) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(output_dir_, ec);
  std::string token_file = options_.token_file;
  std::string token;
  if (token_file.empty()) {
    token_file = (fs::path(output_dir_) / "monitor.token").string();
    token = random_token();
    write_token_file(token_file, token);
  } else {
    token = read_token_file(token_file);
  }
  audit_.open((fs::path(output_dir_) / "audit.jsonl").string());
  routes_ =
      std::make_unique<RouteContext>(RouteContext{board_, events_, audit_, token, options_.allow_fault_injection});
  HttpServerOptions o;
  o.bind = options_.bind;
  o.port = static_cast<int>(options_.port);
  server_ = std::make_unique<HttpServer>(*routes_, o);
  try {
    server_->start();
  } catch (...) {
    server_.reset();
    throw;
  }
  discovery_path_ = (fs::path(output_dir_) / "monitor.json").string();
  const nlohmann::json disc{{"pid", static_cast<long>(::getpid())},
                            {"url", url()},
                            {"host", options_.bind},
                            {"port", port()},
                            {"token_file", fs::absolute(token_file).string()}};
  {
    const std::string tmp = discovery_path_ + ".tmp";
    std::ofstream out(tmp, std::ios::trunc);
    out << disc.dump() << '\n';
    out.close();
    if (!out) throw std::runtime_error("cannot write " + tmp);
    fs::rename(tmp, discovery_path_);
  }
  std::printf("megatrain: monitor listening on %s (token in %s)\n", url().c_str(), token_file.c_str());
  std::fflush(stdout);
}

void Monitor::stop() {
  if (!server_) return;
  // Event streams poll every 0.1 s: let them send the run's last events before the server closes.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  server_->stop();
  server_.reset();
  std::error_code ec;
  if (!discovery_path_.empty()) std::filesystem::remove(discovery_path_, ec);
}

int Monitor::port() const { return server_ ? server_->port() : 0; }

std::string Monitor::url() const {
  const bool v6 = options_.bind.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + options_.bind + "]" : options_.bind) + ":" + std::to_string(port());
}

void Monitor::control_progress(const ControlRequest& r, const std::string& status, nlohmann::json extra) {
  nlohmann::json ev{{"id", r.id}, {"action", r.action}, {"status", status}};
  if (!r.actor.empty()) ev["actor"] = r.actor;
  if (extra.is_object()) ev.update(extra);
  events_.append("control", ev);
  nlohmann::json a = ev;
  a["peer"] = r.peer;
  a["outcome"] = status;
  a.erase("status");
  audit_.append(a);
}

}  // namespace mt::monitor
