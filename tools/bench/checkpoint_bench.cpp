// Checkpoint write bandwidth against the disk's own fsynced sequential write rate, measured side by
// side in one run on the same directory:
//   disk:       write N bytes in 8 MiB blocks + fsync, through the page cache (writeback started every
//               128 MiB) and with O_DIRECT; three rounds interleaved with the checkpoint's, the best of
//               each side is compared (the ceiling: the faster way)
//   checkpoint: CheckpointWriter for a Llama-shaped model of about N bytes (params + Adam m + v),
//               every stage written, finalize() (fsync, whole-file checksums, manifest, rename, latest)
// Then checkpoint_stall (checkpoint_stall.cpp): the extra step time an asynchronous checkpoint costs
// the engine on the demo model, as a fraction of a step.
// Usage: bench_checkpoint [--dir DIR] [--gib N] [--stall-steps N] [--stall-every K] [--stall-rounds R]
//                         [--stall-immediate 0|1] [--stall-snapshot-mib N] [--stall-host-ram-gb X]
//   (default: the temp directory, 1 GiB, 16 steps checkpointing every 4, median of 5 rounds (each a control run and a
//   checkpointed run);
//   --stall-steps 0 skips it)
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/param_layout.hpp"
#include "storage/checkpoint/checkpoint_dir.hpp"
#include "storage/checkpoint/checkpoint_writer.hpp"
#include "tools/bench/bench_report.hpp"
#include "tools/bench/checkpoint_stall.hpp"

namespace fs = std::filesystem;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Bytes per second of a plain sequential write + fsync of `bytes` bytes, through the page cache or with
// O_DIRECT (as the checkpoint writer sends most bytes); the ceiling is the faster of the two.
double disk_write_rate(const fs::path& dir, std::uint64_t bytes, bool direct) {
  const fs::path file = dir / "disk-probe.bin";
  constexpr std::size_t kBlock = 8u << 20;
  std::unique_ptr<char, FreeDeleter> block(static_cast<char*>(std::aligned_alloc(4096, kBlock)));
  for (std::size_t i = 0; i < kBlock; ++i) block.get()[i] = static_cast<char>(i * 131 + 7);
  const double t0 = now();
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0) {
    if (direct) return 0.0;  // no O_DIRECT on this file system (tmpfs)
    throw std::runtime_error("cannot create " + file.string());
  }
  // Buffered: early writeback every 128 MiB, as the checkpoint writer starts it per stage: the ceiling
  // is the best plain sequential writer we know, not a naive one the checkpoint could beat.
  for (std::uint64_t done = 0; done < bytes; done += kBlock) {
    if (::write(fd, block.get(), kBlock) != static_cast<ssize_t>(kBlock)) throw std::runtime_error("write failed");
    if (!direct && (done / kBlock) % 16 == 15) ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
  }
  if (::fsync(fd) != 0) throw std::runtime_error("fsync failed");
  ::close(fd);
  const double s = now() - t0;
  fs::remove(file);
  return static_cast<double>(bytes) / s;
}

mt::ModelConfig model_of_about(std::uint64_t bytes) {
  mt::ModelConfig c;
  c.arch = mt::Arch::llama;
  c.vocab_size = 8192;  // small: most bytes are in layers, as in real models
  c.hidden_size = 1024;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.intermediate_size = 2816;
  c.max_position_embeddings = 2048;
  c.num_hidden_layers = 1;
  const std::uint64_t per_layer = mt::stage_layout(c, 1).param_count() * 12;  // p, m, v
  const std::uint64_t fixed = (mt::stage_layout(c, 0).param_count() + mt::stage_layout(c, 2).param_count()) * 12;
  c.num_hidden_layers =
      bytes > fixed ? std::max<std::int64_t>(1, static_cast<std::int64_t>((bytes - fixed) / per_layer)) : 1;
  return c;
}

