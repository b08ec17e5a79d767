// The monitor endpoint's parts without an engine: the token file, the event log, the routes' answers
// (auth, unknown paths and methods, control requests reaching the board) and the HTTP server's limits
// over real loopback sockets (oversized, malformed, slow and too many clients), each bounded in time.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "monitor/http_server.hpp"
#include "monitor/metrics_text.hpp"
#include "monitor/routes.hpp"
#include "monitor/token.hpp"

namespace fs = std::filesystem;
using namespace mt::monitor;

namespace {

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Everything the server sends until it closes (or 10 s pass).
std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

std::string round_trip(int port, const std::string& request) {
  const int fd = connect_to(port);
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  const std::string reply = read_all(fd);
  ::close(fd);
  return reply;
}

int status_of(const std::string& reply) { return reply.size() > 12 ? std::stoi(reply.substr(9, 3)) : 0; }

// One response's head read from `stream` at `pos`: the status, the Content-Length (-1 = none) and
// where the head ends (the first byte after its blank line; npos when the head is incomplete).
struct ResponseHead {
  int status = 0;
  long long content_length = -1;
  std::size_t end = std::string::npos;
};

ResponseHead response_head(const std::string& stream, std::size_t pos) {
  ResponseHead h;
  const std::size_t blank = stream.find("\r\n\r\n", pos);
  if (blank == std::string::npos || stream.compare(pos, 9, "HTTP/1.1 ") != 0) return h;
  h.status = std::stoi(stream.substr(pos + 9, 3));
  h.end = blank + 4;
  const std::string head = stream.substr(pos, blank - pos);
  const std::size_t cl = head.find("\r\nContent-Length: ");
  if (cl != std::string::npos) h.content_length = std::stoll(head.substr(cl + 18));
  return h;
}

struct Fixture {
  StatusBoard board;
  EventLog events;
  AuditLog audit;
  RouteContext routes{board, events, audit, "s3cret", false};
};

}  // namespace

TEST_CASE("monitor token: 256 random bits, a 0600 file, read back trimmed", "[monitor]") {
  const std::string a = random_token(), b = random_token();
  CHECK(a.size() == 64);
  CHECK(a != b);
  const fs::path p = fs::temp_directory_path() / ("mt_token_" + std::to_string(::getpid()));
  write_token_file(p.string(), a);
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(read_token_file(p.string()) == a);
  fs::remove(p);
  CHECK_THROWS_WITH(read_token_file(p.string()), Catch::Contains("monitor.token_file"));
  CHECK(token_equal("abc", "abc"));
  CHECK_FALSE(token_equal("abc", "abd"));
  CHECK_FALSE(token_equal("abc", "abcd"));
  CHECK_FALSE(token_equal("", "a"));
}

TEST_CASE("monitor event log: ids in order, replay after an id, bounded backlog", "[monitor]") {
  EventLog log(3);
  for (int i = 0; i < 5; ++i) log.append("step", {{"step", i}});
  CHECK(log.last_id() == 5);
  const auto all = log.since(0);
  REQUIRE(all.size() == 3);  // the backlog keeps the newest 3
  CHECK(all.front().id == 3);
  CHECK(all.back().data == "{\"step\":4}");
  CHECK(log.since(4).size() == 1);
  CHECK(log.since(5).empty());
}

TEST_CASE("monitor routes: tokens, paths, methods, control requests reaching the board", "[monitor]") {
  Fixture f;
  auto call = [&](const std::string& method, const std::string& target, const std::string& auth = "") {
    return route(f.routes, Request{method, target, auth, "127.0.0.1:1"});
  };
  CHECK(call("GET", "/status").status == 200);
  CHECK(call("GET", "/metrics").content_type == kMetricsContentType);
  CHECK(call("GET", "/history?since=3").body == "[]\n");
  CHECK(call("GET", "/history?since=x").status == 400);
  CHECK(call("GET", "/nope").status == 404);
  const Response wrong_method = call("PUT", "/status");
  CHECK(wrong_method.status == 405);
  CHECK(wrong_method.headers.at(0).first == "Allow");
  CHECK(call("GET", "/control/pause", "Bearer s3cret").status == 405);
  CHECK(call("POST", "/control/bogus", "Bearer s3cret").status == 404);
  CHECK(call("POST", "/control/pause").status == 401);
  CHECK(call("POST", "/control/pause", "Bearer wrong").status == 403);
  CHECK(call("POST", "/control/pause", "Token s3cret").status == 401);
  CHECK(call("POST", "/control/restart?actor=node", "Bearer s3cret").status == 400);
  CHECK(call("POST", "/control/fault?actor=compute", "Bearer s3cret").status == 403);  // not allowed
  CHECK(call("POST", "/control/pause?actor=compute", "Bearer s3cret").status == 400);
  CHECK(f.board.take_controls().empty());  // nothing changes on any error
  const Response ok = call("POST", "/control/restart?actor=compute", "Bearer s3cret");
  CHECK(ok.status == 202);
  CHECK_THAT(ok.body, Catch::Contains("\"id\":\"c-1\"") && Catch::Contains("\"status\":\"accepted\""));
  const auto posted = f.board.take_controls();
  REQUIRE(posted.size() == 1);
  CHECK(posted[0].action == "restart");
  CHECK(posted[0].actor == "compute");
  CHECK(posted[0].peer == "127.0.0.1:1");
  REQUIRE(f.events.since(0).size() == 1);
  CHECK(f.events.since(0)[0].type == "control");
  f.routes.allow_fault_injection = true;
  CHECK(call("POST", "/control/fault?actor=loader", "Bearer s3cret").status == 202);
}

