// megatrain-top: a terminal view of a running node, attached through its monitor endpoint.
//   megatrain-top OUTPUT_DIR|HOST:PORT [--token-file=FILE] [--once] [--interval=S] [--stuck-after=S]
// The view refreshes every second from /status, sparklines from /history then `step` events, the last
// events from /events. Keys: c checkpoint, p pause, r resume, s stop, R restart an actor (asks its
// name), q quit. --once prints one plain snapshot (every actor a line) and exits: for scripts.
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "tools/top/monitor_client.hpp"
#include "tools/top/snapshot.hpp"

using namespace mt::monitor_client;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kEventLines = 8;

struct Options {
  std::string target, token_file;
  bool once = false;
  double interval_s = 1.0;
  double stuck_after_s = 30.0;
};

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: megatrain-top OUTPUT_DIR|HOST:PORT [--token-file=FILE] [--once] [--interval=S] "
               "[--stuck-after=S]\n"
               "  OUTPUT_DIR     a running node's train.output_dir (its monitor.json says where it listens)\n"
               "  HOST:PORT      the monitor endpoint; control keys then need --token-file\n"
               "  --once         print one plain snapshot and exit (every actor a line)\n"
               "  --interval=S   refresh period of the live view (default 1)\n"
               "  --stuck-after=S  flag an actor in one handler this long (default 30)\n"
               "keys: c checkpoint, p pause, r resume, s stop, R restart an actor, q quit\n");
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string p = std::string(name) + "=";
      return a.rfind(p, 0) == 0 ? argv[i] + p.size() : nullptr;
    };
    if (a == "--once") {
      o.once = true;
    } else if (const char* file = value("--token-file")) {
      o.token_file = file;
    } else if (const char* interval = value("--interval")) {
      o.interval_s = std::atof(interval);
      if (o.interval_s <= 0) return false;
    } else if (const char* stuck = value("--stuck-after")) {
      o.stuck_after_s = std::atof(stuck);
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      std::exit(0);
    } else if (a.rfind("--", 0) == 0 || !o.target.empty()) {
      std::fprintf(stderr, "megatrain-top: unknown argument '%s'\n", a.c_str());
      return false;
    } else {
      o.target = a;
    }
  }
  return !o.target.empty();
}

nlohmann::json get_json(const Endpoint& e, const std::string& path) {
  const Reply r = get(e, path);
  if (r.status != 200)
    throw ClientError("GET " + path + ": HTTP " + std::to_string(r.status) + ": " + error_message(r));
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded()) throw ClientError("GET " + path + ": the reply is not JSON");
  return j;
}

int once(const Endpoint& e, const Options& o) {
  SnapshotInput in;
  in.status = get_json(e, "/status");
  StepSeries series;
  const long long step = in.status.value("step", 0LL);
  for (const auto& rec : get_json(e, "/history?since=" + std::to_string(std::max(0LL, step - 60)))) series.add(rec);
  in.series = &series;
  in.url = e.url();
  in.stuck_after_s = o.stuck_after_s;
  for (const auto& line : render_snapshot(in)) std::printf("%s\n", line.c_str());
  return 0;
}

// ---- the live view ----------------------------------------------------------------------------

std::atomic<bool> g_quit{false};
extern "C" void on_signal(int) { g_quit.store(true); }

struct Terminal {
  termios saved{};
  bool raw = false;
  void enter() {
    if (tcgetattr(STDIN_FILENO, &saved) == 0) {
      termios t = saved;
      t.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
      t.c_cc[VMIN] = 0;
      t.c_cc[VTIME] = 0;
      raw = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
    }
    std::fputs("\x1b[?1049h\x1b[?25l", stdout);  // alternate screen, cursor hidden
    std::fflush(stdout);
  }
  void leave() {
    std::fputs("\x1b[?25h\x1b[?1049l", stdout);
    std::fflush(stdout);
    if (raw) tcsetattr(STDIN_FILENO, TCSANOW, &saved);
  }
  static int width() {
    winsize ws{};
    return ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 100;
  }
};

// Shared between the event thread and the view.
struct Shared {
  std::mutex mu;
  StepSeries series;
  std::deque<std::string> events;
  std::string stream_state = "connecting";
};

