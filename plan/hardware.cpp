#include "plan/hardware.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "config/host_ram.hpp"
#include "kernels/adamw.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/ops_bf16.hpp"
#include "storage/host/aligned_buffer.hpp"
#include "storage/offload/io_pool.hpp"
#include "storage/offload/moment_codec.hpp"
#include "storage/offload/stage_file.hpp"

namespace mt::plan {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// The value without a trailing "; comment" (outside quotes) and without its quotes.
std::string ini_value(const std::string& raw) {
  std::string v = trim(raw);
  if (!v.empty() && v.front() == '"') {
    const auto close = v.find('"', 1);
    if (close == std::string::npos) throw std::invalid_argument("unterminated string");
    return v.substr(1, close - 1);
  }
  const auto c = v.find(';');
  return trim(c == std::string::npos ? v : v.substr(0, c));
}

const std::vector<std::string>& numeric_keys() {
  static const std::vector<std::string> keys = {"device_tflops_bf16",
                                                "device_tflops_fp32",
                                                "achievable_fraction",
                                                "device_memory_gb",
                                                "link_h2d_gbps",
                                                "link_d2h_gbps",
                                                "host_mem_gbps",
                                                "host_ram_gb",
                                                "disk_read_gbps",
                                                "disk_write_gbps",
                                                "disk_gb"};
  return keys;
}

void set_number(HardwareProfile& p, const std::string& key, double x) {
  if (key == "device_tflops_bf16") p.device_flops_bf16 = x * 1e12;
  if (key == "device_tflops_fp32") p.device_flops_fp32 = x * 1e12;
  if (key == "achievable_fraction") p.achievable_fraction = x;
  if (key == "device_memory_gb") p.device_memory_bytes = x * 1e9;
  if (key == "link_h2d_gbps") p.link_h2d = x * 1e9;
  if (key == "link_d2h_gbps") p.link_d2h = x * 1e9;
  if (key == "host_mem_gbps") p.host_mem = x * 1e9;
  if (key == "host_ram_gb") p.host_ram_bytes = x * 1e9;
  if (key == "disk_read_gbps") p.disk_read = x * 1e9;
  if (key == "disk_write_gbps") p.disk_write = x * 1e9;
  if (key == "disk_gb") p.disk_bytes = x * 1e9;
}

double seconds_of(const std::function<void()>& fn, int reps) {
  fn();  // warm-up: pages, thread pools, the library's kernel choice
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return trim(line.substr(line.find(':') + 1));
  return "unknown CPU";
}

// CPU seconds (user + system) of this process so far: the disk probe's threads are its only busy ones.
double process_cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// The NVMe tier's own path (offload::StageFile through an IoPool of `depth` threads: what the staged
// moment store runs): a stage file of `bytes` written, written again in place, and read back with
// its checksums verified; the file is removed. The rates and CPU seconds per byte are those of the
// rewrite and the read: the tier rewrites each stage's file in place every step after its first, and
// a fresh file's first write is slower on some drives (this virtual disk: about half the rate). The
// CPU time is the block checksums and the system calls, which on the CPU backend take compute's cores.
// Queue depth: reads at depth 1 measured about 20% below depth 4 here, writes about the same (3
// alternating pairs), so the probe moves the tier's depth.
void measure_disk(HardwareProfile& p, const std::string& dir, double bytes, int depth) {
  std::filesystem::create_directories(dir);
  const std::string path =
      (std::filesystem::path(dir) / ("megatrain-plan-probe-" + std::to_string(::getpid()))).string();
  const std::size_t payload = std::max<std::size_t>(
      8 * offload::kChecksumBlock, static_cast<std::size_t>(bytes) / offload::kDirectAlign * offload::kDirectAlign);
  double write_s = 0, write_cpu = 0, read_s = 0, read_cpu = 0;
  std::size_t moved = 0;
  try {
    offload::IoPool io(std::max(1, depth), offload::kChecksumBlock);
    offload::StageFile file(path, 0, payload, true);
    AlignedBuffer buf(file.buffer_bytes(), "disk probe", true, offload::kDirectAlign);
    auto* words = reinterpret_cast<std::uint32_t*>(buf.data() + file.header_bytes());
    for (std::size_t i = 0; i < payload / sizeof(std::uint32_t); ++i)
      words[i] = static_cast<std::uint32_t>(i * 2654435761u);
    auto timed = [](double& wall, double& cpu, const std::function<void()>& fn) {
      const double c0 = process_cpu_s();
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      cpu = process_cpu_s() - c0;
    };
    moved = file.write(buf.data(), payload, 1, io);  // the fresh file's first write, not timed
    timed(write_s, write_cpu, [&] { file.write(buf.data(), payload, 2, io); });
    timed(read_s, read_cpu, [&] { file.read(buf.data(), 2, io); });
  } catch (const std::exception& e) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    throw std::runtime_error("plan: the disk probe in " + dir + " failed: " + e.what());
  }
  std::filesystem::remove(path);
  p.disk_write = static_cast<double>(moved) / write_s;
  p.disk_read = static_cast<double>(moved) / read_s;
  p.disk_write_cpu_s_per_byte = write_cpu / static_cast<double>(moved);
  p.disk_read_cpu_s_per_byte = read_cpu / static_cast<double>(moved);
}

}  // namespace

