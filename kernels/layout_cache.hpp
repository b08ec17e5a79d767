// Internal: the stage layouts the templates bind through, built once per thread and model shape
// instead of on every call (building a ParamLayout allocates its names; the hot path should not).
#pragma once
#include "kernels/param_layout.hpp"

namespace mt::detail {

// Same offsets as embedding_layout(c), layer_layout(c, 0) (every layer has the same offsets) and
// head_layout(c). The reference stays valid until the calling thread asks for a different shape.
const ParamLayout& cached_embedding_layout(const ModelConfig& c);
const ParamLayout& cached_layer_layout(const ModelConfig& c);
const ParamLayout& cached_head_layout(const ModelConfig& c);

// True when a and b have the same stage layouts (every field a layout depends on is equal).
bool same_layout_shape(const ModelConfig& a, const ModelConfig& b);

// A per-thread, single-entry cache of something derived from a model's layouts (tensor offsets):
// rebuilt only when the calling thread switches to a model of another shape.
template <class T, class Build>
const T& per_shape(const ModelConfig& c, Build build) {
  thread_local bool valid = false;
  thread_local ModelConfig config;
  thread_local T value;
  if (!valid || !same_layout_shape(config, c)) {
    value = build();
    config = c;
    valid = true;
  }
  return value;
}

}  // namespace mt::detail
