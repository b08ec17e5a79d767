// Where a run's activations live, as the plan decides them (EnginePlan): named placements, not flags,
// so the engine, the planner's tables and the tests read one value per buffer kind. The keys and values
// and the attention outputs leave the device only into the mapped block: with the boundaries mapped and
// sequence tiles (placements_consistent states it; plan_engine forms nothing else). No CAF.
#pragma once
#include <cstdint>

namespace mt::plan {

// The layer boundaries (each layer's input, read again by its backward) and the backward's dx buffers.
enum class BoundaryPlacement {
  device,     // in the arena (device.keep_intermediates=boundary or all)
  host_ring,  // in host RAM, through a forward ring and backward input slots in the arena (boundary_host)
  mapped,     // in host RAM, used in place by the stage operations (boundary_mapped or all_mapped)
};

// A tiled layer's sequence-sized buffers: attention's keys, values, their gradients, the RoPE tables.
enum class KeysValues {
  device_workspace,  // in the arena's workspace, beside one tile's work
  mapped,            // in the mapped block after the boundaries (device.attention_kv)
};

// Each layer's attention output and log-sum-exp under sequence tiles.
enum class AttentionOutputs {
  recomputed,   // the tiled backward runs the attention forward again
  kept_mapped,  // kept in the mapped block after the rest: the backward reads them
};

const char* boundary_placement_name(BoundaryPlacement b);  // "device", "host_ring", "mapped"
const char* keys_values_name(KeysValues k);                // "device_workspace", "mapped"
const char* attention_outputs_name(AttentionOutputs a);    // "recomputed", "kept_mapped"

// Whether these placements exist together: keys and values mapped, or attention outputs kept, only with
// the boundaries mapped and sequence tiles (seq_tile > 0).
inline bool placements_consistent(BoundaryPlacement b, KeysValues k, AttentionOutputs a, std::int64_t seq_tile) {
  const bool mapped_tiles = b == BoundaryPlacement::mapped && seq_tile > 0;
  return mapped_tiles || (k == KeysValues::device_workspace && a == AttentionOutputs::recomputed);
}

}  // namespace mt::plan
