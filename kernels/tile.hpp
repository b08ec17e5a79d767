// A stage's "tile": its weights, gradient accumulator and AdamW moments in one 64-byte aligned flat
// buffer with named offsets, each section stage_layout(...).total_floats long. Stage templates bind to
// the params section by pointer; nothing is copied.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <memory>

#include "kernels/param_layout.hpp"

namespace mt {

struct TileLayout {
  std::size_t stage_floats = 0;                               // one section: the stage's ParamLayout::total_floats
  std::size_t params = 0, grads = 0, adam_m = 0, adam_v = 0;  // offsets in floats
  std::size_t total_floats = 0;
};

inline TileLayout tile_layout(const ParamLayout& l) {
  TileLayout t;
  t.stage_floats = l.total_floats;
  t.params = 0;
  t.grads = l.total_floats;
  t.adam_m = 2 * l.total_floats;
  t.adam_v = 3 * l.total_floats;
  t.total_floats = 4 * l.total_floats;
  return t;
}

// Zero-initialised float storage (tiles, workspaces, activations), aligned as host_memory.hpp aligns a
// host allocation: 64 bytes, or a huge page from 2 MiB up.
struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], FreeDeleter>;
AlignedFloats make_aligned_floats(std::size_t n);  // throws std::bad_alloc

}  // namespace mt
