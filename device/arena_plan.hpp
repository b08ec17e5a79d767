// The layout of the device side, decided once before anything is allocated. The device (GPU memory,
// or on the CPU backend a bounded arena standing in for it) holds only:
//   - K weight slots, each sized for the largest stage's streamed parameters (K >= 2: double buffering);
//   - gradient staging slot(s), each sized for the largest stage's gradients;
//   - workspace for the kernels (the caller's byte count, from the kernels' workspace-size functions);
//   - layer-boundary activations (the caller's byte count).
// None of it depends on the number of layers, so device memory does not grow with depth. plan_arena is
// a pure function: it either returns offsets that fit the budget or throws an error that names the
// budget key and spells out the need, so a too-small budget is rejected at start-up, never mid-run.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/model_config.hpp"

namespace mt {

inline constexpr std::size_t kArenaAlignBytes = 256;  // every region starts here-aligned (GPU-friendly)

enum class ArenaRegionKind { weight_slot, grad_slot, workspace, activations };
const char* arena_region_kind_name(ArenaRegionKind k);

struct ArenaRegion {
  ArenaRegionKind kind = ArenaRegionKind::workspace;
  int index = 0;           // slot number within its kind (0 for workspace / activations)
  std::size_t offset = 0;  // bytes from the arena's start
  std::size_t bytes = 0;
  std::string name() const;  // "weight_slot[1]", "workspace"
};

struct ArenaRequest {
  std::size_t budget_bytes = 0;
  // How the budget was given, for error messages: "device.max_vram_gb=0.0625".
  std::string budget_name = "device memory budget";
  int weight_slots = 2;                    // K; must be >= 2
  int grad_slots = 1;                      // gradient staging slots; must be >= 1
  std::size_t weight_bytes_per_param = 4;  // what streams into a slot (fp32 on CPU, bf16 on CUDA)
  std::size_t grad_bytes_per_param = 4;    // what is staged for the device-to-host copy
  std::size_t workspace_bytes = 0;
  std::size_t activation_bytes = 0;
};

// Thrown when a request does not fit its budget (or asks for fewer than 2 weight slots).
class ArenaBudgetError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct ArenaPlan {
  std::size_t budget_bytes = 0;
  std::size_t total_bytes = 0;  // what is allocated: <= budget_bytes
  int weight_slots = 0;
  int grad_slots = 0;
  std::size_t weight_slot_bytes = 0;  // capacity of each weight slot
  std::size_t grad_slot_bytes = 0;
  std::int64_t largest_stage = 0;    // the stage that sized the slots
  std::vector<ArenaRegion> regions;  // in offset order: weight slots, grad slots, workspace, activations

  // Throws std::out_of_range naming the region when absent.
  const ArenaRegion& region(ArenaRegionKind kind, int index = 0) const;
  // One line per region plus the total against the budget, sizes in MiB.
  std::string describe() const;
};

// Largest streamed stage of the model in floats (the stage_layout total_floats maximum) and its index.
std::size_t largest_stage_floats(const ModelConfig& cfg, std::int64_t* stage = nullptr);

// Bytes of `count` layer-boundary hidden states of [batch, seq, hidden_size] fp32 each: a helper for
// the activation_bytes of a request (count does not grow with depth when boundaries live on the host).
std::size_t boundary_activation_bytes(const ModelConfig& cfg, std::int64_t batch, std::int64_t seq, int count);

// The smallest budget that fits `request` (its budget_bytes ignored): for messages and auto-sizing.
std::size_t arena_bytes_needed(const ModelConfig& cfg, const ArenaRequest& request);

// Throws ArenaBudgetError, e.g. "device.max_vram_gb=0.015625 is too small: 2 weight slots x 6.0 MiB +
// 1 gradient slot x 6.0 MiB + workspace 3.0 MiB + activations 1.0 MiB = 22.0 MiB needed".
ArenaPlan plan_arena(const ModelConfig& cfg, const ArenaRequest& request);

}  // namespace mt
