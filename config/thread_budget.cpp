#include <algorithm>
#include <thread>

#include "config/train_config.hpp"

namespace mt {

ThreadBudget TrainConfig::thread_budget(int hardware_threads) const {
  ThreadBudget b;
  b.total = threads.total > 0 ? static_cast<int>(threads.total) : std::max(1, hardware_threads);
  // Compute gets every core. The optimizer, the collector and the copy engine work in short bursts
  // (1-2% of a step on the demo model): they share the cores with compute while they run instead of
  // reserving one that would sit idle for the rest of the step.
  b.blas = threads.blas > 0 ? static_cast<int>(threads.blas) : b.total;
  // The optimizer's and the collector's teams. With a GPU doing the compute, the cores are theirs.
  // On the CPU backend they share compute's cores, so width buys little: each extra OpenMP worker takes
  // libgomp past one thread per core, and compute's workers then sleep on a futex between parallel
  // regions. One thread per 8 cores still outruns the compute it hides behind (tools/bench/README.md).
  const int optimizer_default = device.backend == "cpu" ? std::max(1, (b.total + 7) / 8) : b.total;
  b.optimizer = threads.optimizer > 0 ? static_cast<int>(threads.optimizer) : optimizer_default;
  // One copy worker per direction (full duplex) once there are cores to spare, or over a paced link
  // (DeviceSection::copy_bandwidth_gbps models a full-duplex PCIe link; its workers mostly sleep for the pacing,
  // so a second one costs no core); one otherwise. One worker would make a paced link half duplex.
  b.copy = threads.copy > 0 ? static_cast<int>(threads.copy) : (b.total >= 4 || device.copy_bandwidth_gbps > 0 ? 2 : 1);
  // Actors mostly wait on mailboxes and blocking work runs on detached actors: a small scheduler.
  b.scheduler = threads.scheduler > 0 ? static_cast<int>(threads.scheduler) : (b.total >= 8 ? 2 : 1);
  return b;
}

ThreadBudget TrainConfig::thread_budget() const {
  return thread_budget(static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace mt
