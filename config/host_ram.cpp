#include "config/host_ram.hpp"

#include <fstream>
#include <string>

namespace mt {

double mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024.0;
  return 0.0;
}

}  // namespace mt
