// One stage's moments on the NVMe tier: a file rewritten in place at each update (working state, not
// a checkpoint: it is never read by a later process). Layout, every part a multiple of 4096 bytes so
// the whole file moves with O_DIRECT in one sequential transfer:
//
//   [ header region: StageFileHeader, then one XXH3-64 per payload block ][ payload, zero-padded ]
//
// The payload is the stage's encoded moments (moment_codec.hpp), checksummed per block (1 MiB), so a
// damaged byte is found on read and named by block; the header checksums itself and carries the
// stage, the payload size and a write generation (a stale file, e.g. a write that never reached the
// disk, is refused too). The caller's buffer holds header region + payload contiguously.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "storage/offload/io_pool.hpp"

namespace mt::offload {

inline constexpr std::size_t kChecksumBlock = std::size_t{1} << 20;

class StageFile {
 public:
  // Creates (truncates) `path`; max_payload: the largest payload it will hold. direct: O_DIRECT (on a
  // file system without it, such as tmpfs, the page cache: direct() says which).
  StageFile(std::string path, std::int64_t stage, std::size_t max_payload, bool direct);
  ~StageFile();
  StageFile(const StageFile&) = delete;
  StageFile& operator=(const StageFile&) = delete;

  // The header region's bytes for a file whose largest payload is max_payload.
  static std::size_t header_bytes_for(std::size_t max_payload);
  // Bytes of the header region: the payload starts there in the caller's buffer.
  std::size_t header_bytes() const { return header_bytes_; }
  // Buffer size a write or read needs (header region + largest payload, rounded up to 4096).
  std::size_t buffer_bytes() const;
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }

  // buf: header_bytes() + payload (payload_bytes of it filled by the caller), 4096-aligned. Fills
  // the header and the checksums, zero-pads, writes; returns the bytes written.
  std::size_t write(std::byte* buf, std::size_t payload_bytes, std::uint64_t generation, IoPool& io);
  // Reads header and payload into buf, verifies everything (MomentStoreError naming the file and what
  // is wrong); returns the payload bytes (at buf + header_bytes()).
  std::size_t read(std::byte* buf, std::uint64_t generation, IoPool& io);

 private:
  std::string path_;
  std::int64_t stage_;
  std::size_t max_payload_;
  std::size_t header_bytes_;
  int fd_ = -1;
  bool direct_ = false;
};

}  // namespace mt::offload
