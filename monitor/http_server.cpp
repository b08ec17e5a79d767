#include "monitor/http_server.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace mt::monitor {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;
using tcp = boost::asio::ip::tcp;

namespace {

// The head of an /events reply (GET streams events after it; HEAD gets it alone).
constexpr const char* kEventStreamHead =
    "HTTP/1.1 200 OK\r\nServer: megatrain\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
    "Connection: close\r\n\r\n";

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

struct Shared {
  RouteContext& routes;
  HttpServerOptions opt;
  std::atomic<std::size_t> connections{0};
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Shared& shared)
      : stream_(std::move(socket)), shared_(shared), timer_(stream_.get_executor()), deadline_(stream_.get_executor()) {
    ++shared_.connections;
    beast::error_code ec;
    const auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) peer_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  }
  ~Session() { --shared_.connections; }

  void run(bool refuse) {
    if (refuse) {
      reply(error_response(503, "too many connections"), 11, false);
      return;
    }
    read();
  }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(shared_.opt.max_header_bytes));
    parser_->body_limit(shared_.opt.max_body_bytes);
    // The request's deadline: a timer of our own (the stream's own timeout would close the socket
    // before we could answer 408).
    stream_.expires_never();
    timed_out_ = false;
    deadline_.expires_after(ms(shared_.opt.request_timeout_s));
    deadline_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
    http::async_read(stream_, buffer_, *parser_, beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, std::size_t) {
    deadline_.cancel();
    if (ec == http::error::end_of_stream) return close();
    if (ec && timed_out_) {
      // Something arrived but not a whole request in time: tell the client; an idle keep-alive
      // connection is just closed.
      if (buffer_.size() > 0 || parser_->got_some()) return reply(error_response(408, "request timed out"), 11, false);
      return close();
    }
    if (ec == http::error::body_limit || ec == http::error::header_limit || ec == http::error::buffer_overflow)
      return reply(error_response(413, "request too large"), 11, false);
    if (ec) {
      if (ec.category() == http::make_error_code(http::error::bad_target).category())
        return reply(error_response(400, "malformed request: " + ec.message()), 11, false);
      return close();
    }
    const auto& req = parser_->get();
    Request r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    r.authorization = std::string(req[http::field::authorization]);
    r.peer = peer_;
    if (is_event_stream(r)) return start_events(req);
    if (r.method == "HEAD" && target_path(r.target) == "/events") return events_head();
    reply(route(shared_.routes, r), req.version(), req.keep_alive(), req.method() == http::verb::head);
  }

  // `head`: the answer to a HEAD request is GET's headers (Content-Length included) and no body
  // (RFC 9110 9.3.2); a body would be read as the next response on a keep-alive connection.
  void reply(const Response& resp, unsigned version, bool keep_alive, bool head = false) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(resp.status), version);
    res->set(http::field::server, "megatrain");
    res->set(http::field::content_type, resp.content_type);
    res->set(http::field::cache_control, "no-store");
    for (const auto& [name, value] : resp.headers) res->set(name, value);
    res->body() = resp.body;
    res->keep_alive(keep_alive);
    res->prepare_payload();
    if (head) res->body().clear();  // Content-Length stays GET's; the serializer writes the empty body
    stream_.expires_after(ms(shared_.opt.write_timeout_s));
    http::async_write(stream_, *res, [self = shared_from_this(), res, keep_alive](beast::error_code ec, std::size_t) {
      if (ec || !keep_alive) return self->close();
      self->read();
    });
  }

  // --- /events ---------------------------------------------------------------------------------
  void start_events(const http::request<http::string_body>& req) {
    EventLog& log = shared_.routes.events;
    last_id_ = log.last_id();  // a new client gets what happens from now on ...
    std::string resume(req["Last-Event-ID"]);
    if (resume.empty()) resume = query_param(std::string(req.target()), "last_event_id");
    if (!resume.empty()) {  // ... unless it names the last event it saw (then the backlog after it)
      char* end = nullptr;
      const unsigned long long v = std::strtoull(resume.c_str(), &end, 10);
      if (end != resume.c_str() && *end == 0) last_id_ = v;
    }
    std::string head = std::string(kEventStreamHead) + "retry: 2000\n\n";
    last_write_ = std::chrono::steady_clock::now();
    write_events(std::move(head));
  }

  // HEAD /events: GET's head, then the close it announces.
  void events_head() {
    out_ = kEventStreamHead;
    stream_.expires_after(ms(shared_.opt.write_timeout_s));
    net::async_write(stream_, net::buffer(out_),
                     [self = shared_from_this()](beast::error_code, std::size_t) { self->close(); });
  }

  void write_events(std::string text) {
    out_ = std::move(text);
    stream_.expires_after(ms(shared_.opt.write_timeout_s));
    net::async_write(stream_, net::buffer(out_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->close();
      self->stream_.expires_never();
      self->poll_events();
    });
  }

  void poll_events() {
    timer_.expires_after(ms(shared_.opt.events_poll_s));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;
      std::string text;
      for (const Event& e : self->shared_.routes.events.since(self->last_id_)) {
        text += "id: " + std::to_string(e.id) + "\nevent: " + e.type + "\ndata: " + e.data + "\n\n";
        self->last_id_ = e.id;
      }
      const auto now = std::chrono::steady_clock::now();
      if (text.empty() && now - self->last_write_ >= ms(self->shared_.opt.keepalive_s)) text = ": keepalive\n\n";
      if (text.empty()) return self->poll_events();
      self->last_write_ = now;
      self->write_events(std::move(text));
    });
  }

  void close() {
    beast::error_code ec;
    timer_.cancel();
    deadline_.cancel();
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  Shared& shared_;
  net::steady_timer timer_;     // /events: the next look for new events
  net::steady_timer deadline_;  // the request in progress must arrive by then
  bool timed_out_ = false;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string peer_;
  std::uint64_t last_id_ = 0;
  std::chrono::steady_clock::time_point last_write_;
  std::string out_;
};

}  // namespace