TEST_CASE("monitor HTTP server: answers, and bounds bad clients in size, time and number", "[monitor]") {
  Fixture f;
  HttpServerOptions o;
  o.port = 0;
  o.request_timeout_s = 0.5;
  o.max_connections = 4;
  HttpServer server(f.routes, o);
  server.start();
  const int port = server.port();
  REQUIRE(port > 0);

  const std::string ok = round_trip(port, "GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  CHECK(status_of(ok) == 200);
  CHECK_THAT(ok, Catch::Contains("\"actors\""));
  CHECK(status_of(round_trip(port, "NOT HTTP AT ALL\r\n\r\n")) == 400);
  CHECK(status_of(round_trip(port, "GET /status HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n")) == 413);
  CHECK(status_of(round_trip(
            port, "POST /control/pause HTTP/1.1\r\nContent-Length: 20000\r\n\r\n" + std::string(20000, 'b'))) == 413);
  CHECK(status_of(round_trip(port, "POST /control/pause HTTP/1.1\r\nConnection: close\r\n\r\n")) == 401);

  // A client that never finishes its request: 408 after the request timeout.
  {
    const auto t0 = std::chrono::steady_clock::now();
    const int fd = connect_to(port);
    ::send(fd, "GET /sta", 8, MSG_NOSIGNAL);
    const std::string reply = read_all(fd);
    ::close(fd);
    CHECK(status_of(reply) == 408);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  }
  // More connections than allowed: the extra ones are answered 503; the server serves again later.
  {
    std::vector<int> idle;
    for (int i = 0; i < 4; ++i) idle.push_back(connect_to(port));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHECK(status_of(round_trip(port, "GET /status HTTP/1.1\r\n\r\n")) == 503);
    for (int fd : idle) ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(status_of(round_trip(port, "GET /status HTTP/1.1\r\nConnection: close\r\n\r\n")) == 200);
  }
  // An event stream replays the backlog after Last-Event-ID, then the server stops with it open.
  {
    f.events.append("step", {{"step", 1}});
    f.events.append("step", {{"step", 2}});
    const int fd = connect_to(port);
    const std::string req = "GET /events HTTP/1.1\r\nLast-Event-ID: 1\r\n\r\n";
    ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    std::string got;
    char buf[4096];
    while (got.find("\"step\":2") == std::string::npos) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    CHECK_THAT(got, Catch::Contains("text/event-stream") && Catch::Contains("id: 2\nevent: step\ndata: {\"step\":2}"));
    CHECK(got.find("\"step\":1") == std::string::npos);
    const auto t0 = std::chrono::steady_clock::now();
    server.stop();
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
    ::close(fd);
  }
}

TEST_CASE("monitor HTTP server: HEAD answers headers only and the connection stays usable", "[monitor]") {
  Fixture f;
  f.board.add_history({{"step", 1}, {"loss", 2.5}});
  HttpServerOptions o;
  o.port = 0;
  HttpServer server(f.routes, o);
  server.start();
  const int port = server.port();
  REQUIRE(port > 0);
  const std::string history_body = route(f.routes, Request{"GET", "/history", "", ""}).body;
  REQUIRE(history_body.size() > 10);

  // Two HEAD requests on one keep-alive connection, then a GET; the first HEAD answered before the
  // rest is sent (as `curl -sI` twice would), the other two pipelined.
  const int fd = connect_to(port);
  const std::string head1 = "HEAD /history HTTP/1.1\r\nHost: x\r\n\r\n";
  ::send(fd, head1.data(), head1.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  while (got.find("\r\n\r\n") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  const std::string rest =
      "HEAD /nope HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ::send(fd, rest.data(), rest.size(), MSG_NOSIGNAL);
  got += read_all(fd);
  ::close(fd);
  INFO(got);

  const ResponseHead a = response_head(got, 0);
  REQUIRE(a.end != std::string::npos);
  CHECK(a.status == 200);
  CHECK(a.content_length == static_cast<long long>(history_body.size()));  // GET's length, no body
  const ResponseHead b = response_head(got, a.end);  // the next response starts right after the head
  REQUIRE(b.end != std::string::npos);
  CHECK(b.status == 404);
  CHECK(b.content_length > 0);
  const ResponseHead c = response_head(got, b.end);
  REQUIRE(c.end != std::string::npos);
  CHECK(c.status == 404);
  CHECK(c.content_length == b.content_length);
  CHECK(got.substr(c.end) == route(f.routes, Request{"GET", "/nope", "", ""}).body);  // then the close

  // HEAD /events: the event stream's head alone, then the close it announces.
  const std::string events = round_trip(port, "HEAD /events HTTP/1.1\r\nHost: x\r\n\r\n");
  const ResponseHead e = response_head(events, 0);
  REQUIRE(e.end != std::string::npos);
  CHECK(e.status == 200);
  CHECK_THAT(events, Catch::Contains("Content-Type: text/event-stream\r\n"));
  CHECK(e.end == events.size());
}

TEST_CASE("monitor board: per-device prefetcher and compute probes (device.gpus)", "[monitor]") {
  StatusBoard board;
  board.set_devices(3);
  CHECK(&board.probe(ActorId::compute, 0) == &board.probe(ActorId::compute));
  CHECK(&board.probe(ActorId::loader, 2) == &board.probe(ActorId::loader));  // not a per-device role
  CHECK(&board.probe(ActorId::compute, 1) != &board.probe(ActorId::compute));
  CHECK(&board.probe(ActorId::compute, 1) != &board.probe(ActorId::prefetcher, 1));
  CHECK(&board.probe(ActorId::compute, 2) != &board.probe(ActorId::compute, 1));
  board.probe(ActorId::compute, 2).count_restart();
  std::vector<std::string> names;
  const nlohmann::json status = board.status_json();
  for (const auto& a : status["actors"]) {
    names.push_back(a["name"].get<std::string>());
    CHECK(a["restarts"].get<std::int64_t>() == (names.back() == "compute[2]" ? 1 : 0));
  }
  const std::vector<std::string> expected{"loader",     "prefetcher",    "compute",    "prefetcher[1]",
                                          "compute[1]", "prefetcher[2]", "compute[2]", "collector",
                                          "optimizer",  "checkpointer",  "node"};
  CHECK(names == expected);
  const std::string metrics = metrics_text(board);
  CHECK_THAT(metrics, Catch::Contains("megatrain_actor_restarts_total{actor=\"compute[2]\"} 1"));
  CHECK_THAT(metrics, Catch::Contains("actor=\"prefetcher[1]\""));
}

TEST_CASE("monitor board: /status carries the run's kernel choices", "[monitor]") {
  StatusBoard board;
  CHECK(board.status_json()["run"]["kernel_choices"] == nlohmann::json::object());  // none made
  RunInfo info;
  info.backend = "cpu";
  info.bf16 = true;
  info.kernel_choices = {{"bf16_gemm", {{"path", "onednn"}, {"source", "probe"}}}};
  board.set_run_info(info);
  const nlohmann::json run = board.status_json()["run"];
  CHECK(run["backend"] == "cpu");
  CHECK(run["kernel_choices"]["bf16_gemm"]["path"] == "onednn");
  CHECK(run["kernel_choices"]["bf16_gemm"]["source"] == "probe");
}

TEST_CASE("monitor board: /status ranks, the gathered entries with this rank's own live", "[monitor]") {
  StatusBoard board;
  CHECK(board.status_json()["ranks"] == nlohmann::json::array());  // alone: none
  board.set_ranks(nlohmann::json::array({{{"rank", 0}, {"step", 4}, {"last_collective", nullptr}},
                                         {{"rank", 1}, {"step", 4}, {"last_collective", {{"done", true}}}}}));
  board.set_rank_live(0, {{"channel", "grads"}, {"peer", 1}, {"done", false}, {"seconds", 7.5}});
  const nlohmann::json ranks = board.status_json()["ranks"];
  REQUIRE(ranks.size() == 2);
  CHECK(ranks[0]["live"] == true);
  CHECK(ranks[0]["last_collective"]["peer"] == 1);
  CHECK(ranks[0]["last_collective"]["done"] == false);
  CHECK(ranks[1].contains("live") == false);  // another rank's: as its last gather carried it
  CHECK(ranks[1]["last_collective"]["done"] == true);
  // The next gather replaces the entries; the live view stays this rank's.
  board.set_ranks(nlohmann::json::array({{{"rank", 0}, {"step", 5}}, {{"rank", 1}, {"step", 5}}}));
  CHECK(board.status_json()["ranks"][0]["step"] == 5);
  CHECK(board.status_json()["ranks"][0]["last_collective"]["seconds"] == 7.5);
}
