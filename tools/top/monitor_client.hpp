// A client of the node's monitor endpoint (monitor): finding a node, plain requests, and the
// server-sent event stream. Boost.Beast stays inside monitor_client.cpp; every call has a time limit.
#pragma once
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace mt::monitor_client {

// A failure to reach or understand the endpoint (the message says which and why).
struct ClientError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Endpoint {
  std::string host;
  std::string port;
  std::string token;       // empty: none known (control requests are refused before they are sent)
  std::string token_file;  // where the token came from, for messages
  std::string url() const { return "http://" + host + ":" + port; }
};

// TARGET is a node's output_dir (its monitor.json says where the node listens and where its token is)
// or HOST:PORT (optionally http://HOST:PORT). token_file, when not empty, overrides monitor.json's.
// Throws ClientError naming the file or argument when it cannot.
Endpoint attach(const std::string& target, const std::string& token_file);

struct Reply {
  int status = 0;
  std::string content_type;
  std::string body;
};

// GET TARGET (e.g. "/status"); throws ClientError when the node cannot be reached within timeout_s.
Reply get(const Endpoint& endpoint, const std::string& target, double timeout_s = 5.0);
// POST TARGET with the bearer token (e.g. "/control/checkpoint"). Throws ClientError without a token.
Reply post(const Endpoint& endpoint, const std::string& target, double timeout_s = 10.0);
// The server's explanation in an error reply: its JSON "error" (or "message") field, else the body.
std::string error_message(const Reply& reply);

// One server-sent event.
struct Event {
  std::string id;    // "id:" (empty when the server sent none)
  std::string type;  // "event:" ("message" when the server sent none)
  std::string data;  // the "data:" lines joined by '\n'
};

// GET /events, kept open. Events are parsed as they arrive; comments (": keepalive") are skipped.
class EventStream {
 public:
  // Connects and reads the reply's header (throws ClientError on failure or a status other than 200).
  // last_event_id: resume after that event (the server replays its backlog from there).
  explicit EventStream(const Endpoint& endpoint, const std::string& last_event_id = "", double timeout_s = 5.0);
  ~EventStream();
  EventStream(const EventStream&) = delete;
  EventStream& operator=(const EventStream&) = delete;
  // The next event, waiting at most timeout_s (std::nullopt when none came). Throws ClientError once
  // the stream has ended (the node closed it or went away).
  std::optional<Event> next(double timeout_s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt::monitor_client