std::map<std::string, HardwareProfile> parse_hardware_profiles(const std::string& text, const std::string& source) {
  std::map<std::string, HardwareProfile> out;
  std::map<std::string, std::set<std::string>> seen;
  std::istringstream in(text);
  std::string line, section;
  int number = 0;
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(source + ":" + std::to_string(number) + ": " + what);
  };
  while (std::getline(in, line)) {
    ++number;
    const std::string t = trim(line);
    if (t.empty() || t[0] == ';' || t[0] == '#') continue;
    if (t[0] == '[') {
      if (t.back() != ']') fail("a section header must end with ']'");
      section = trim(t.substr(1, t.size() - 2));
      if (section == "this") fail("[this] is reserved: this machine is measured, not described");
      if (out.count(section)) fail("section [" + section + "] appears twice");
      out[section].key = section;
      out[section].source = "datasheet profile [" + section + "] of " + source;
      continue;
    }
    if (section.empty()) fail("a key outside any [section]");
    const auto eq = t.find('=');
    if (eq == std::string::npos) fail("expected key = value");
    const std::string key = trim(t.substr(0, eq));
    std::string value;
    try {
      value = ini_value(t.substr(eq + 1));
    } catch (const std::exception& e) {
      fail(key + ": " + e.what());
    }
    HardwareProfile& p = out[section];
    if (key == "name") {
      p.name = value;
    } else if (std::find(numeric_keys().begin(), numeric_keys().end(), key) != numeric_keys().end()) {
      char* end = nullptr;
      const double x = std::strtod(value.c_str(), &end);
      if (value.empty() || end == nullptr || *end != 0 || !(x >= 0))
        fail(key + ": '" + value + "' is not a number >= 0");
      if (key == "achievable_fraction" && (x <= 0 || x > 1)) fail("achievable_fraction must be in (0, 1]");
      set_number(p, key, x);
    } else {
      fail("unknown key '" + key + "' (config/hardware.ini lists the keys)");
    }
    seen[section].insert(key);
  }
  for (const auto& [name, keys] : seen) (void)name, (void)keys;
  for (auto& [name, p] : out) {
    number = 0;
    for (const auto& k : numeric_keys())
      if (!seen[name].count(k)) throw std::invalid_argument(source + ": [" + name + "] lacks " + k);
    if (!seen[name].count("name")) throw std::invalid_argument(source + ": [" + name + "] lacks name");
  }
  return out;
}

HardwareProfile load_hardware_profile(const std::string& key, const std::string& file) {
  std::string text = builtin_hardware_ini(), source = "the built-in config/hardware.ini";
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) throw std::invalid_argument("plan.hardware_file: cannot read " + file);
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    source = file;
  }
  const auto profiles = parse_hardware_profiles(text, source);
  const auto it = profiles.find(key);
  if (it == profiles.end()) {
    std::string names = "this";
    for (const auto& [k, p] : profiles) names += ", " + k;
    throw std::invalid_argument("plan.hardware: no profile '" + key + "' in " + source + " (have: " + names + ")");
  }
  return it->second;
}

double process_status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, field.size() + 1, field + ":") == 0) return std::atof(line.c_str() + field.size() + 1) * 1024.0;
  return 0.0;
}

double free_disk_bytes(const std::string& path) {
  std::filesystem::path p = path.empty() ? std::filesystem::path(".") : std::filesystem::path(path);
  std::error_code ec;
  while (!p.empty() && !std::filesystem::exists(p, ec)) p = p.parent_path();
  if (p.empty()) p = ".";
  struct statvfs st {};
  if (::statvfs(p.c_str(), &st) != 0) return 0.0;
  return static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
}

