// A build without MPI: the node always runs alone. Started by an MPI launcher anyway, it refuses
// (N copies of one run writing the same directory would be wrong), unless cluster.mode=off.
#include "cluster/world.hpp"

namespace mt::cluster {

bool built_with_mpi() { return false; }

std::unique_ptr<World> World::join(const std::string& mode, double /*timeout_s*/) {
  if (mode == "off") return nullptr;
  if (launched_by_mpi_launcher() || mode == "on")
    throw ClusterError(
        std::string(launched_by_mpi_launcher() ? "started by an MPI launcher (mpirun / srun)" : "cluster.mode=on") +
        ", but this megatrain was built without MPI (install libopenmpi-dev and rebuild; "
        "cluster.mode=off runs each process alone)");
  return nullptr;
}

}  // namespace mt::cluster
