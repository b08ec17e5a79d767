// megatrain: the node binary.
//   megatrain train [--config-file=FILE.ini] [--section.key=value ...]   train (see --help for every key)
//   megatrain train --help | --dump-config
//   megatrain plan [the same arguments]   the run planned, not run (plan/README.md)
// Reads and validates the whole configuration (INI file, command-line overrides), the model and the
// data before anything starts; a bad key, value or file is a clear error and exit code 1. Then trains,
// printing one progress line per step and writing the same as JSONL.
// Checkpoints go to train.output_dir (step-N directories + `latest`): every train.save_steps steps,
// every train.save_minutes minutes, on SIGUSR1 (at the next step boundary), and always at the end of
// the run. SIGTERM / SIGINT: finish the step in progress, write the final checkpoint, exit 0.
// train.resume_from_checkpoint=latest|DIR continues a run bit-identically; model.model_name_or_path
// starts from Hugging Face weights; train.export_hf_dir writes the final weights as a HF directory.
// The run itself is node/training_run.hpp (shared with the Python module); this file parses arguments.
// Under `mpirun -np N` (or srun) each process is one rank of the job (cluster/world.hpp, [cluster]).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cluster/world.hpp"
#include "config/node_config.hpp"
#include "node/plan_command.hpp"
#include "node/training_run.hpp"

// LeakSanitizer (asan preset): HDF5's global state is never freed because storage/checkpoint turns
// HDF5's exit handler off (H5dont_atexit; see storage/checkpoint/README.md), which LSan would report
// as a leak in every process that wrote or read a checkpoint. Inert in other builds.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name is LSan's interface
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5\n"; }

namespace {

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: megatrain train [--config-file=FILE.ini] [--section.key=value ...]\n"
               "       megatrain train --help         every key, its default and meaning\n"
               "       megatrain train --dump-config  the effective configuration\n"
               "       megatrain plan [same arguments] bytes per tier, what does not fit, predicted step time\n"
               "       megatrain plan --help          the planner's keys (plan.*) and hardware profiles\n");
}

int train(int argc, char** argv) {
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
  mt::actors::TrainingHooks hooks;
  if (world) {
    node.values.cluster.rank = world->rank();
    node.values.cluster.ranks = world->size();
    node.values.cluster.local_rank = world->local_rank();
    node.values.cluster.local_ranks = world->local_size();
    hooks.world = world.get();
  }
  const int status = mt::actors::run_training(node.values, hooks, &node).exit_status;
  // A failed rank ends the whole job at once: its peers would otherwise wait for it until their timeout.
  if (status != 0 && world && world->size() > 1) world->abort(status);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "plan") == 0)
    return mt::plan::run_plan_command(std::vector<std::string>(argv + 2, argv + argc));
  if (std::strcmp(argv[1], "train") != 0) {
    std::fprintf(stderr, "megatrain: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
  }
  return train(argc, argv);
}
