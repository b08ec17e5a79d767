// The one exception type of the checkpoint library: damaged or missing files, failed writes (disk
// full), bad arguments. The message names the file (and the dataset where there is one).
#pragma once
#include <stdexcept>

namespace mt::ckpt {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace mt::ckpt
