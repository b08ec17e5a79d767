// Is there a usable GPU? Asked through the CUDA runtime (cudart finds the driver at run time, so this
// answers "none" with the runtime's reason on a machine without a GPU or driver instead of failing to
// load). Plain C++: no CUDA headers leak to callers.
#pragma once
#include <string>

namespace mt::cuda {

struct DeviceProbe {
  int count = 0;       // usable devices
  std::string reason;  // why none, or the first device's name and compute capability
};

DeviceProbe probe_devices();

}  // namespace mt::cuda
