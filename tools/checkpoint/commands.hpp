// The subcommands of megatrain-ckpt (see main.cpp for the usage text).
#pragma once
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace mt::tools {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// positional[0] is the command; returns the exit status. Throws UsageError for bad arguments and
// anything else (CheckpointError, HfError) for failures.
int run_command(const std::vector<std::string>& positional, const std::map<std::string, std::string>& flags);

}  // namespace mt::tools
