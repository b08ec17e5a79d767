// Checksums: XXH3-64 (libxxhash). Chosen for speed: ~20-30 GB/s on one AVX2 core, far above any disk,
// so checksumming never shows up next to the write; it detects corruption (not tampering). Stored as
// 16 lowercase hex digits in JSON and as an unsigned 64-bit attribute in HDF5.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mt::ckpt {

inline constexpr const char* kChecksumAlgorithm = "xxh3_64";

std::uint64_t checksum(const void* data, std::size_t bytes);
std::string checksum_hex(std::uint64_t h);

}  // namespace mt::ckpt
