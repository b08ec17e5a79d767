// The node binary's whole command line as a library call: `megatrain train ...` and `megatrain plan ...`
// (node/main.cpp is this and nothing else). `customize` adjusts a training run's parsed configuration
// (what is not a key: a modelled link, fault injection; validated again after it) and its hooks before
// it starts: the binary passes none; a test harness adds its own (tests/actors/node_with_faults.cpp).
#pragma once
#include <functional>

#include "node/training_run.hpp"

namespace mt::node {

// Returns the process's exit status: 0 done, 1 a failed run or bad input, 2 a bad command line.
using Customize = std::function<void(TrainConfig&, TrainingHooks&)>;
int node_main(int argc, char** argv, const Customize& customize = {});

}  // namespace mt::node
