// megatrain-with-faults: the node binary with checkpoint faults planted from the environment, for the
// tests that kill or fail a run in the middle of a checkpoint write. The shipped `megatrain` reads none
// of these variables (node_main.hpp: its hooks are the binary's own).
//   MEGATRAIN_TEST_CKPT_STALL=STEP:STAGE:SECONDS  sleeps inside the write of that stage of that checkpoint
//   MEGATRAIN_TEST_CKPT_FAIL=STEP:STAGE           fails the write of that stage of that checkpoint (a full
//                                                 disk on one rank of several)
#include <cstdio>
#include <cstdlib>

#include "node/node_main.hpp"

// NOLINTNEXTLINE(bugprone-reserved-identifier): LeakSanitizer's interface (see node/main.cpp)
extern "C" const char* __lsan_default_suppressions() { return "leak:libhdf5\n"; }

namespace {

void plant_faults(mt::actors::CheckpointJob& cj) {
  long long step = -1, stage = -1;
  double seconds = 0;
  const char* stall = std::getenv("MEGATRAIN_TEST_CKPT_STALL");
  if (stall != nullptr && std::sscanf(stall, "%lld:%lld:%lf", &step, &stage, &seconds) == 3) {
    cj.stall_step = step;
    cj.stall_stage = stage;
    cj.stall_seconds = seconds;
  }
  const char* fail = std::getenv("MEGATRAIN_TEST_CKPT_FAIL");
  if (fail != nullptr && std::sscanf(fail, "%lld:%lld", &step, &stage) == 2) {
    cj.fail_step = step;
    cj.fail_stage = stage;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return mt::node::node_main(argc, argv, [](mt::node::TrainingHooks& hooks) { hooks.checkpoint_job = plant_faults; });
}
