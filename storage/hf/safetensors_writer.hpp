// Writes a model's tensors as safetensors, streamed: the caller hands over one tensor at a time (fp32,
// converted here to the file dtype), in the order of the plan given up front (a safetensors header
// must list every tensor before the data). Past max_shard_bytes the tensors go to several files
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json, as transformers writes them;
// otherwise one model.safetensors.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "storage/hf/dtype.hpp"

namespace mt::hf {

struct PlannedTensor {
  std::string name;                 // full Hugging Face name
  std::vector<std::int64_t> shape;  // shape in the file
};

class SafetensorsModelWriter {
 public:
  SafetensorsModelWriter(std::filesystem::path dir, std::vector<PlannedTensor> plan, DType dtype,
                         std::uint64_t max_shard_bytes);
  ~SafetensorsModelWriter();  // closes an unfinished file (the output is then incomplete)
  SafetensorsModelWriter(const SafetensorsModelWriter&) = delete;
  SafetensorsModelWriter& operator=(const SafetensorsModelWriter&) = delete;

  // The next planned tensor, `name` must match it; data holds numel floats in the file's order.
  void write(const std::string& name, const float* data);
  // The next planned tensor, a 2-D [rows, cols] in the file, from `data` stored [cols, rows].
  void write_transposed(const std::string& name, const float* data);
  // The next planned tensor, row by row: fill(r, row) writes row r (the last dimension's length in
  // floats) of the tensor in the file's order (gpt-oss's fused experts, assembled from per-expert ones).
  void write_rows(const std::string& name, const std::function<void(std::size_t, float*)>& fill);
  // After the last tensor: fsyncs the shards and writes the index when there are several.
  void finish();

  std::size_t num_shards() const { return shard_first_.size(); }
  std::string shard_file_name(std::size_t shard) const;

 private:
  const PlannedTensor& next(const std::string& name);
  void open_shard(std::size_t shard);
  void close_shard();
  void put(const void* bytes, std::size_t n);

  std::filesystem::path dir_;
  std::vector<PlannedTensor> plan_;
  DType dtype_;
  std::vector<std::size_t> shard_first_;  // index of each shard's first tensor in plan_
  std::vector<std::size_t> shard_of_;     // shard of each tensor
  std::size_t next_ = 0;
  std::size_t open_shard_ = SIZE_MAX;
  std::FILE* file_ = nullptr;
  std::filesystem::path file_path_;
  std::vector<unsigned char> scratch_;  // conversion / transposition buffer (a few MiB)
  bool finished_ = false;
};

// Parses "2GB", "500MB", "10KiB", "123" (bytes) as transformers' max_shard_size does (GB = 1e9, GiB = 2^30).
std::uint64_t parse_size(const std::string& text);

}  // namespace mt::hf
