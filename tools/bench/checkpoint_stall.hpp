// The checkpoint_stall figure of `tools/bench/run checkpoint` (checkpoint_stall.cpp).
#pragma once
#include <filesystem>

#include "tools/bench/bench_report.hpp"

namespace mt::bench {

// Trains the demo model's shapes for `steps` steps, checkpointing every `every`, `rounds` times; adds
// checkpoint_stall (the median of the rounds, each a control run and a checkpointed run). immediate:
// CheckpointJob::write_after_step = false. snapshot_mib: train.save_snapshot_mib (the copies the
// checkpointer and the optimizer may make; 0 = write from the tiles, the optimizer waiting); < 0: the
// engine's default. host_ram_gb: plan.host_ram_gb (0: this machine's; a tiny figure leaves auto no room
// for all_mapped, so the demo recomputes as it did before it). Returns non-zero on failure.
int measure_checkpoint_stall(Report& report, const std::filesystem::path& dir, int steps, int every, int rounds,
                             bool immediate = false, int snapshot_mib = -1, double host_ram_gb = 0.0);

}  // namespace mt::bench