struct HttpServer::Impl {
  Shared shared;  // first: sessions destroyed with the io_context still use it
  net::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;
  int port = 0;
  bool running = false;

  Impl(RouteContext& routes, HttpServerOptions o) : shared{routes, std::move(o), {}} {}

  void accept() {
    acceptor.async_accept(net::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted) return;
      if (!ec) {
        const bool refuse = shared.connections.load() >= shared.opt.max_connections;
        std::make_shared<Session>(std::move(socket), shared)->run(refuse);
      }
      if (acceptor.is_open()) accept();
    });
  }
};

HttpServer::HttpServer(RouteContext& routes, HttpServerOptions options)
    : impl_(std::make_unique<Impl>(routes, std::move(options))) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  const auto& o = impl_->shared.opt;
  const std::string where = o.bind + ":" + std::to_string(o.port);
  try {
    const tcp::endpoint ep(net::ip::make_address(o.bind), static_cast<unsigned short>(o.port));
    impl_->acceptor.open(ep.protocol());
    impl_->acceptor.set_option(net::socket_base::reuse_address(true));
    impl_->acceptor.bind(ep);
    impl_->acceptor.listen(net::socket_base::max_listen_connections);
    impl_->port = impl_->acceptor.local_endpoint().port();
  } catch (const std::exception& e) {
    throw std::runtime_error("monitor: cannot listen on " + where + " (monitor.bind / monitor.port): " + e.what());
  }
  impl_->accept();
  impl_->running = true;
  impl_->thread = std::thread([this] {
    // Nice 10, like the checkpointer: scrapes take idle cycles rather than training's.
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
    impl_->io.run();
  });
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::stop() {
  if (!impl_ || !impl_->running) return;
  impl_->running = false;
  net::post(impl_->io, [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
  impl_->io.stop();
  impl_->thread.join();
}

}  // namespace mt::monitor
