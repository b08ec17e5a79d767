#include "storage/checkpoint/checksum.hpp"

#include <cstdio>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace mt::ckpt {

std::uint64_t checksum(const void* data, std::size_t bytes) { return XXH3_64bits(data, bytes); }

std::string checksum_hex(std::uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace mt::ckpt
