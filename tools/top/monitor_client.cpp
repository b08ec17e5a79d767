// The monitor client over Boost.Beast. Every operation is asynchronous on a private io_context and run
// to completion or to its time limit, so a node that stops answering never hangs a tool.
#include "tools/top/monitor_client.hpp"

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace mt::monitor_client {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
namespace fs = std::filesystem;

namespace {

constexpr const char* kUserAgent = "megatrain-monitor-client";

std::string read_token(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ClientError("cannot read the token file " + path + ": " + std::strerror(errno));
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t')) token.pop_back();
  if (token.empty()) throw ClientError("the token file " + path + " is empty");
  return token;
}

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

// Starts one asynchronous operation (start receives its completion handler), runs the io_context
// until it completes and returns its error code. Time limits come from the tcp_stream's expiry.
template <class Start>
beast::error_code run_one(asio::io_context& ioc, Start&& start) {
  beast::error_code result = asio::error::would_block;
  start([&result](beast::error_code ec, auto&&...) { result = ec; });
  ioc.restart();
  ioc.run();
  return result;
}

// Resolves and connects within timeout_s; throws ClientError naming the URL.
void connect(asio::io_context& ioc, beast::tcp_stream& stream, const Endpoint& e, double timeout_s) {
  tcp::resolver resolver(ioc);
  beast::error_code ec;
  const auto results = resolver.resolve(e.host, e.port, ec);
  if (ec) throw ClientError("cannot resolve " + e.host + ": " + ec.message());
  stream.expires_after(seconds(timeout_s));
  ec = run_one(ioc, [&](auto handler) { stream.async_connect(results, handler); });
  if (ec) throw ClientError("cannot connect to " + e.url() + ": " + ec.message());
}

http::request<http::empty_body> make_request(http::verb verb, const Endpoint& e, const std::string& target,
                                             bool with_token) {
  http::request<http::empty_body> req{verb, target, 11};
  req.set(http::field::host, e.host + ":" + e.port);
  req.set(http::field::user_agent, kUserAgent);
  if (with_token) req.set(http::field::authorization, "Bearer " + e.token);
  req.prepare_payload();
  return req;
}

Reply exchange(const Endpoint& e, http::verb verb, const std::string& target, double timeout_s, bool with_token) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  connect(ioc, stream, e, timeout_s);
  auto req = make_request(verb, e, target, with_token);
  req.set(http::field::connection, "close");
  stream.expires_after(seconds(timeout_s));
  beast::error_code ec = run_one(ioc, [&](auto handler) { http::async_write(stream, req, handler); });
  if (ec)
    throw ClientError("cannot send " + std::string(req.method_string()) + " " + target + " to " + e.url() + ": " +
                      ec.message());
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(256u << 20);  // /history of a long run is large; a bound keeps a broken server finite
  ec = run_one(ioc, [&](auto handler) { http::async_read(stream, buffer, parser, handler); });
  if (ec) throw ClientError("no reply to " + target + " from " + e.url() + ": " + ec.message());
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  const auto& res = parser.get();
  return Reply{static_cast<int>(res.result_int()), std::string(res[http::field::content_type]), res.body()};
}

}  // namespace

Endpoint attach(const std::string& target, const std::string& token_file) {
  Endpoint e;
  std::error_code fec;
  if (fs::is_directory(target, fec)) {
    const fs::path info_path = fs::path(target) / "monitor.json";
    std::ifstream in(info_path);
    if (!in)
      throw ClientError("no " + info_path.string() +
                        ": is a node running with this output_dir and monitor.enabled=true?");
    nlohmann::json info;
    try {
      in >> info;
      e.host = info.at("host").get<std::string>();
      e.port = std::to_string(info.at("port").get<long long>());
      e.token_file = info.value("token_file", std::string());
      const long long pid = info.value("pid", 0LL);
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
        throw ClientError(info_path.string() + " names pid " + std::to_string(pid) +
                          ", which is not running (left behind by a node that crashed?)");
    } catch (const nlohmann::json::exception& ex) {
      throw ClientError("cannot read " + info_path.string() + ": " + ex.what());
    }
  } else {
    std::string hp = target;
    if (hp.rfind("http://", 0) == 0) hp = hp.substr(7);
    while (!hp.empty() && hp.back() == '/') hp.pop_back();
    const auto colon = hp.rfind(':');
    const std::string port = colon == std::string::npos ? "" : hp.substr(colon + 1);
    if (colon == 0 || port.empty() || port.find_first_not_of("0123456789") != std::string::npos) {
      if (target.find('/') != std::string::npos)
        throw ClientError("no directory " + target + " (expected a node's output_dir or HOST:PORT)");
      throw ClientError("'" + target + "' is neither an output_dir with a monitor.json nor HOST:PORT");
    }
    e.host = hp.substr(0, colon);
    if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']')
      e.host = e.host.substr(1, e.host.size() - 2);
    e.port = port;
  }
  if (!token_file.empty()) e.token_file = token_file;
  if (!e.token_file.empty()) e.token = read_token(e.token_file);
  return e;
}

Reply get(const Endpoint& endpoint, const std::string& target, double timeout_s) {
  return exchange(endpoint, http::verb::get, target, timeout_s, false);
}

