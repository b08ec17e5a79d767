// The monitor endpoint's routes, independent of the transport: a parsed request in, a response out.
// GET /metrics, /status, /history?since=N and the dashboard's files; POST /control/* with a bearer
// token (posts a ControlRequest to the board for the node to carry out, replies 202 with its id).
// /events (server-sent events) is streamed by the HTTP server itself.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "monitor/audit_log.hpp"
#include "monitor/event_log.hpp"
#include "monitor/status_board.hpp"

namespace mt::monitor {

struct Request {
  std::string method;         // "GET", "POST", ...
  std::string target;         // path and query, as sent
  std::string authorization;  // the Authorization header ("" = none)
  std::string peer;           // address:port of the client
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra (Allow, WWW-Authenticate)
};

struct RouteContext {
  StatusBoard& board;
  EventLog& events;
  AuditLog& audit;
  std::string token;
  bool allow_fault_injection = false;
};

// The request's path without the query, and one query parameter's value ("" = absent).
std::string target_path(const std::string& target);
std::string query_param(const std::string& target, const std::string& name);

// True for GET /events (the server streams it).
bool is_event_stream(const Request& r);

// An error reply {"error": message} with the status.
Response error_response(int status, const std::string& message);

Response route(RouteContext& ctx, const Request& r);

}  // namespace mt::monitor
