// Internal: carves named, 64-byte aligned regions out of a caller-provided float buffer. The same code
// computes the sizes (base == nullptr) and the pointers, so the two never disagree.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/param_layout.hpp"

namespace mt::detail {

class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(std::int64_t n) {
    float* p = base_ ? base_ + used_ : nullptr;
    used_ += align_floats(static_cast<std::size_t>(n));
    return p;
  }
  std::size_t used() const { return used_; }

 private:
  float* base_;
  std::size_t used_ = 0;
};

}  // namespace mt::detail
