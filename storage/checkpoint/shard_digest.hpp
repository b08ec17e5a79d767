// The checksum of one HDF5 shard without reading its data back after writing.
//
// A shard file is partitioned into regions: the extent of every dataset (contiguous fp32 bytes that
// HDF5 copies verbatim from the caller's buffer) and the bytes between them (HDF5's metadata,
// alignment padding). The writer already knows each dataset's XXH3-64 (computed from the buffer it
// wrote), so after closing the file it only reads the few metadata bytes. The shard's checksum is
// XXH3-64 over the little-endian uint64 sequence [metadata checksum, dataset checksums in file order];
// every byte of the file is covered by exactly one region, so a flipped byte anywhere is detected, and
// the error can name the dataset. The manifest lists the extents (name, offset, bytes, checksum).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::ckpt {

struct DatasetExtent {
  std::string name;          // "stage_00003/params/mlp.up_proj.weight"
  std::uint64_t offset = 0;  // in the file
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;
};

struct ShardDigest {
  std::uint64_t bytes = 0;              // file size
  std::uint64_t metadata_checksum = 0;  // XXH3-64 of every byte outside the datasets, in file order
  std::uint64_t checksum = 0;           // the shard's checksum (see above)
};

// Writer side: trusts the extents' checksums, reads only the bytes between them.
ShardDigest digest_written_shard(const std::filesystem::path& file, std::vector<DatasetExtent> extents);

// The manifest's entry for a shard ({"file", "bytes", "xxh3_64", "metadata_xxh3_64", "datasets"}).
nlohmann::json shard_manifest_entry(const std::string& file_name, const ShardDigest& d,
                                    const std::vector<DatasetExtent>& extents);

// Reader side: reads every byte once (mmap) and checks size, every dataset, the metadata and the
// whole; CheckpointError naming the file (and the dataset) on any mismatch.
void verify_shard(const std::filesystem::path& file, const nlohmann::json& entry);

}  // namespace mt::ckpt
