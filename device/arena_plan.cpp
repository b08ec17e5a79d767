#include "device/arena_plan.hpp"

#include <sstream>
#include <vector>

#include "kernels/param_layout.hpp"
#include "storage/host/aligned_buffer.hpp"

namespace mt {

const char* arena_region_kind_name(ArenaRegionKind k) {
  switch (k) {
    case ArenaRegionKind::weight_slot:
      return "weight_slot";
    case ArenaRegionKind::grad_slot:
      return "grad_slot";
    case ArenaRegionKind::workspace:
      return "workspace";
    case ArenaRegionKind::activations:
      return "activations";
  }
  return "?";
}

std::string ArenaRegion::name() const {
  std::string base = arena_region_kind_name(kind);
  if (kind == ArenaRegionKind::weight_slot || kind == ArenaRegionKind::grad_slot)
    return base + "[" + std::to_string(index) + "]";
  return base;
}

const ArenaRegion& ArenaPlan::region(ArenaRegionKind kind, int index) const {
  for (const auto& r : regions)
    if (r.kind == kind && r.index == index) return r;
  throw std::out_of_range(std::string("device arena has no region ") + arena_region_kind_name(kind) + "[" +
                          std::to_string(index) + "]");
}

std::string ArenaPlan::describe() const {
  std::ostringstream out;
  out << "device arena: " << format_bytes(total_bytes) << " of " << format_bytes(budget_bytes)
      << " budget (slots sized for stage " << largest_stage << ")\n";
  for (const auto& r : regions)
    out << "  " << r.name() << ": " << format_bytes(r.bytes) << " at offset " << r.offset << "\n";
  return out.str();
}

std::size_t largest_stage_floats(const ModelConfig& cfg, std::int64_t* stage) {
  cfg.validate();
  std::size_t best = 0;
  std::int64_t best_stage = 0;
  // Layers share one shape, so stage 1 stands for all of them (planning costs O(1) in depth), unless
  // dense layers sit among expert layers (Qwen3-MoE): then the first of each kind.
  std::vector<std::int64_t> probe = {0, 1, num_stages(cfg) - 1};
  if (cfg.layers_differ()) {
    bool seen[2] = {false, false};  // dense, expert
    for (std::int64_t l = 0; l < cfg.num_hidden_layers; ++l)
      if (!seen[cfg.layer_is_moe(l)]) seen[cfg.layer_is_moe(l)] = true, probe.push_back(l + 1);
  }
  for (std::int64_t s : probe) {
    const std::size_t floats = stage_layout(cfg, s).total_floats;
    if (floats > best) best = floats, best_stage = s;
  }
  if (stage) *stage = best_stage;
  return best;
}

std::size_t boundary_activation_bytes(const ModelConfig& cfg, std::int64_t batch, std::int64_t seq, int count) {
  if (batch <= 0 || seq <= 0 || count < 0)
    throw std::invalid_argument("boundary_activation_bytes: batch, seq must be > 0, count >= 0");
  return static_cast<std::size_t>(count) * static_cast<std::size_t>(batch * seq * cfg.hidden_size) * sizeof(float);
}

namespace {

std::size_t align_up(std::size_t n) { return (n + kArenaAlignBytes - 1) / kArenaAlignBytes * kArenaAlignBytes; }

// Lays out the regions back to back; plan.total_bytes is the end of the last one.
ArenaPlan lay_out(const ModelConfig& cfg, const ArenaRequest& req) {
  if (req.weight_slots < 2)
    throw ArenaBudgetError("device.weight_slots=" + std::to_string(req.weight_slots) +
                           " is too few: streaming needs at least 2 weight slots (one computing, one filling)");
  if (req.grad_slots < 1)
    throw ArenaBudgetError("device.grad_slots=" + std::to_string(req.grad_slots) +
                           " is too few: at least 1 gradient staging slot");
  if (req.weight_bytes_per_param == 0 || req.grad_bytes_per_param == 0)
    throw ArenaBudgetError("device arena: bytes per parameter must be > 0");
  ArenaPlan plan;
  const std::size_t floats = largest_stage_floats(cfg, &plan.largest_stage);
  plan.budget_bytes = req.budget_bytes;
  plan.weight_slots = req.weight_slots;
  plan.grad_slots = req.grad_slots;
  plan.weight_slot_bytes = align_up(floats * req.weight_bytes_per_param);
  plan.grad_slot_bytes = align_up(floats * req.grad_bytes_per_param);
  std::size_t offset = 0;
  auto add = [&](ArenaRegionKind kind, int index, std::size_t bytes) {
    plan.regions.push_back(ArenaRegion{kind, index, offset, bytes});
    offset += align_up(bytes);
  };
  for (int k = 0; k < req.weight_slots; ++k) add(ArenaRegionKind::weight_slot, k, plan.weight_slot_bytes);
  for (int k = 0; k < req.grad_slots; ++k) add(ArenaRegionKind::grad_slot, k, plan.grad_slot_bytes);
  add(ArenaRegionKind::workspace, 0, req.workspace_bytes);
  add(ArenaRegionKind::activations, 0, req.activation_bytes);
  plan.total_bytes = offset;
  return plan;
}

std::string need_text(const ArenaPlan& p, const ArenaRequest& req) {
  std::ostringstream out;
  out << p.weight_slots << " weight slots x " << format_bytes(p.weight_slot_bytes) << " + " << p.grad_slots
      << (p.grad_slots == 1 ? " gradient slot x " : " gradient slots x ") << format_bytes(p.grad_slot_bytes)
      << " + workspace " << format_bytes(req.workspace_bytes) << " + activations " << format_bytes(req.activation_bytes)
      << " = " << format_bytes(p.total_bytes) << " needed (" << p.total_bytes << " bytes; slots sized for stage "
      << p.largest_stage << ")";
  return out.str();
}

}  // namespace

std::size_t arena_bytes_needed(const ModelConfig& cfg, const ArenaRequest& request) {
  return lay_out(cfg, request).total_bytes;
}

ArenaPlan plan_arena(const ModelConfig& cfg, const ArenaRequest& request) {
  ArenaPlan plan = lay_out(cfg, request);
  if (plan.total_bytes > request.budget_bytes)
    throw ArenaBudgetError(request.budget_name + " is too small: " + need_text(plan, request) + ", budget " +
                           format_bytes(request.budget_bytes) + " (" + std::to_string(request.budget_bytes) +
                           " bytes)");
  return plan;
}

}  // namespace mt