Reply post(const Endpoint& endpoint, const std::string& target, double timeout_s) {
  if (endpoint.token.empty())
    throw ClientError("no token for " + endpoint.url() + ": attach by output_dir or pass --token-file=FILE");
  return exchange(endpoint, http::verb::post, target, timeout_s, true);
}

std::string error_message(const Reply& reply) {
  const auto j = nlohmann::json::parse(reply.body, nullptr, false);
  if (j.is_object()) {
    for (const char* key : {"error", "message"})
      if (j.contains(key) && j[key].is_string()) return j[key].get<std::string>();
  }
  std::string body = reply.body;
  while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
  return body.empty() ? "(no message)" : body;
}

struct EventStream::Impl {
  asio::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  char chunk[8192];
  std::string text;        // received, not yet parsed into events (newlines normalised to '\n')
  bool reading = false;    // an async_read_some is in flight
  bool ended = false;      // the stream closed
  std::string end_reason;  // why, for the exception
  bool last_was_cr = false;

  void append(const char* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const char c = p[i];
      if (c == '\r') {
        text += '\n';
        last_was_cr = true;
        continue;
      }
      if (c == '\n' && last_was_cr) {  // the '\n' of "\r\n" was already added
        last_was_cr = false;
        continue;
      }
      last_was_cr = false;
      text += c;
    }
  }

  // Takes one complete event (a block ended by a blank line) out of text, if there is one.
  std::optional<Event> pop_event() {
    for (;;) {
      const auto end = text.find("\n\n");
      if (end == std::string::npos) return std::nullopt;
      const std::string block = text.substr(0, end + 1);
      text.erase(0, end + 2);
      Event ev;
      bool any = false, has_data = false;
      std::istringstream lines(block);
      std::string line;
      while (std::getline(lines, line)) {
        if (line.empty() || line[0] == ':') continue;  // comments: keepalives
        const auto colon = line.find(':');
        const std::string field = line.substr(0, colon);
        std::string value = colon == std::string::npos ? "" : line.substr(colon + 1);
        if (!value.empty() && value[0] == ' ') value.erase(0, 1);
        if (field == "id") {
          ev.id = value;
          any = true;
        } else if (field == "event") {
          ev.type = value;
          any = true;
        } else if (field == "data") {
          ev.data += (has_data ? "\n" : "") + value;
          has_data = any = true;
        }
      }
      if (!any) continue;
      if (ev.type.empty()) ev.type = "message";
      return ev;
    }
  }
};

EventStream::EventStream(const Endpoint& endpoint, const std::string& last_event_id, double timeout_s)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  connect(s.ioc, s.stream, endpoint, timeout_s);
  auto req = make_request(http::verb::get, endpoint, "/events", false);
  req.set(http::field::accept, "text/event-stream");
  req.set(http::field::cache_control, "no-cache");
  if (!last_event_id.empty()) req.set("Last-Event-ID", last_event_id);
  s.stream.expires_after(seconds(timeout_s));
  beast::error_code ec = run_one(s.ioc, [&](auto handler) { http::async_write(s.stream, req, handler); });
  if (ec) throw ClientError("cannot send GET /events to " + endpoint.url() + ": " + ec.message());
  s.parser.body_limit(boost::none);  // an event stream has no end
  ec = run_one(s.ioc, [&](auto handler) { http::async_read_header(s.stream, s.buffer, s.parser, handler); });
  if (ec) throw ClientError("no reply to GET /events from " + endpoint.url() + ": " + ec.message());
  s.stream.expires_never();  // next() bounds each wait itself
  const int status = static_cast<int>(s.parser.get().result_int());
  if (status != 200) throw ClientError("GET /events at " + endpoint.url() + ": HTTP " + std::to_string(status));
}

EventStream::~EventStream() {
  beast::error_code ignored;
  impl_->stream.socket().close(ignored);
  impl_->ioc.restart();
  impl_->ioc.poll();  // let a pending read finish (cancelled) while its buffers still exist
}

std::optional<Event> EventStream::next(double timeout_s) {
  Impl& s = *impl_;
  const auto deadline = std::chrono::steady_clock::now() + seconds(timeout_s);
  for (;;) {
    if (auto ev = s.pop_event()) return ev;
    if (s.ended) throw ClientError("the event stream ended: " + s.end_reason);
    if (!s.reading) {
      s.reading = true;
      s.parser.get().body().data = s.chunk;
      s.parser.get().body().size = sizeof s.chunk;
      http::async_read_some(s.stream, s.buffer, s.parser, [&s](beast::error_code ec, std::size_t) {
        s.reading = false;
        s.append(s.chunk, sizeof s.chunk - s.parser.get().body().size);
        if (ec == http::error::need_buffer) ec = {};  // the chunk buffer is full: read on
        if (ec) {
          s.ended = true;
          s.end_reason = ec == http::error::end_of_stream ? "the node closed it" : ec.message();
        } else if (s.parser.is_done()) {
          s.ended = true;
          s.end_reason = "the node closed it";
        }
      });
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return std::nullopt;
    s.ioc.restart();
    s.ioc.run_for(deadline - now);
    if (s.reading && std::chrono::steady_clock::now() >= deadline) {
      if (auto ev = s.pop_event()) return ev;
      return std::nullopt;  // the read stays in flight; the next call waits on it
    }
  }
}

}  // namespace mt::monitor_client
