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
  b.optimizer = threads.optimizer > 0 ? static_cast<int>(threads.optimizer) : b.total;
  // One copy worker per direction (full duplex) once there are cores to spare; one otherwise.
  b.copy = threads.copy > 0 ? static_cast<int>(threads.copy) : (b.total >= 4 ? 2 : 1);
  // Actors mostly wait on mailboxes and blocking work runs on detached actors: a small scheduler.
  b.scheduler = threads.scheduler > 0 ? static_cast<int>(threads.scheduler) : (b.total >= 8 ? 2 : 1);
  return b;
}

ThreadBudget TrainConfig::thread_budget() const {
  return thread_budget(static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace mt
