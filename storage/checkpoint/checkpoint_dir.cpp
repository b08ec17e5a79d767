#include "storage/checkpoint/checkpoint_dir.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>

#include "storage/checkpoint/checkpoint_error.hpp"
#include "storage/hf/file_util.hpp"
#include "storage/hf/hf_config.hpp"

namespace mt::ckpt {

namespace fs = std::filesystem;

std::string step_dir_name(std::int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string shard_file_name(std::size_t shard, const std::string& prefix) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%05zu.h5", shard);
  return prefix + buf;
}

std::string stage_group_name(std::int64_t stage) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "stage_%05lld", static_cast<long long>(stage));
  return buf;
}

std::optional<std::int64_t> parse_step_dir_name(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return std::nullopt;
  std::int64_t step = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10) return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::vector<CheckpointEntry> list_checkpoints(const fs::path& root) {
  std::vector<CheckpointEntry> out;
  if (!fs::is_directory(root)) return out;
  const auto latest = read_latest(root);
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory()) continue;
    const auto step = parse_step_dir_name(e.path().filename().string());
    if (!step) continue;
    CheckpointEntry c;
    c.dir = e.path();
    c.step = *step;
    c.has_manifest = fs::exists(e.path() / kManifestFile);
    c.is_latest = latest && latest->filename() == e.path().filename();
    out.push_back(c);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

std::optional<fs::path> read_latest(const fs::path& root) {
  std::ifstream in(root / kLatestFile);
  if (!in) return std::nullopt;
  std::string name;
  std::getline(in, name);
  if (!parse_step_dir_name(name))
    throw CheckpointError((root / kLatestFile).string() + ": does not name a step directory: '" + name + "'");
  return root / name;
}

void write_latest(const fs::path& root, const std::string& dir_name) {
  try {
    hf::write_text_atomically(root / kLatestFile, dir_name + "\n");
    hf::fsync_directory(root);
  } catch (const hf::HfError& e) {
    throw CheckpointError(e.what());
  }
}

namespace {

// A writer that still runs. A zombie (exited, not yet reaped: a container whose first process reaps no
// orphans keeps them for ever) has stopped writing.
bool writer_runs(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: take kill's word
  const auto paren = line.rfind(')');          // "pid (comm) S ...": the name may hold spaces and parentheses
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

}  // namespace

void remove_stale_temp_dirs(const fs::path& root) {
  if (!fs::is_directory(root)) return;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kTempPrefix, 0) != 0) continue;
    // ".tmp-<what>-<pid>-<n>": the writer's pid is the second-to-last field.
    const auto last = name.rfind('-');
    const auto before = last == std::string::npos || last == 0 ? std::string::npos : name.rfind('-', last - 1);
    if (before == std::string::npos) continue;
    const long pid = std::strtol(name.c_str() + before + 1, nullptr, 10);
    if (pid <= 0) continue;
    if (writer_runs(static_cast<pid_t>(pid))) continue;
    std::error_code ec;
    fs::remove_all(e.path(), ec);
  }
}

}  // namespace mt::ckpt

namespace mt::ckpt {

std::vector<std::filesystem::path> apply_retention(const std::filesystem::path& root, int keep_last) {
  std::vector<std::filesystem::path> removed;
  if (keep_last <= 0) return removed;
  auto all = list_checkpoints(root);
  const std::size_t keep = static_cast<std::size_t>(keep_last);
  if (all.size() <= keep) return removed;
  for (std::size_t i = 0; i + keep < all.size(); ++i) {
    if (all[i].is_latest) continue;  // the checkpoint a resume would load is never deleted
    const auto doomed = root / (std::string(kTempPrefix) + "delete-" + all[i].dir.filename().string() + "-" +
                                std::to_string(::getpid()) + "-0");
    std::error_code ec;
    std::filesystem::rename(all[i].dir, doomed, ec);
    if (ec) continue;
    std::filesystem::remove_all(doomed, ec);
    removed.push_back(all[i].dir);
  }
  return removed;
}

}  // namespace mt::ckpt
