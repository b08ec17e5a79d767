#include "monitor/routes.hpp"

#include <cstdlib>

#include "monitor/metrics_text.hpp"
#include "monitor/token.hpp"

#ifdef MEGATRAIN_HAVE_DASHBOARD
#include "monitor/dashboard/dashboard_asset.hpp"
#endif

namespace mt::monitor {

namespace {

const char* const kGetPaths[] = {"/metrics", "/status", "/history", "/events"};
const char* const kControlActions[] = {"checkpoint", "pause", "resume", "stop", "restart", "fault"};
// Actors a control request may restart or fault: the node's pipeline actors.
const char* const kRestartable[] = {"loader", "prefetcher", "compute", "collector", "optimizer"};

Response json_response(int status, const nlohmann::json& body) {
  Response r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return r;
}

bool is_get_path(const std::string& path) {
  for (const char* p : kGetPaths)
    if (path == p) return true;
  return false;
}

Response control(RouteContext& ctx, const Request& r, const std::string& action) {
  const std::string actor = query_param(r.target, "actor");
  nlohmann::json audit{{"peer", r.peer}, {"action", action}};
  if (!actor.empty()) audit["actor"] = actor;
  auto refuse = [&](int status, const std::string& why) {
    audit["outcome"] = "refused";
    audit["http_status"] = status;
    audit["error"] = why;
    ctx.audit.append(audit);
    Response resp = error_response(status, why);
    if (status == 401) resp.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"megatrain\"");
    return resp;
  };
  const std::string scheme = "Bearer ";
  if (r.authorization.empty()) return refuse(401, "no bearer token (Authorization: Bearer <token>)");
  if (r.authorization.size() <= scheme.size() || r.authorization.compare(0, scheme.size(), scheme) != 0)
    return refuse(401, "the Authorization header is not 'Bearer <token>'");
  if (!token_equal(ctx.token, r.authorization.substr(scheme.size()))) return refuse(403, "wrong token");
  if (action == "fault" && !ctx.allow_fault_injection)
    return refuse(403, "fault injection is off (only a test build turns it on)");
  if (action == "restart" || action == "fault") {
    bool known = false;
    for (const char* a : kRestartable) known = known || actor == a;
    if (!known)
      return refuse(400,
                    actor.empty()
                        ? "missing ?actor=NAME (one of loader, prefetcher, compute, collector, optimizer)"
                        : "unknown actor '" + actor + "' (one of loader, prefetcher, compute, collector, optimizer)");
  } else if (!actor.empty()) {
    return refuse(400, "/control/" + action + " takes no actor");
  }
  ControlRequest req{ctx.board.next_control_id(), action, actor, r.peer};
  nlohmann::json body{{"id", req.id}, {"action", action}, {"status", "accepted"}};
  if (!actor.empty()) body["actor"] = actor;
  audit["id"] = req.id;
  audit["outcome"] = "accepted";
  ctx.audit.append(audit);
  ctx.events.append("control", body);
  ctx.board.post_control(std::move(req));
  return json_response(202, body);
}

}  // namespace

std::string target_path(const std::string& target) { return target.substr(0, target.find('?')); }

std::string query_param(const std::string& target, const std::string& name) {
  const auto q = target.find('?');
  if (q == std::string::npos) return "";
  std::size_t pos = q + 1;
  while (pos <= target.size()) {
    const auto amp = target.find('&', pos);
    const std::string item = target.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
    const auto eq = item.find('=');
    if (item.substr(0, eq) == name) return eq == std::string::npos ? "" : item.substr(eq + 1);
    if (amp == std::string::npos) break;
    pos = amp + 1;
  }
  return "";
}

bool is_event_stream(const Request& r) { return r.method == "GET" && target_path(r.target) == "/events"; }

Response error_response(int status, const std::string& message) {
  return json_response(status, nlohmann::json{{"error", message}});
}

Response route(RouteContext& ctx, const Request& r) {
  const std::string path = target_path(r.target);
  if (path.rfind("/control/", 0) == 0) {
    const std::string action = path.substr(9);
    bool known = false;
    for (const char* a : kControlActions) known = known || action == a;
    if (!known) return error_response(404, "no such control action: " + path);
    if (r.method != "POST") {
      Response resp = error_response(405, path + " takes POST");
      resp.headers.emplace_back("Allow", "POST");
      return resp;
    }
    return control(ctx, r, action);
  }
  if (r.method != "GET" && r.method != "HEAD") {
    Response resp = error_response(405, path + " takes GET");
    resp.headers.emplace_back("Allow", "GET, HEAD");
    return resp;
  }
  if (path == "/metrics") {
    Response resp;
    resp.content_type = kMetricsContentType;
    resp.body = metrics_text(ctx.board);
    return resp;
  }
  if (path == "/status") return json_response(200, ctx.board.status_json());
  if (path == "/history") {
    const std::string since = query_param(r.target, "since");
    std::int64_t after = -1;
    if (!since.empty()) {
      char* end = nullptr;
      after = std::strtoll(since.c_str(), &end, 10);
      if (end == since.c_str() || *end != 0)
        return error_response(400, "since must be an integer step, got '" + since + "'");
    }
    return json_response(200, ctx.board.history_since(after));
  }
#ifdef MEGATRAIN_HAVE_DASHBOARD
  if (!is_get_path(path))
    if (auto asset = dashboard_asset(r.target)) {
      Response resp;
      resp.content_type = std::string(asset->content_type);
      resp.body = std::string(asset->body);
      return resp;
    }
#else
  (void)is_get_path;
#endif
  return error_response(404, "no such path: " + path);
}

}  // namespace mt::monitor
