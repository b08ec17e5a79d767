#include "storage/offload/stage_file.hpp"

#include <fcntl.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cerrno>
#include <cstring>

#include "storage/host/moment_store.hpp"

namespace mt::offload {

namespace {

constexpr char kMagic[8] = {'M', 'T', 'M', 'O', 'M', 'N', 'T', '1'};

struct StageFileHeader {
  char magic[8];
  std::uint64_t stage;
  std::uint64_t payload_bytes;
  std::uint64_t blocks;
  std::uint64_t generation;
  std::uint64_t header_xxh3;  // over the header region with this field zero
  std::uint64_t reserved[2];
};
static_assert(sizeof(StageFileHeader) == 64);

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
std::size_t blocks_of(std::size_t bytes) { return (bytes + kChecksumBlock - 1) / kChecksumBlock; }

std::uint64_t header_checksum(std::byte* buf, std::size_t header_bytes) {
  auto* h = reinterpret_cast<StageFileHeader*>(buf);
  const std::uint64_t saved = h->header_xxh3;
  h->header_xxh3 = 0;
  const std::uint64_t x = XXH3_64bits(buf, header_bytes);
  h->header_xxh3 = saved;
  return x;
}

}  // namespace

StageFile::StageFile(std::string path, std::int64_t stage, std::size_t max_payload, bool direct)
    : path_(std::move(path)), stage_(stage), max_payload_(max_payload), header_bytes_(header_bytes_for(max_payload)) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
  if (fd_ < 0 && direct && errno == EINVAL) {  // a file system without O_DIRECT (tmpfs): the page cache
    direct = false;
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  }
  direct_ = direct;
  if (fd_ < 0)
    throw MomentStoreError("offload file " + path_ + ": cannot create" + (direct ? " with O_DIRECT" : "") + ": " +
                           std::strerror(errno));
}

std::size_t StageFile::header_bytes_for(std::size_t max_payload) {
  return round_up(sizeof(StageFileHeader) + blocks_of(max_payload) * sizeof(std::uint64_t), kDirectAlign);
}

StageFile::~StageFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::size_t StageFile::buffer_bytes() const { return header_bytes_ + round_up(max_payload_, kDirectAlign); }

std::size_t StageFile::write(std::byte* buf, std::size_t payload_bytes, std::uint64_t generation, IoPool& io) {
  if (payload_bytes > max_payload_) throw std::logic_error("StageFile::write: payload larger than planned");
  std::byte* payload = buf + header_bytes_;
  const std::size_t padded = round_up(payload_bytes, kDirectAlign);
  std::memset(payload + payload_bytes, 0, padded - payload_bytes);
  std::memset(buf, 0, header_bytes_);
  auto* h = reinterpret_cast<StageFileHeader*>(buf);
  std::memcpy(h->magic, kMagic, sizeof(kMagic));
  h->stage = static_cast<std::uint64_t>(stage_);
  h->payload_bytes = payload_bytes;
  h->blocks = blocks_of(payload_bytes);
  h->generation = generation;
  auto* sums = reinterpret_cast<std::uint64_t*>(buf + sizeof(StageFileHeader));
  for (std::size_t b = 0; b < h->blocks; ++b)
    sums[b] = XXH3_64bits(payload + b * kChecksumBlock, std::min(kChecksumBlock, payload_bytes - b * kChecksumBlock));
  h->header_xxh3 = header_checksum(buf, header_bytes_);
  io.transfer(fd_, path_, true, buf, header_bytes_ + padded, 0);
  return header_bytes_ + padded;
}

std::size_t StageFile::read(std::byte* buf, std::uint64_t generation, IoPool& io) {
  io.transfer(fd_, path_, false, buf, header_bytes_, 0);
  const auto* h = reinterpret_cast<const StageFileHeader*>(buf);
  const std::string where = "offload file " + path_ + ": ";
  if (std::memcmp(h->magic, kMagic, sizeof(kMagic)) != 0)
    throw MomentStoreError(where + "not a moment file (bad magic)");
  if (h->header_xxh3 != header_checksum(buf, header_bytes_))
    throw MomentStoreError(where + "header fails its xxh3 checksum (damaged)");
  if (h->stage != static_cast<std::uint64_t>(stage_) || h->payload_bytes > max_payload_ ||
      h->blocks != blocks_of(h->payload_bytes))
    throw MomentStoreError(where + "header describes another stage or size");
  if (h->generation != generation)
    throw MomentStoreError(where + "holds write generation " + std::to_string(h->generation) + ", expected " +
                           std::to_string(generation) + " (a write was lost)");
  const std::size_t payload_bytes = h->payload_bytes;
  std::byte* payload = buf + header_bytes_;
  io.transfer(fd_, path_, false, payload, round_up(payload_bytes, kDirectAlign), header_bytes_);
  const auto* sums = reinterpret_cast<const std::uint64_t*>(buf + sizeof(StageFileHeader));
  for (std::size_t b = 0; b < blocks_of(payload_bytes); ++b) {
    const std::size_t n = std::min(kChecksumBlock, payload_bytes - b * kChecksumBlock);
    if (XXH3_64bits(payload + b * kChecksumBlock, n) != sums[b])
      throw MomentStoreError(
          where + "block " + std::to_string(b) + " (file bytes " + std::to_string(header_bytes_ + b * kChecksumBlock) +
          ".." + std::to_string(header_bytes_ + b * kChecksumBlock + n) + ") fails its xxh3 checksum (damaged)");
  }
  return payload_bytes;
}

}  // namespace mt::offload
