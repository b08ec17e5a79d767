// What the tests under mpirun share: the skip without MPI, the launcher's flags for this machine, and a
// shell command's exit code and output. MEGATRAIN_MPIEXEC is the mpirun CMake found (tests/cluster).
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cluster/world.hpp"
#include "tests/actors/node_binary_fixture.hpp"

namespace mt::test {

inline const std::string kMpiexec = MEGATRAIN_MPIEXEC;

inline void require_mpi() {
  if (!mt::cluster::built_with_mpi() || kMpiexec.empty() || kMpiexec.find("NOTFOUND") != std::string::npos) {
    std::fprintf(stderr, "built without MPI or no mpirun found (tools/install-deps installs OpenMPI): skipped\n");
    std::exit(77);  // ctest's SKIP_RETURN_CODE: reported as skipped, never as passed
  }
}

// The launcher's flags for this machine: root in CI containers, more ranks than cores, no CMA
// single-copy (ptrace is often not allowed in containers).
inline std::string mpirun(int ranks) {
  return kMpiexec + " --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none -np " +
         std::to_string(ranks) + " ";
}

// Runs `cmd` with its stdout and stderr into `log`; the exit code (-1: killed by a signal) and the output.
inline Outcome sh(const std::string& cmd, const std::filesystem::path& log) {
  const int rc = std::system((cmd + " > " + log.string() + " 2>&1").c_str());
  return Outcome{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(log)};
}

}  // namespace mt::test
