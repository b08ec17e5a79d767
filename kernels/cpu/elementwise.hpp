// Internal: runs an 8-lane body over [0, n) split into contiguous chunks per thread (chunk edges on
// multiples of 64), with tails padded into a full vector, so each element gets the same instructions
// wherever it lands and results never depend on the thread count.
#pragma once
#include <algorithm>
#include <cstddef>

#include <omp.h>

namespace mt::cpu {

template <class Body>  // Body(std::size_t begin, std::size_t end): handles a range, tail included
void parallel_chunks(std::size_t n, int threads, Body body) {
  constexpr std::size_t kGrain = 64;
  const std::size_t blocks = (n + kGrain - 1) / kGrain;
  const int t = std::max(1, std::min<int>(threads, static_cast<int>(std::max<std::size_t>(blocks, 1))));
  if (t == 1 || n < 8192) {
    body(std::size_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(t)
  {
    const std::size_t id = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t per = (blocks + t - 1) / t;
    const std::size_t begin = std::min(n, id * per * kGrain), end = std::min(n, (id + 1) * per * kGrain);
    if (begin < end) body(begin, end);
  }
}

}  // namespace mt::cpu
