// Reads one .safetensors file: an 8-byte little-endian header length, a JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the data.
// The file is memory-mapped; opening validates the whole header (JSON, dtypes, shapes, every tensor's
// byte range inside the data and matching its shape, no two ranges overlapping), so a lying header is
// an error naming the tensor and the file before any tensor is read.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "storage/hf/dtype.hpp"

namespace mt::hf {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // safetensors spelling ("F32", "BF16", "I64", ...)
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte range relative to the data section
  std::size_t numel() const;
};

class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::filesystem::path& file);  // throws HfError
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in file order
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Converts the tensor to fp32 into dst (numel floats). Throws HfError naming the tensor and file when
  // it is absent, its dtype is not F32/BF16/F16, or its shape differs from `expected_shape`.
  void read_f32(const std::string& name, const std::vector<std::int64_t>& expected_shape, float* dst) const;
  // Elements [first, first + count) of the tensor (row-major) into dst: one expert's matrix of a fused
  // [experts, ...] tensor (transformers v5's Mixtral gate_up_proj / down_proj).
  void read_f32_range(const std::string& name, const std::vector<std::int64_t>& expected_shape, std::size_t first,
                      std::size_t count, float* dst) const;
  // Same, transposing a 2-D [rows, cols] tensor in the file into [cols, rows] in dst (GPT-2 Conv1D).
  // expected_shape is the shape in the file.
  void read_f32_transposed(const std::string& name, const std::vector<std::int64_t>& expected_shape, float* dst) const;
  // Bytes [first, first + count) of a U8 tensor (gpt-oss's MXFP4 blocks and scales), as they are.
  void read_u8_range(const std::string& name, const std::vector<std::int64_t>& expected_shape, std::size_t first,
                     std::size_t count, std::uint8_t* dst) const;

 private:
  const SafetensorsEntry& checked(const std::string& name, const std::vector<std::int64_t>& expected_shape,
                                  DType* dt) const;
  const unsigned char* data(const SafetensorsEntry& e) const { return base_ + data_start_ + e.begin; }
  void release(const SafetensorsEntry& e) const;

  std::filesystem::path path_;
  int fd_ = -1;
  unsigned char* base_ = nullptr;
  std::size_t size_ = 0;
  std::size_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

std::string shape_string(const std::vector<std::int64_t>& shape);  // "[4, 8]"

}  // namespace mt::hf
