#include "cluster/bootstrap_id.hpp"

#include <vector>

#include "cluster/grad_reduce.hpp"
#include "storage/checkpoint/checksum.hpp"

namespace mt::cluster {

std::uint64_t bootstrap_id_checksum(const BootstrapId& id) { return ckpt::checksum(id.data(), id.size()); }

BootstrapId broadcast_bootstrap_id(World& world, Channel ch, const std::function<BootstrapId()>& make_id,
                                   const std::string& what) {
  BootstrapId id{};
  if (world.rank() == 0) id = make_id();
  share_from_owner(world, ch, 0, id.data(), id.size(), what + " (rank 0's id)");
  return id;
}

void check_same_bootstrap_id(World& world, Channel ch, const BootstrapId& id, const std::string& what) {
  const std::uint64_t mine = bootstrap_id_checksum(id);
  std::vector<std::uint64_t> every(static_cast<std::size_t>(world.size()));
  world.allgather(ch, &mine, sizeof mine, every.data(), what + " (the id's checksums)");
  std::string differ;
  for (std::size_t r = 1; r < every.size(); ++r)
    if (every[r] != every[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (!differ.empty())
    throw ClusterError(world.label() + ": " + what + ": rank(s) " + differ +
                       " received another id than rank 0 sent (checksums differ); no communicator was made");
}

BootstrapId share_bootstrap_id(World& world, Channel ch, const std::function<BootstrapId()>& make_id,
                               const std::string& what) {
  const BootstrapId id = broadcast_bootstrap_id(world, ch, make_id, what);
  check_same_bootstrap_id(world, ch, id, what);
  return id;
}

}  // namespace mt::cluster
