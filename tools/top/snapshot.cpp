// Text rendering of a /status reply (see snapshot.hpp). Missing or null fields print as "-": a node
// that is starting has no loss yet, and a newer node may add fields this tool does not know.
#include "tools/top/snapshot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace mt::monitor_client {

namespace {

double num(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return std::nan("");
  return j[key].get<double>();
}

std::string str(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return "";
  if (j[key].is_string()) return j[key].get<std::string>();
  if (j[key].is_null()) return "";
  return j[key].dump();
}

std::string fmt(const char* f, double v) {
  if (!std::isfinite(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string bytes(double b) {
  if (!std::isfinite(b)) return "-";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (std::fabs(b) >= 1024 && i < 4) {
    b /= 1024;
    ++i;
  }
  return fmt(i ? "%.1f " : "%.0f ", b) + units[i];
}

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "-";
  const long long t = std::llround(s);
  char b[64];
  if (t >= 3600)
    std::snprintf(b, sizeof b, "%lldh%02lldm", t / 3600, t / 60 % 60);
  else if (t >= 60)
    std::snprintf(b, sizeof b, "%lldm%02llds", t / 60, t % 60);
  else
    std::snprintf(b, sizeof b, "%llds", t);
  return b;
}

std::string pad(std::string s, std::size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

// " (products onednn, attention pairs)": the bf16 kernel choices the run measured or took (/status
// run.kernel_choices), "" if none.
std::string kernel_choices(const nlohmann::json& run) {
  const auto k = run.value("kernel_choices", nlohmann::json::object());
  if (!k.is_object()) return "";
  std::string words;
  for (const auto& [key, name] :
       {std::pair<const char*, const char*>{"bf16_gemm", "products"}, {"bf16_attention", "attention"}}) {
    if (!k.contains(key) || !k[key].is_object()) continue;
    const std::string path = str(k[key], "path");
    if (!path.empty()) words += (words.empty() ? "" : ", ") + std::string(name) + " " + path;
  }
  return words.empty() ? "" : " (" + words + ")";
}

std::string colour(bool on, const char* code, const std::string& s) {
  return on ? std::string("\x1b[") + code + "m" + s + "\x1b[0m" : s;
}

}  // namespace

bool StepSeries::add(const nlohmann::json& record) {
  if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer()) return false;
  const auto step = record["step"].get<std::int64_t>();
  if (step <= last_step) return false;
  last_step = step;
  loss.push_back(num(record, "loss"));
  tokens_per_s.push_back(num(record, "tokens_per_s"));
  constexpr std::size_t keep = 4096;
  for (auto* v : {&loss, &tokens_per_s})
    if (v->size() > keep) v->erase(v->begin(), v->begin() + static_cast<std::ptrdiff_t>(v->size() - keep / 2));
  return true;
}

std::string sparkline(const std::vector<double>& values, int width) {
  static const char* blocks[] = {"\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588"};
  const std::size_t n = std::min<std::size_t>(values.size(), static_cast<std::size_t>(std::max(width, 1)));
  const auto first = values.end() - static_cast<std::ptrdiff_t>(n);
  double lo = INFINITY, hi = -INFINITY;
  for (auto it = first; it != values.end(); ++it)
    if (std::isfinite(*it)) lo = std::min(lo, *it), hi = std::max(hi, *it);
  std::string out;
  for (auto it = first; it != values.end(); ++it) {
    if (!std::isfinite(*it)) {
      out += ' ';
      continue;
    }
    const double f = hi > lo ? (*it - lo) / (hi - lo) : 0.5;
    out += blocks[std::clamp(static_cast<int>(f * 7.999), 0, 7)];
  }
  return out;
}

std::string format_event(const std::string& type, const std::string& data) {
  const auto d = nlohmann::json::parse(data, nullptr, false);
  std::string s = pad(type, 17);
  if (!d.is_object()) return s + data;
  const std::string step = d.contains("step") ? " step " + str(d, "step") : "";
  if (type == "checkpoint_saved")
    return s + step + " -> " + str(d, "path") + " (" + bytes(num(d, "bytes")) + " in " +
           fmt("%.2f", num(d, "seconds")) + " s)";
  if (type == "checkpoint_failed") return s + step + ": " + str(d, "error");
  if (type == "actor_failed")
    return s + str(d, "actor") + ": " + (d.contains("error") ? str(d, "error") : str(d, "reason"));
  if (type == "actor_restarted")
    return s + str(d, "actor") + (d.contains("restarts") ? " (restart " + str(d, "restarts") + ")" : "");
  if (type == "control") {
    s += str(d, "id") + " " + str(d, "action") + (d.contains("actor") ? " " + str(d, "actor") : "") + ": " +
         str(d, "status") + step;
    if (d.contains("path")) s += " -> " + str(d, "path");
    if (d.contains("error")) s += " (" + str(d, "error") + ")";
    return s;
  }
  if (type == "watchdog") {
    s += str(d, "level") + " " + str(d, "actor");
    if (d.contains("handler")) s += " in " + str(d, "handler");
    if (d.contains("seconds")) s += " for " + fmt("%.0f", num(d, "seconds")) + " s";
    if (d.contains("message")) s += " " + str(d, "message");
    return s;
  }
  return s + step;
}

namespace {

// A job of several ranks: each rank's step, busiest actor over its last step and the last transfer it
// waited for; a rank behind the others, or a wait of stuck_after_s or more, is named.
void render_ranks(const SnapshotInput& in, std::vector<std::string>& out) {
  const nlohmann::json ranks = in.status.value("ranks", nlohmann::json::array());
  if (!ranks.is_array() || ranks.size() < 2) return;
  double newest = -1;
  for (const auto& r : ranks) newest = std::max(newest, num(r, "step"));
  out.emplace_back();
  out.push_back("rank  step    slowest actor (busy)    last collective");
  std::vector<std::string> named;
  for (const auto& r : ranks) {
    const std::string rank = str(r, "rank");
    const nlohmann::json t = r.value("last_collective", nlohmann::json());
    std::string last = "none yet";
    bool waiting_long = false;
    if (t.is_object()) {
      const bool done = t.value("done", true);
      const double secs = num(t, "seconds");
      const std::string dir = t.value("sending", false) ? "to" : "from";
      last = (done ? "took " : "WAITING ") + fmt(done ? "%.3f" : "%.1f", secs) + " s " + dir + " rank " +
             str(t, "peer") + " (" + str(t, "channel") + "): " + str(t, "what");
      waiting_long = !done && secs >= in.stuck_after_s;
      if (waiting_long)
        named.push_back("rank " + rank + " waits " + fmt("%.0f", secs) + " s for rank " + str(t, "peer") + ": " +
                        str(t, "what"));
    }
    const bool behind = num(r, "step") < newest;
    if (behind) named.push_back("rank " + rank + " is behind: step " + str(r, "step") + " of " + fmt("%.0f", newest));
    char line[96];
    std::snprintf(line, sizeof line, "%-5s %-7s %-23s ", (rank + (r.value("live", false) ? "*" : "")).c_str(),
                  str(r, "step").c_str(),
                  (str(r, "slowest_actor") + " " + fmt("%.2f", num(r, "slowest_busy_s")) + " s").c_str());
    const std::string row = line + last;
    out.push_back(waiting_long || behind ? colour(in.colour, "33", row) : row);
  }
  for (const auto& x : named) out.push_back(colour(in.colour, "1;31", "RANKS: " + x));
}

}  // namespace

std::vector<std::string> render_snapshot(const SnapshotInput& in) {
  const nlohmann::json& s = in.status;
  const nlohmann::json run = s.value("run", nlohmann::json::object());
  std::vector<std::string> out;
  const std::string state = str(s, "state");
  const char* state_colour = state == "running" ? "32" : state == "failed" ? "31" : "33";
  out.push_back("megatrain " + in.url + "  pid " + str(run, "pid") + "  " + colour(in.colour, state_colour, state));
  // The model's name with its architecture, unless the name already starts with it (a model defined by
  // [model] keys is named "llama (hidden 256, from [model] keys)").
  const std::string model = str(run, "model"), arch = str(run, "arch");
  const bool names_arch = model == arch || model.rfind(arch + " (", 0) == 0;
  out.push_back("run: " + model + (names_arch ? "" : " (" + arch + ")") + ", " + str(run, "layers") + " layers, " +
                fmt("%.2fM", num(run, "params") / 1e6) + " params, " + str(run, "batch") + " x " + str(run, "seq") +
                " x " + str(run, "micro_batches") + " tokens/step, " + str(run, "backend") +
                (run.value("bf16", false) ? " bf16" : " fp32") + kernel_choices(run) + ", " + str(run, "output_dir"));

  const double step = num(s, "step"), max_steps = num(run, "max_steps");
  std::string progress = "step " + fmt("%.0f", step) + " / " + fmt("%.0f", max_steps);
  if (max_steps > 0 && std::isfinite(step)) progress += fmt(" (%.1f%%)", 100 * step / max_steps);
  progress += "  ETA " + duration(num(s, "eta_s")) + "  goodput " + fmt("%.1f%%", 100 * num(s, "goodput"));
  out.push_back(progress);
  const int spark = std::max(10, in.width - 40);
  out.push_back("loss     " + pad(fmt("%.4f", num(s, "loss")), 12) + "  " +
                (in.series ? sparkline(in.series->loss, spark) : ""));
  out.push_back("tokens/s " + pad(fmt("%.0f", num(s, "tokens_per_s")), 12) + "  " +
                (in.series ? sparkline(in.series->tokens_per_s, spark) : ""));
  out.push_back("lr " + fmt("%.3e", num(s, "lr")) + "  grad norm " + fmt("%.3f", num(s, "grad_norm")) + "  tokens " +
                fmt("%.0f", num(s, "tokens")));
  const nlohmann::json link = s.value("link", nlohmann::json::object());
  const nlohmann::json arena = s.value("arena", nlohmann::json::object());
  out.push_back("link h2d " + fmt("%.3f", num(link, "h2d_bytes_per_s") / 1e9) + " GB/s (" +
                bytes(num(link, "h2d_bytes")) + "), d2h " + fmt("%.3f", num(link, "d2h_bytes_per_s") / 1e9) +
                " GB/s (" + bytes(num(link, "d2h_bytes")) + ")  arena " + bytes(num(arena, "in_use")) + " (peak " +
                bytes(num(arena, "peak")) + ") of " + bytes(num(arena, "budget")) + "  host " +
                bytes(num(s, "host_resident_bytes")));
  const nlohmann::json ck = s.value("last_checkpoint", nlohmann::json());
  out.push_back(ck.is_object() ? "last checkpoint: step " + str(ck, "step") + " " + str(ck, "path") + " (" +
                                     bytes(num(ck, "bytes")) + " in " + fmt("%.2f", num(ck, "seconds")) + " s)"
                               : "last checkpoint: none");
  if (!str(s, "last_error").empty()) out.push_back(colour(in.colour, "31", "last error: " + str(s, "last_error")));

  out.emplace_back();
  out.push_back("actor         state       busy  mailbox  restarts  busy_s    wait_s    handler");
  std::map<std::string, double> busy_before;
  if (in.before && in.before->contains("actors"))
    for (const auto& a : (*in.before)["actors"]) busy_before[str(a, "name")] = num(a, "busy_s");
  std::vector<std::string> stuck;
  for (const auto& a : s.value("actors", nlohmann::json::array())) {
    const std::string name = str(a, "name");
    const double busy_s = num(a, "busy_s"), wait_s = num(a, "wait_s");
    double share = busy_s + wait_s > 0 ? busy_s / (busy_s + wait_s) : 0;  // since start
    if (in.interval_s > 0 && busy_before.count(name)) share = (busy_s - busy_before[name]) / in.interval_s;
    share = std::clamp(std::isfinite(share) ? share : 0.0, 0.0, 1.0);
    const std::string handler = str(a, "handler");
    const double in_handler = num(a, "in_handler_s");
    const bool busy_now = !handler.empty() && handler != "idle";
    const bool is_stuck = busy_now && in_handler >= in.stuck_after_s;
    std::string what = busy_now ? handler + " for " + fmt("%.1f", in_handler) + " s" : "idle";
    if (!str(a, "last_unit").empty()) what += "; last: " + str(a, "last_unit");
    if (!str(a, "last_failure").empty()) what += "; failed: " + str(a, "last_failure");
    if (is_stuck) stuck.push_back(name + " in " + handler + " for " + fmt("%.0f", in_handler) + " s");
    char line[160];
    std::snprintf(line, sizeof line, "%-13s %-10s %4.0f%%  %7s  %8s  %-8s  %-8s  ", name.c_str(),
                  str(a, "state").c_str(), 100 * share, fmt("%.0f", num(a, "mailbox")).c_str(),
                  fmt("%.0f", num(a, "restarts")).c_str(), fmt("%.1f", busy_s).c_str(), fmt("%.1f", wait_s).c_str());
    const std::string row = line + what;
    out.push_back(is_stuck                       ? colour(in.colour, "41;97", row + "  STUCK")
                  : str(a, "state") != "running" ? colour(in.colour, "33", row)
                                                 : row);
  }
  for (const auto& x : stuck) out.push_back(colour(in.colour, "1;31", "STUCK: " + x));
  render_ranks(in, out);
  if (!in.events.empty()) {
    out.emplace_back();
    out.push_back("last events:");
    for (const auto& e : in.events) out.push_back("  " + e);
  }
  return out;
}

}  // namespace mt::monitor_client
