// The monitor's HTTP server: Boost.Beast on Boost.Asio, one I/O thread of its own. It answers each
// request from the routes (which only read the status board and post control requests), streams
// /events as server-sent events, and bounds what a client can cost: request size (413), time to send
// a request (408), concurrent connections (503), time a reply may take to be read (the connection is
// closed). Nothing here calls into an actor.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "monitor/routes.hpp"

namespace mt::monitor {

struct HttpServerOptions {
  std::string bind = "127.0.0.1";
  int port = 0;                         // 0 = any free port
  std::size_t max_connections = 64;     // more at once are answered 503 and closed
  double request_timeout_s = 5.0;       // a request must arrive whole within this (else 408)
  double write_timeout_s = 30.0;        // a reply (or an event) must be taken within this (else closed)
  std::size_t max_header_bytes = 8192;  // request line + headers (else 413)
  std::size_t max_body_bytes = 16384;   // request body (else 413)
  double events_poll_s = 0.1;           // how often an /events stream looks for new events
  double keepalive_s = 15.0;            // ": keepalive" comment on an idle /events stream
};

class HttpServer {
 public:
  HttpServer(RouteContext& routes, HttpServerOptions options);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens (throws std::runtime_error naming bind:port on failure), then serves on its thread.
  void start();
  int port() const;  // the bound port (after start)
  // Closes the listener and every connection, joins the thread. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt::monitor
