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
// The run itself is node/training_run.hpp (shared with the Python module); node_main.cpp parses arguments.
// Under `mpirun -np N` (or srun) each process is one rank of the job (cluster/world.hpp, [cluster]).
#include "node/node_main.hpp"

// LeakSanitizer (asan preset): HDF5's global state is never freed because storage/checkpoint turns
// HDF5's exit handler off (H5dont_atexit; see storage/checkpoint/README.md), which LSan would report
// as a leak in every process that wrote or read a checkpoint. Inert in other builds.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name is LSan's interface
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5\n"; }

int main(int argc, char** argv) { return mt::node::node_main(argc, argv); }
