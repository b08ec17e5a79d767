// `megatrain plan`: the same arguments and keys as `megatrain train` (--config-file, --section.key=value)
// plus the [plan] keys; prints the bytes each tier holds, where each state lives, what does not fit and
// the key that would fix it, and the predicted step time on the chosen hardware profile. No CAF here.
#pragma once
#include <string>
#include <vector>

namespace mt::node {

// Returns the exit status: 0 the plan fits, 1 it does not (or bad input, printed to stderr), 0 for --help.
int run_plan_command(const std::vector<std::string>& args);

}  // namespace mt::node
