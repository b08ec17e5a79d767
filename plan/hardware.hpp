// Hardware profiles for the planner: what a machine offers the streaming engine (device rate and
// memory, the host link per direction, host memory bandwidth, RAM, the offload drive). Datasheet
// profiles come from an INI file (config/hardware.ini, built in; plan.hardware_file for an edited
// copy); `this` machine is measured in a few seconds by measure_this_machine. No CAF here.
#pragma once
#include <map>
#include <string>

namespace mt::plan {

struct HardwareProfile {
  std::string key;                 // "h200", "this"
  std::string name;                // what it describes
  std::string source;              // "datasheet profile [h200] of FILE" or "measured now on this machine"
  double device_flops_bf16 = 0.0;  // FLOP/s, dense
  double device_flops_fp32 = 0.0;
  double achievable_fraction = 1.0;  // of the rates above, for a whole layer (datasheet profiles only)
  double device_memory_bytes = 0.0;
  double link_h2d = 0.0, link_d2h = 0.0;  // bytes/s per direction
  double host_mem = 0.0;                  // bytes/s a streaming loop reaches (optimizer, accumulation)
  double host_ram_bytes = 0.0;
  double disk_read = 0.0, disk_write = 0.0;  // bytes/s; 0 = not measured
  // CPU seconds a byte of the NVMe tier's own read and write path takes (its block checksums and system
  // calls, on the store's worker and I/O threads), measured with the disk; 0 = not measured.
  double disk_read_cpu_s_per_byte = 0.0, disk_write_cpu_s_per_byte = 0.0;
  double disk_bytes = 0.0;  // free space
  // Measured on this machine only (0 elsewhere).
  double adamw_params_per_s = 0.0;  // the optimizer's fp32 AdamW rate with the run's optimizer threads
  // The run's moment codec (train.optimizer_compression), parameters (m and v) a second on one store
  // worker; 0 = none.
  double codec_encode_params_per_s = 0.0, codec_decode_params_per_s = 0.0;
  bool shared_cores = false;  // compute, optimizer, collector and copy engine share the CPU cores (the CPU backend)
  std::string cpu;            // this machine: CPU model and the GEMM library's kernel choice
};

// The profiles of an INI text (sections of the keys config/hardware.ini documents). Throws
// std::invalid_argument naming `source`, the line and the problem (unknown key, missing key, bad number).
std::map<std::string, HardwareProfile> parse_hardware_profiles(const std::string& text, const std::string& source);
// The built-in copy of config/hardware.ini (compiled in from the source tree).
const std::string& builtin_hardware_ini();
// The profile `key` of `file` ("" = the built-in file). Throws std::invalid_argument naming the
// available sections when absent.
HardwareProfile load_hardware_profile(const std::string& key, const std::string& file);

struct MeasureOptions {
  int compute_threads = 1;    // the run's blas threads
  int optimizer_threads = 1;  // the run's optimizer threads
  std::string disk_dir;       // measure this directory's drive; "" = skip the disk
  double disk_bytes = 256.0 * (1 << 20);
  int disk_queue_depth = 4;    // blocks in flight, as the tier moves them (train.offload_io_threads)
  std::string codec = "none";  // train.optimizer_compression: its encode and decode rates are measured
};
// This machine in a few seconds: fp32 and bf16 GEMM rate (1024-cubed products through the engine's
// own kernels), memory copy bandwidth (the CPU backend's link is a memcpy), the AdamW rate, host RAM
// (MemAvailable), the moment codec's encode and decode rates (1M parameters), and when disk_dir is set
// the NVMe tier's write and read rate and CPU seconds per byte through the tier's own code (a stage
// file rewritten in place and read back: O_DIRECT, 1 MiB chunks, disk_queue_depth of them in flight,
// a checksum per block), and the free space.
HardwareProfile measure_this_machine(const MeasureOptions& options);

// A memory field of this process's /proc/self/status ("VmRSS": resident now, "VmHWM": its peak), in
// bytes (0 when unknown).
double process_status_bytes(const std::string& field);
// Free bytes of the filesystem holding `path` (or its nearest existing parent); 0 when unknown.
double free_disk_bytes(const std::string& path);

}  // namespace mt::plan
