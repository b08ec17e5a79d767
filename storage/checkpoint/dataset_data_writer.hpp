// Writes the datasets' raw bytes of one shard file at the offsets HDF5 allocated for them, beside
// HDF5 (which then writes only the metadata). Why: a checkpoint is written while training runs on the
// same cores, and an ordinary write() costs CPU twice, once copying into the page cache and again in
// the kernel's writeback threads (measured on a 2-core VM: 45 ms of CPU per 180 MiB buffered against
// 9 ms with O_DIRECT). So the page-aligned body of each dataset goes with O_DIRECT straight from the
// caller's buffer (the host tile) in one large call, and the unaligned rest (the last partial page, a
// buffer the device cannot DMA from, a file system without O_DIRECT such as tmpfs) through an ordinary
// descriptor. Direct ranges start and end on page boundaries, so no page is written both ways.
//
// Nothing here is durable until the caller fsyncs the file (O_DIRECT skips the page cache, not the
// device's cache or the file's metadata).
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace mt::ckpt {

class DatasetDataWriter {
 public:
  // Opens `file` (already created by HDF5) twice: buffered, and with O_DIRECT when `try_direct` and
  // the file system allows it. Throws CheckpointError naming the file when it cannot be opened.
  DatasetDataWriter(const std::filesystem::path& file, bool try_direct);
  ~DatasetDataWriter();
  DatasetDataWriter(const DatasetDataWriter&) = delete;
  DatasetDataWriter& operator=(const DatasetDataWriter&) = delete;

  // Writes bytes [data, data + bytes) at file offset `offset`, all of it before returning. Throws
  // CheckpointError naming the file and the errno (disk full, I/O error, file too large).
  void write(std::uint64_t offset, const void* data, std::size_t bytes);

  // Asks the kernel to start writing the buffered part back now (it is small; the final fsync then
  // waits for little).
  void start_writeback();

  bool direct() const { return direct_fd_ >= 0; }
  std::uint64_t direct_bytes() const { return direct_bytes_; }      // written with O_DIRECT
  std::uint64_t buffered_bytes() const { return buffered_bytes_; }  // written through the page cache

 private:
  void write_all(int fd, std::uint64_t offset, const char* data, std::size_t bytes);

  std::filesystem::path path_;
  int buffered_fd_ = -1;
  int direct_fd_ = -1;
  // The buffer alignment O_DIRECT needs here: 512 until a write says otherwise (EINVAL), then 4096.
  std::size_t memory_alignment_ = 512;
  std::uint64_t direct_bytes_ = 0;
  std::uint64_t buffered_bytes_ = 0;
};

}  // namespace mt::ckpt
