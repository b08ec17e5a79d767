// Compute precision of a run. Masters, gradients, moments and every accumulation are fp32 in both;
// `bf16` means the weights a stage computes with are a bf16 copy of the fp32 masters (same element
// offsets as the fp32 ParamLayout, 2 bytes each), matrix products take bf16 inputs and accumulate in
// fp32, and norms, softmax statistics and the loss stay fp32.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mt {

enum class Precision { fp32, bf16 };

// A bf16 number as stored: the upper 16 bits of an IEEE fp32 (round to nearest even from fp32).
using bf16_t = std::uint16_t;

inline std::size_t bytes_per_param(Precision p) { return p == Precision::bf16 ? 2 : 4; }
inline const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

}  // namespace mt
