// megatrain-with-faults: the node binary with the engine's test hooks reachable, for the tests that drive a
// whole run as a process. The shipped `megatrain` has none of them (no key, no variable reaches them).
// Command line: the node binary's, plus these arguments (taken out before the node parses the rest):
//   --test.copy_bandwidth_gbps=X     a modelled link on the CPU backend, X GB/s per direction (its copies
//                                    paced, the arena no longer host memory: DeviceSection::copy_bandwidth_gbps)
//   --test.allow_fault_injection     the monitor accepts POST /control/fault?actor=NAME
// Environment:
//   MEGATRAIN_TEST_CKPT_STALL=STEP:STAGE:SECONDS  sleeps inside the write of that stage of that checkpoint
//   MEGATRAIN_TEST_CKPT_FAIL=STEP:STAGE           fails the write of that stage of that checkpoint (a full
//                                                 disk on one rank of several)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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

struct TestArguments {
  double copy_bandwidth_gbps = 0.0;
  bool allow_fault_injection = false;
};

// Takes the --test.* arguments out of argv (the node would refuse them as unknown keys). Returns false,
// naming the argument, for one it does not know or a bad value.
bool take_test_arguments(std::vector<char*>& args, TestArguments& out) {
  std::vector<char*> rest;
  for (char* a : args) {
    const std::string arg = a;
    if (arg.rfind("--test.", 0) != 0) {
      rest.push_back(a);
      continue;
    }
    const std::string bandwidth = "--test.copy_bandwidth_gbps=";
    char* end = nullptr;
    if (arg.rfind(bandwidth, 0) == 0) {
      out.copy_bandwidth_gbps = std::strtod(arg.c_str() + bandwidth.size(), &end);
      if (*end != '\0' || arg.size() == bandwidth.size()) {
        std::fprintf(stderr, "megatrain-with-faults: %s is not a number\n", arg.c_str());
        return false;
      }
    } else if (arg == "--test.allow_fault_injection" || arg == "--test.allow_fault_injection=true") {
      out.allow_fault_injection = true;
    } else {
      std::fprintf(stderr, "megatrain-with-faults: unknown test argument %s\n", arg.c_str());
      return false;
    }
  }
  args = std::move(rest);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  TestArguments test;
  if (!take_test_arguments(args, test)) return 2;
  args.push_back(nullptr);
  return mt::node::node_main(static_cast<int>(args.size()) - 1, args.data(),
                             [&test](mt::TrainConfig& cfg, mt::node::TrainingHooks& hooks) {
                               cfg.device.copy_bandwidth_gbps = test.copy_bandwidth_gbps;
                               cfg.monitor.allow_fault_injection = test.allow_fault_injection;
                               hooks.checkpoint_job = plant_faults;
                             });
}
