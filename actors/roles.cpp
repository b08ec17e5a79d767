#include "actors/roles.hpp"

#include <stdexcept>

namespace mt::actors {

const char* role_name(Role r) {
  switch (r) {
    case Role::loader:
      return "loader";
    case Role::prefetcher:
      return "prefetcher";
    case Role::compute:
      return "compute";
    case Role::collector:
      return "collector";
    case Role::optimizer:
      return "optimizer";
  }
  return "?";
}

Role parse_role(const std::string& name) {
  for (int i = 0; i < kRoleCount; ++i)
    if (name == role_name(static_cast<Role>(i))) return static_cast<Role>(i);
  throw std::invalid_argument("unknown actor role '" + name +
                              "' (one of: loader, prefetcher, compute, collector, optimizer)");
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::data:
      return "data";
    case Phase::prefetch:
      return "prefetch";
    case Phase::forward:
      return "forward";
    case Phase::head:
      return "head";
    case Phase::backward:
      return "backward";
    case Phase::collect:
      return "collect";
    case Phase::optimize:
      return "optimize";
    case Phase::prefetch_boundary:
      return "prefetch_boundary";
  }
  return "?";
}

}  // namespace mt::actors
