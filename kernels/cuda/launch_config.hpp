// Launch-configuration arithmetic for the CUDA elementwise kernels. Plain C++ (no CUDA headers) so the
// host side is tested on machines without a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>

namespace mt::cuda {

struct LaunchConfig {
  unsigned grid = 0;                    // blocks
  unsigned block = 0;                   // threads per block
  std::size_t elements_per_thread = 0;  // upper bound of the grid-stride loop's trip count
};

// A grid-stride launch for n elements processed `vector_width` at a time (float4 = 4). The grid is
// capped at `max_blocks_per_sm` x `sm_count` resident blocks; larger n loops inside the kernel.
inline LaunchConfig elementwise_launch(std::size_t n, int sm_count, int vector_width = 4, unsigned block = 256,
                                       unsigned max_blocks_per_sm = 8) {
  if (sm_count <= 0) throw std::invalid_argument("elementwise_launch: sm_count must be > 0");
  if (vector_width <= 0) throw std::invalid_argument("elementwise_launch: vector_width must be > 0");
  if (block == 0 || block > 1024 || block % 32 != 0)
    throw std::invalid_argument("elementwise_launch: block must be a multiple of 32 in [32, 1024]");
  LaunchConfig c;
  c.block = block;
  if (n == 0) return c;  // grid 0: the caller skips the launch
  const std::size_t vectors = (n + static_cast<std::size_t>(vector_width) - 1) / vector_width;
  const std::size_t needed = (vectors + block - 1) / block;
  const std::size_t cap = static_cast<std::size_t>(sm_count) * max_blocks_per_sm;
  c.grid = static_cast<unsigned>(needed < cap ? needed : cap);
  const std::size_t threads = static_cast<std::size_t>(c.grid) * block;
  c.elements_per_thread = (vectors + threads - 1) / threads * vector_width;
  return c;
}

}  // namespace mt::cuda
