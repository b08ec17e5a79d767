// OpenMP's worker pools: see release_thread_pool() in ops.hpp.
#include <omp.h>

#include "kernels/cpu/ops.hpp"

namespace mt::cpu {

void release_thread_pool() {
  // OpenMP 5.0: a soft pause frees the calling thread's pool (its workers exit); the next parallel
  // region on this thread starts a new one. Refused (non-zero) inside a parallel region: then the
  // pool stays, which costs speed, not correctness. On the initial thread it also ends the effect of
  // threads that ran teams and have exited (measured; see ops.hpp).
  if (omp_in_parallel() == 0) (void)omp_pause_resource_all(omp_pause_soft);
}

}  // namespace mt::cpu
