// megatrain-ctl: control a running node from scripts.
//   megatrain-ctl OUTPUT_DIR|HOST:PORT checkpoint|pause|resume|stop|restart ACTOR|status
//                 [--wait] [--timeout=S] [--token-file=FILE]
// A control command prints the control id the node assigned (first line, alone: id=$(megatrain-ctl ...)).
// With --wait it follows /events until the action took effect (checkpoint: until it is durable; stop:
// until the node has stopped), printing each progress line, and exits non-zero with the node's message
// if the action failed or the time ran out. `status` prints /status as JSON; with --wait it first waits
// (up to --timeout) for the node to answer, for scripts that start a node and then talk to it.
// Exit codes: 0 done, 1 refused / failed / timed out / unreachable, 2 bad usage.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tools/top/monitor_client.hpp"

using namespace mt::monitor_client;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string target, action, actor, token_file;
  bool wait = false;
  double timeout_s = 600;
};

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: megatrain-ctl OUTPUT_DIR|HOST:PORT COMMAND [--wait] [--timeout=S] [--token-file=FILE]\n"
               "commands: checkpoint | pause | resume | stop | restart ACTOR | status\n"
               "  ACTOR         loader, prefetcher, compute, collector, optimizer, checkpointer\n"
               "  --wait        follow the node's events until the action took effect (checkpoint: durable;\n"
               "                stop: the node stopped); status --wait: wait until the node answers\n"
               "  --timeout=S   give up waiting after S seconds (default 600): exit code 1\n"
               "  --token-file  the bearer token (default: the one monitor.json names)\n");
}

bool parse(int argc, char** argv, Options& o) {
  std::string positional[3];
  int n = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--wait") {
      o.wait = true;
    } else if (a.rfind("--timeout=", 0) == 0) {
      o.timeout_s = std::atof(a.c_str() + 10);
      if (o.timeout_s <= 0) return false;
    } else if (a.rfind("--token-file=", 0) == 0) {
      o.token_file = a.substr(13);
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      std::exit(0);
    } else if (a.rfind("--", 0) == 0 || n == 3) {
      std::fprintf(stderr, "megatrain-ctl: unexpected argument '%s'\n", a.c_str());
      return false;
    } else {
      positional[n++] = a;
    }
  }
  o.target = positional[0];
  o.action = positional[1];
  o.actor = positional[2];
  const bool known = o.action == "checkpoint" || o.action == "pause" || o.action == "resume" || o.action == "stop" ||
                     o.action == "status" || o.action == "restart";
  if (n < 2 || !known) {
    if (n >= 2) std::fprintf(stderr, "megatrain-ctl: unknown command '%s'\n", o.action.c_str());
    return false;
  }
  if ((o.action == "restart") != (n == 3)) {
    std::fprintf(stderr, "megatrain-ctl: %s\n",
                 o.action == "restart" ? "restart needs an actor name" : "too many arguments");
    return false;
  }
  return true;
}

double left(Clock::time_point deadline) { return std::chrono::duration<double>(deadline - Clock::now()).count(); }

int status(const Options& o) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout_s));
  for (;;) {
    try {
      const Endpoint e = attach(o.target, o.token_file);
      const Reply r = get(e, "/status");
      if (r.status != 200) {
        std::fprintf(stderr, "megatrain-ctl: status: HTTP %d: %s\n", r.status, error_message(r).c_str());
        return 1;
      }
      const auto j = nlohmann::json::parse(r.body, nullptr, false);
      std::printf("%s\n", j.is_discarded() ? r.body.c_str() : j.dump(2).c_str());
      return 0;
    } catch (const ClientError& ex) {
      if (!o.wait || left(deadline) <= 0) {
        std::fprintf(stderr, "megatrain-ctl: %s\n", ex.what());
        return 1;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// The status that ends the wait: a checkpoint is done when durable, everything else when it took effect.
bool finished(const std::string& action, const std::string& st) {
  return action == "checkpoint" ? st == "durable" : st == "took_effect" || st == "durable";
}

int control(const Options& o) {
  const Endpoint e = attach(o.target, o.token_file);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout_s));
  // Subscribe before sending, so the action's events cannot pass before we listen.
  std::unique_ptr<EventStream> events;
  if (o.wait) events = std::make_unique<EventStream>(e);
  const Reply r = post(e, "/control/" + o.action + (o.actor.empty() ? "" : "?actor=" + o.actor));
  const auto reply = nlohmann::json::parse(r.body, nullptr, false);
  if (r.status != 202 || !reply.is_object() || !reply.contains("id")) {
    std::fprintf(stderr, "megatrain-ctl: %s refused: HTTP %d: %s\n", o.action.c_str(), r.status,
                 error_message(r).c_str());
    return 1;
  }
  const std::string id = reply["id"].get<std::string>();
  std::printf("%s\n", id.c_str());
  std::fflush(stdout);
  if (!o.wait) return 0;

  std::string last = "accepted";
  bool stop_took_effect = false;
  while (left(deadline) > 0) {
    std::optional<Event> ev;
    try {
      ev = events->next(std::min(1.0, left(deadline)));
    } catch (const ClientError& ex) {
      if (stop_took_effect) return 0;  // the node stopped and closed the stream: that is what stop means
      std::fprintf(stderr, "megatrain-ctl: %s %s: %s (last status: %s)\n", id.c_str(), o.action.c_str(), ex.what(),
                   last.c_str());
      return 1;
    }
    if (!ev) continue;
    if (o.action == "stop" && ev->type == "stopped") return 0;  // the node has stopped
    if (ev->type != "control") continue;
    const auto d = nlohmann::json::parse(ev->data, nullptr, false);
    if (!d.is_object() || d.value("id", std::string()) != id) continue;
    last = d.value("status", std::string("?"));
    std::string line = id + " " + last;
    if (d.contains("step")) line += " at step " + d["step"].dump();
    if (d.contains("path")) line += ": " + d["path"].get<std::string>();
    if (d.contains("bytes")) line += " (" + d["bytes"].dump() + " bytes";
    if (d.contains("seconds")) line += (d.contains("bytes") ? ", " : " (") + d["seconds"].dump() + " s";
    if (d.contains("bytes") || d.contains("seconds")) line += ")";
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (last == "failed") {
      std::fprintf(stderr, "megatrain-ctl: %s %s failed: %s\n", id.c_str(), o.action.c_str(),
                   d.value("error", d.value("message", std::string("(no message)"))).c_str());
      return 1;
    }
    if (finished(o.action, last)) {
      if (o.action != "stop") return 0;
      stop_took_effect = true;  // now wait for the node to stop (the stream ends or says so)
    }
  }
  std::fprintf(stderr, "megatrain-ctl: %s %s: no confirmation within %.0f s (last status: %s)\n", id.c_str(),
               o.action.c_str(), o.timeout_s, last.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    usage(stderr);
    return 2;
  }
  try {
    return o.action == "status" ? status(o) : control(o);
  } catch (const ClientError& ex) {
    std::fprintf(stderr, "megatrain-ctl: %s\n", ex.what());
    return 1;
  } catch (const nlohmann::json::exception& ex) {
    std::fprintf(stderr, "megatrain-ctl: the node's reply has an unexpected shape: %s\n", ex.what());
    return 1;
  }
}
