#include <algorithm>
#include <thread>

#include "config/train_config.hpp"

namespace mt {

ThreadBudget TrainConfig::thread_budget(int hardware_threads) const {
  ThreadBudget b;
  b.total = threads.total > 0 ? static_cast<int>(threads.total) : std::max(1, hardware_threads);
  // The optimizer overlaps the next forward: give it a quarter of the budget (at least one thread)
  // and the compute kernels the rest, so the two heavy pools never oversubscribe the cores.
  const int auto_optimizer = std::max(1, b.total / 4);
  b.optimizer = threads.optimizer > 0 ? static_cast<int>(threads.optimizer) : auto_optimizer;
  b.blas = threads.blas > 0 ? static_cast<int>(threads.blas) : std::max(1, b.total - b.optimizer);
  if (threads.optimizer == 0 && threads.blas > 0) b.optimizer = std::max(1, b.total - b.blas);
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