long peak_rss_bytes() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss * 1024L;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path base = fs::temp_directory_path();
  double gib = 1.0;
  int stall_steps = 16, stall_every = 4, stall_rounds = 5, stall_immediate = 0, stall_snapshot_mib = -1;
  double stall_host_ram_gb = 0.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--dir"))
      base = argv[i + 1];
    else if (!std::strcmp(argv[i], "--gib"))
      gib = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--stall-steps"))
      stall_steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--stall-every"))
      stall_every = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--stall-rounds"))
      stall_rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--stall-immediate"))
      stall_immediate = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--stall-snapshot-mib"))
      stall_snapshot_mib = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--stall-host-ram-gb"))
      stall_host_ram_gb = std::atof(argv[i + 1]);
  }
  const fs::path dir = base / ("mt-bench-checkpoint-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto bytes = static_cast<std::uint64_t>(gib * (1u << 30));
  try {
    const mt::ModelConfig c = model_of_about(bytes);
    const std::uint64_t ckpt_bytes = static_cast<std::uint64_t>(mt::total_param_count(c)) * 12;
    std::printf("model: llama, %lld layers, %.3f Gparam; checkpoint data %.2f GiB (params + m + v) in %s\n",
                static_cast<long long>(c.num_hidden_layers), mt::total_param_count(c) / 1e9,
                ckpt_bytes / double(1u << 30), dir.c_str());
    // One set of stage buffers, reused for every stage (the engine's tiles would be written in place).
    std::size_t max_floats = 0;
    for (std::int64_t s = 0; s < mt::num_stages(c); ++s)
      max_floats = std::max(max_floats, mt::stage_layout(c, s).total_floats);
    // Page-aligned, as the engine's host tiles are (2 MiB).
    auto aligned_floats = [&] {
      return std::unique_ptr<float, FreeDeleter>(
          static_cast<float*>(std::aligned_alloc(4096, (max_floats * sizeof(float) + 4095) / 4096 * 4096)));
    };
    const auto p_buf = aligned_floats(), m_buf = aligned_floats(), v_buf = aligned_floats();
    float *p = p_buf.get(), *m = m_buf.get(), *v = v_buf.get();
    for (std::size_t i = 0; i < max_floats; ++i)
      p[i] = 0.001f * static_cast<float>(i % 1000), m[i] = -p[i], v[i] = p[i] * p[i];
    const long rss_before = peak_rss_bytes();

    // Interleaved rounds: the shared disk's rate drifts, so each side gets its best of three.
    double disk = 0, disk_direct = 0, best_ckpt = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const double d = disk_write_rate(dir, ckpt_bytes, false);
      const double dd = disk_write_rate(dir, ckpt_bytes, true);
      std::printf("disk fsynced sequential write: %.3f GB/s buffered, %.3f GB/s O_DIRECT\n", d / 1e9, dd / 1e9);
      disk = std::max(disk, d);
      disk_direct = std::max(disk_direct, dd);
      const double t0 = now();
      mt::ckpt::CheckpointWriter w(dir / "ckpt", rep + 1, c);
      for (std::int64_t s = 0; s < mt::num_stages(c); ++s) w.write_stage(s, {p, m, v});
      w.finalize();
      const double rate = static_cast<double>(ckpt_bytes) / (now() - t0);
      std::printf("checkpoint write (incl. fsync, checksums, publish): %.3f GB/s\n", rate / 1e9);
      best_ckpt = std::max(best_ckpt, rate);
      fs::remove_all(w.temp_dir().parent_path() / mt::ckpt::step_dir_name(rep + 1));
    }
    const long rss_growth = peak_rss_bytes() - rss_before;
    std::printf("peak RSS growth while writing: %.1f MB (model data %.0f MB)\n", rss_growth / 1e6, ckpt_bytes / 1e6);

    mt::bench::Report report("checkpoint");
    report.add({"checkpoint_write_bandwidth", best_ckpt / 1e9, "GB/s", std::max(disk, disk_direct) / 1e9});
    report.add({"disk_fsync_write_bandwidth", disk / 1e9, "GB/s", 0});
    report.add({"disk_direct_write_bandwidth", disk_direct / 1e9, "GB/s", 0});
    if (stall_steps > 0 &&
        mt::bench::measure_checkpoint_stall(report, dir, stall_steps, std::max(1, stall_every), stall_rounds,
                                            stall_immediate != 0, stall_snapshot_mib, stall_host_ram_gb) != 0)
      throw std::runtime_error("checkpoint_stall measurement failed");
    fs::remove_all(dir);
    report.print();
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
    return 1;
  }
  return 0;
}
