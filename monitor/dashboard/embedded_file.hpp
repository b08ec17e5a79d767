// The table of dashboard files that embed.cmake generates at build time (internal to the accessor).
#pragma once
#include <cstddef>

namespace mt::monitor::detail {

struct EmbeddedFile {
  const char* name;           // file name in monitor/dashboard/, e.g. "index.html"
  const unsigned char* data;  // its bytes (followed by a 0 that is not counted in size)
  std::size_t size;
};

extern const EmbeddedFile kEmbeddedFiles[];
extern const std::size_t kEmbeddedFileCount;

}  // namespace mt::monitor::detail
