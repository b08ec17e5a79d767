// The node binary's command line (node_main.hpp): `train` and `plan`, their usage and exit codes.
#include "node/node_main.hpp"

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cluster/world.hpp"
#include "config/node_config.hpp"
#include "node/plan_command.hpp"

namespace {

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: megatrain train [--config-file=FILE.ini] [--section.key=value ...]\n"
               "       megatrain train --help         every key, its default and meaning\n"
               "       megatrain train --dump-config  the effective configuration\n"
               "       megatrain plan [same arguments] bytes per tier, what does not fit, predicted step time\n"
               "       megatrain plan --help          the planner's keys (plan.*) and hardware profiles\n");
}

int train(int argc, char** argv, const mt::node::Customize& customize) {
  std::vector<std::string> args(argv + 2, argv + argc);
  mt::NodeConfig node;
  const mt::NodeConfigLoad load = node.load(args);
  if (load.outcome == mt::NodeConfigLoad::Outcome::exit_success) return 0;
  if (load.outcome == mt::NodeConfigLoad::Outcome::exit_failure) {
    std::fprintf(stderr, "megatrain: %s\n", load.error.c_str());
    return 1;
  }
  // Started by mpirun / srun: join the job (MPI says which rank and how many) before any thread starts.
  std::unique_ptr<mt::cluster::World> world;
  try {
    world = mt::cluster::World::join(node.values.cluster.mode, node.values.cluster.collective_timeout_s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain: %s\n", e.what());
    return 1;
  }
  mt::node::TrainingHooks hooks;
  if (world) {
    node.values.cluster.rank = world->rank();
    node.values.cluster.ranks = world->size();
    node.values.cluster.local_rank = world->local_rank();
    node.values.cluster.local_ranks = world->local_size();
    hooks.world = world.get();
  }
  if (customize) {
    customize(node.values, hooks);
    try {
      node.values.validate_values();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "megatrain: %s\n", e.what());
      return 1;
    }
  }
  const int status = mt::node::run_training(node.values, hooks, &node).exit_status;
  // A failed rank ends the whole job at once: its peers would otherwise wait for it until their timeout.
  if (status != 0 && world && world->size() > 1) world->abort(status);
  return status;
}

}  // namespace

namespace mt::node {

using namespace mt::actors;  // the engine this folder runs

int node_main(int argc, char** argv, const Customize& customize) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "plan") == 0)
    return mt::node::run_plan_command(std::vector<std::string>(argv + 2, argv + argc));
  if (std::strcmp(argv[1], "train") != 0) {
    std::fprintf(stderr, "megatrain: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
  }
  return train(argc, argv, customize);
}

}  // namespace mt::node
