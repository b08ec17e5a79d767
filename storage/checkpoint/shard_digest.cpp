#include "storage/checkpoint/shard_digest.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "storage/checkpoint/checkpoint_error.hpp"
#include "storage/checkpoint/checksum.hpp"

namespace mt::ckpt {

namespace {

// A read-only mapping of a whole file, unmapped on destruction.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& file) : path_(file.string()) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw CheckpointError(path_ + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    ::fstat(fd_, &st);
    size_ = static_cast<std::uint64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) {
        ::close(fd_);
        throw CheckpointError(path_ + ": cannot mmap: " + std::strerror(errno));
      }
      base_ = static_cast<const unsigned char*>(p);
      ::madvise(const_cast<unsigned char*>(base_), size_, MADV_SEQUENTIAL);
    }
  }
  ~MappedFile() {
    if (base_) ::munmap(const_cast<unsigned char*>(base_), size_);
    ::close(fd_);
  }
  std::uint64_t size() const { return size_; }
  const unsigned char* data() const { return base_; }
  // Drops pages already hashed from this process's resident set (they stay in the page cache).
  void release(std::uint64_t begin, std::uint64_t end) const {
    const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    begin = (begin + page - 1) / page * page;
    end = end / page * page;
    if (end > begin) ::madvise(const_cast<unsigned char*>(base_) + begin, end - begin, MADV_DONTNEED);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  const unsigned char* base_ = nullptr;
  std::uint64_t size_ = 0;
};

void sort_and_check(std::vector<DatasetExtent>& extents, std::uint64_t file_size, const std::string& path) {
  std::sort(extents.begin(), extents.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  std::uint64_t end = 0;
  for (const auto& e : extents) {
    if (e.offset < end || e.offset + e.bytes > file_size)
      throw CheckpointError(path + ": dataset " + e.name + " extent [" + std::to_string(e.offset) + ", +" +
                            std::to_string(e.bytes) + ") overlaps another or runs past the end of the file (damaged)");
    end = e.offset + e.bytes;
  }
}

std::uint64_t combine(std::uint64_t metadata, const std::vector<DatasetExtent>& sorted) {
  std::vector<std::uint64_t> seq;
  seq.push_back(metadata);
  for (const auto& e : sorted) seq.push_back(e.checksum);
  return checksum(seq.data(), seq.size() * sizeof(std::uint64_t));  // x86-64: already little-endian
}

// Hashes the bytes outside the extents; with `datasets`, also each extent, into datasets[i].
std::uint64_t scan(const MappedFile& f, const std::vector<DatasetExtent>& sorted,
                   std::vector<std::uint64_t>* datasets) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  std::uint64_t pos = 0;
  for (const auto& e : sorted) {
    XXH3_64bits_update(state.get(), f.data() + pos, e.offset - pos);
    if (datasets) {
      datasets->push_back(XXH3_64bits(f.data() + e.offset, e.bytes));
      f.release(e.offset, e.offset + e.bytes);
    }
    pos = e.offset + e.bytes;
  }
  XXH3_64bits_update(state.get(), f.data() + pos, f.size() - pos);
  return XXH3_64bits_digest(state.get());
}

}  // namespace

ShardDigest digest_written_shard(const std::filesystem::path& file, std::vector<DatasetExtent> extents) {
  const MappedFile f(file);
  sort_and_check(extents, f.size(), f.path());
  ShardDigest d;
  d.bytes = f.size();
  d.metadata_checksum = scan(f, extents, nullptr);
  d.checksum = combine(d.metadata_checksum, extents);
  return d;
}

nlohmann::json shard_manifest_entry(const std::string& file_name, const ShardDigest& d,
                                    const std::vector<DatasetExtent>& extents) {
  nlohmann::json datasets = nlohmann::json::array();
  for (const auto& e : extents) datasets.push_back({e.name, e.offset, e.bytes, checksum_hex(e.checksum)});
  return {{"file", file_name},
          {"bytes", d.bytes},
          {kChecksumAlgorithm, checksum_hex(d.checksum)},
          {"metadata_xxh3_64", checksum_hex(d.metadata_checksum)},
          {"datasets", datasets}};
}

void verify_shard(const std::filesystem::path& file, const nlohmann::json& entry) {
  const MappedFile f(file);
  const std::uint64_t want_bytes = entry.at("bytes").get<std::uint64_t>();
  if (f.size() != want_bytes)
    throw CheckpointError(f.path() + ": shard has " + std::to_string(f.size()) + " bytes, the manifest says " +
                          std::to_string(want_bytes) + " (truncated or damaged)");
  std::vector<DatasetExtent> extents;
  for (const auto& d : entry.at("datasets")) {
    DatasetExtent e;
    e.name = d.at(0).get<std::string>();
    e.offset = d.at(1).get<std::uint64_t>();
    e.bytes = d.at(2).get<std::uint64_t>();
    e.checksum = std::stoull(d.at(3).get<std::string>(), nullptr, 16);
    extents.push_back(std::move(e));
  }
  sort_and_check(extents, f.size(), f.path());
  std::vector<std::uint64_t> got;
  const std::uint64_t metadata = scan(f, extents, &got);
  for (std::size_t i = 0; i < extents.size(); ++i)
    if (got[i] != extents[i].checksum)
      throw CheckpointError(f.path() + ": dataset " + extents[i].name + " checksum " + checksum_hex(got[i]) +
                            " differs from the manifest's " + checksum_hex(extents[i].checksum) + " (damaged)");
  if (checksum_hex(metadata) != entry.at("metadata_xxh3_64").get<std::string>())
    throw CheckpointError(f.path() + ": HDF5 metadata checksum " + checksum_hex(metadata) +
                          " differs from the manifest's " + entry.at("metadata_xxh3_64").get<std::string>() +
                          " (damaged)");
  if (checksum_hex(combine(metadata, extents)) != entry.at(kChecksumAlgorithm).get<std::string>())
    throw CheckpointError(f.path() + ": shard checksum differs from the manifest's (damaged)");
}

}  // namespace mt::ckpt