// Follows /events (reconnecting with Last-Event-ID), feeding step records and the event list.
void follow_events(const Endpoint& e, Shared& shared) {
  std::string last_id;
  while (!g_quit) {
    try {
      EventStream stream(e, last_id);
      {
        std::lock_guard<std::mutex> lock(shared.mu);
        shared.stream_state = "live";
      }
      while (!g_quit) {
        auto ev = stream.next(0.25);
        if (!ev) continue;
        if (!ev->id.empty()) last_id = ev->id;
        std::lock_guard<std::mutex> lock(shared.mu);
        if (ev->type == "step") {
          shared.series.add(nlohmann::json::parse(ev->data, nullptr, false));
          continue;
        }
        shared.events.push_back(format_event(ev->type, ev->data));
        while (shared.events.size() > kEventLines) shared.events.pop_front();
      }
    } catch (const std::exception& ex) {
      std::lock_guard<std::mutex> lock(shared.mu);
      shared.stream_state = std::string("reconnecting (") + ex.what() + ")";
    }
    for (int i = 0; i < 10 && !g_quit; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Reads a line (the actor name for R) in raw mode: Enter accepts, Escape cancels.
std::string prompt_line(const std::string& question) {
  std::string text;
  for (;;) {
    std::printf("\r\x1b[2K%s%s", question.c_str(), text.c_str());
    std::fflush(stdout);
    pollfd p{STDIN_FILENO, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) {
      if (g_quit) return "";
      continue;
    }
    char c = 0;
    if (read(STDIN_FILENO, &c, 1) != 1) return "";
    if (c == '\n' || c == '\r') return text;
    if (c == 27) return "";
    if ((c == 127 || c == 8) && !text.empty()) text.pop_back();
    if (c >= 32 && c < 127) text += c;
  }
}

std::string send_control(const Endpoint& e, const std::string& action, const std::string& actor) {
  try {
    const Reply r = post(e, "/control/" + action + (actor.empty() ? "" : "?actor=" + actor));
    if (r.status == 202) {
      const auto j = nlohmann::json::parse(r.body, nullptr, false);
      return action + (actor.empty() ? "" : " " + actor) + ": " +
             (j.is_object() ? j.value("id", std::string("?")) : "?") + " accepted";
    }
    return action + " refused: HTTP " + std::to_string(r.status) + ": " + error_message(r);
  } catch (const std::exception& ex) {
    return action + " failed: " + ex.what();
  }
}

int live(const Endpoint& e, const Options& o) {
  Shared shared;
  for (const auto& rec : get_json(e, "/history?since=0")) shared.series.add(rec);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::thread events(follow_events, std::cref(e), std::ref(shared));
  Terminal term;
  term.enter();
  std::optional<nlohmann::json> before;
  Clock::time_point before_at;
  std::string message = "keys: c checkpoint  p pause  r resume  s stop  R restart actor  q quit";
  auto next_refresh = Clock::now();
  while (!g_quit) {
    if (Clock::now() >= next_refresh) {
      SnapshotInput in;
      in.url = e.url();
      in.stuck_after_s = o.stuck_after_s;
      in.width = Terminal::width();
      in.colour = true;
      std::vector<std::string> lines;
      std::string stream_state;
      try {
        in.status = get_json(e, "/status");
        const auto now = Clock::now();
        if (before) {
          in.before = before;
          in.interval_s = std::chrono::duration<double>(now - before_at).count();
        }
        std::lock_guard<std::mutex> lock(shared.mu);
        in.series = &shared.series;
        in.events = shared.events;
        lines = render_snapshot(in);
        stream_state = shared.stream_state;
        before = in.status;
        before_at = now;
      } catch (const std::exception& ex) {  // unreachable node, or a reply of an unexpected shape: show, go on
        lines = {"megatrain " + e.url(), std::string("\x1b[31mcannot read /status: ") + ex.what() + "\x1b[0m"};
      }
      std::fputs("\x1b[H\x1b[2J", stdout);
      for (const auto& l : lines) std::printf("%s\n", l.c_str());
      std::printf("\nevents: %s\n%s\n", stream_state.c_str(), message.c_str());
      std::fflush(stdout);
      next_refresh =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.interval_s));
    }
    pollfd p{STDIN_FILENO, POLLIN, 0};
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_refresh - Clock::now()).count();
    if (poll(&p, 1, static_cast<int>(std::max<long long>(0, wait))) <= 0) continue;
    char c = 0;
    if (read(STDIN_FILENO, &c, 1) != 1) continue;
    switch (c) {
      case 'q':
        g_quit = true;
        break;
      case 'c':
        message = send_control(e, "checkpoint", "");
        break;
      case 'p':
        message = send_control(e, "pause", "");
        break;
      case 'r':
        message = send_control(e, "resume", "");
        break;
      case 's':
        message = send_control(e, "stop", "");
        break;
      case 'R': {
        const std::string actor = prompt_line("restart which actor (Enter to send, Esc to cancel)? ");
        message = actor.empty() ? "restart cancelled" : send_control(e, "restart", actor);
        break;
      }
      default:
        continue;
    }
    next_refresh = Clock::now();
  }
  term.leave();
  events.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    usage(stderr);
    return 2;
  }
  try {
    const Endpoint e = attach(o.target, o.token_file);
    if (o.once || !isatty(STDOUT_FILENO)) return once(e, o);
    return live(e, o);
  } catch (const ClientError& ex) {
    std::fprintf(stderr, "megatrain-top: %s\n", ex.what());
    return 1;
  } catch (const nlohmann::json::exception& ex) {
    std::fprintf(stderr, "megatrain-top: the node's reply has an unexpected shape: %s\n", ex.what());
    return 1;
  }
}
