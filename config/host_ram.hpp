// This machine's host RAM as the fit checks count it: what the kernel says it can hand out now.
#pragma once

namespace mt {

// MemAvailable from /proc/meminfo, bytes (0 when unknown).
double mem_available_bytes();

}  // namespace mt