HardwareProfile measure_this_machine(const MeasureOptions& o) {
  HardwareProfile p;
  p.key = "this";
  p.cpu = cpu_model_name();
  p.name = p.cpu + ", " + std::to_string(o.compute_threads) + " compute threads, " + cpu::gemm_backend_name();
  p.source = "measured now on this machine";
  p.shared_cores = true;
  p.achievable_fraction = 1.0;
  // GEMM: a 1024 x 1024 x 1024 product through the engine's linear kernels (what a layer calls).
  const std::int64_t n = 1024;
  AlignedBuffer a(n * n * sizeof(float), "plan probe", true), b(n * n * sizeof(float), "plan probe", true),
      c(n * n * sizeof(float), "plan probe", true);
  std::fill_n(reinterpret_cast<float*>(a.data()), n * n, 0.5f);
  std::fill_n(reinterpret_cast<float*>(b.data()), n * n, 0.25f);
  const double flops = 2.0 * static_cast<double>(n * n * n);
  const float* fa = reinterpret_cast<const float*>(a.data());
  const float* fb = reinterpret_cast<const float*>(b.data());
  float* fc = reinterpret_cast<float*>(c.data());
  p.device_flops_fp32 =
      flops / seconds_of([&] { cpu::linear_forward(fa, fb, nullptr, fc, n, n, n, o.compute_threads); }, 3);
  {
    std::vector<bf16_t> ha(static_cast<std::size_t>(n * n)), hb(static_cast<std::size_t>(n * n));
    cpu::to_bf16(fa, ha.data(), ha.size(), 1);
    cpu::to_bf16(fb, hb.data(), hb.size(), 1);
    p.device_flops_bf16 =
        flops /
        seconds_of([&] { cpu::linear_forward_bf16(ha.data(), hb.data(), nullptr, fc, n, n, n, o.compute_threads); }, 3);
  }
  // Memory: a 256 MiB copy (the CPU backend's link is a memcpy by one copy worker); read + write bytes.
  const std::size_t bytes = std::size_t{256} << 20;
  AlignedBuffer src(bytes, "plan probe", true), dst(bytes, "plan probe", true);
  const double copy_s = seconds_of([&] { std::memcpy(dst.data(), src.data(), bytes); }, 3);
  p.link_h2d = p.link_d2h = static_cast<double>(bytes) / copy_s;
  p.host_mem = 2.0 * static_cast<double>(bytes) / copy_s;
  // AdamW over 16M parameters (p, g, m, v: 256 MiB) with the optimizer's threads.
  {
    const std::size_t params = std::size_t{16} << 20;
    std::vector<float> pv(params, 0.1f), gv(params, 0.01f), mv(params, 0.0f), vv(params, 0.0f);
    const AdamWStep step = make_adamw_step(AdamWHyper{}, 1);
    p.adamw_params_per_s =
        static_cast<double>(params) /
        seconds_of([&] { cpu::adamw(pv.data(), gv.data(), mv.data(), vv.data(), params, step, o.optimizer_threads); },
                   3);
  }
  // The moment codec on 1M parameters of moment-like values (m Gaussian, v near its square with
  // noise: lossless compresses them about as it does a demo run's real moments, ratio 0.84 against
  // 0.80, at about the same speed): one store worker's encode and decode.
  if (const offload::MomentCodec codec = offload::parse_moment_codec(o.codec); codec != offload::MomentCodec::none) {
    const std::size_t params = std::size_t{1} << 20;
    std::vector<float> m(params), v(params), m2(params), v2(params);
    std::uint32_t state = 12345;
    auto uniform = [&] {  // (0, 1)
      state = state * 1664525u + 1013904223u;
      return (static_cast<float>(state >> 8) + 0.5f) / 16777216.0f;
    };
    for (std::size_t i = 0; i < params; ++i) {
      const float g = std::sqrt(-2.0f * std::log(uniform())) * std::cos(6.2831853f * uniform());
      m[i] = 1e-3f * g;
      v[i] = 1e-6f * (0.5f + uniform()) * std::fabs(g) + m[i] * m[i];
    }
    std::vector<std::byte> enc(offload::encoded_bound(codec, params));
    std::size_t used = 0;
    p.codec_encode_params_per_s =
        static_cast<double>(params) /
        seconds_of([&] { used = offload::encode_moments(codec, m.data(), v.data(), params, enc.data()); }, 3);
    p.codec_decode_params_per_s =
        static_cast<double>(params) /
        seconds_of([&] { offload::decode_moments(codec, enc.data(), used, params, m2.data(), v2.data()); }, 3);
  }
  p.host_ram_bytes = mem_available_bytes();
  p.device_memory_bytes = p.host_ram_bytes;  // the arena is host memory
  if (!o.disk_dir.empty()) {
    measure_disk(p, o.disk_dir, o.disk_bytes, o.disk_queue_depth);
    p.disk_bytes = free_disk_bytes(o.disk_dir);
  }
  return p;
}

}  // namespace mt::plan
