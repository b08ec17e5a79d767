#include "storage/hf/safetensors_writer.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "storage/hf/file_util.hpp"
#include "storage/hf/hf_config.hpp"

namespace mt::hf {

using nlohmann::json;

namespace {

std::size_t numel_of(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

constexpr std::size_t kScratchBytes = 4u << 20;

}  // namespace

std::uint64_t parse_size(const std::string& text) {
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw HfError("bad size '" + text + "' (expected e.g. 2GB, 500MB, 1GiB)");
  }
  const std::string unit = text.substr(pos);
  double mult = 0;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "KB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  else if (unit == "KiB")
    mult = 1024.0;
  else if (unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  if (mult == 0 || !(value > 0)) throw HfError("bad size '" + text + "' (expected e.g. 2GB, 500MB, 1GiB)");
  return static_cast<std::uint64_t>(value * mult);
}

SafetensorsModelWriter::SafetensorsModelWriter(std::filesystem::path dir, std::vector<PlannedTensor> plan, DType dtype,
                                               std::uint64_t max_shard_bytes)
    : dir_(std::move(dir)), plan_(std::move(plan)), dtype_(dtype), scratch_(kScratchBytes) {
  // Greedy in plan order, as transformers shards: a new file when the next tensor would not fit.
  std::uint64_t in_shard = 0;
  for (std::size_t i = 0; i < plan_.size(); ++i) {
    const std::uint64_t bytes = numel_of(plan_[i].shape) * dtype_size(dtype_);
    if (shard_first_.empty() || (in_shard > 0 && in_shard + bytes > max_shard_bytes)) {
      shard_first_.push_back(i);
      in_shard = 0;
    }
    in_shard += bytes;
    shard_of_.push_back(shard_first_.size() - 1);
  }
  if (plan_.empty()) throw HfError(dir_.string() + ": nothing to write (empty tensor plan)");
  std::filesystem::create_directories(dir_);
}

SafetensorsModelWriter::~SafetensorsModelWriter() {
  if (file_) std::fclose(file_);
}

std::string SafetensorsModelWriter::shard_file_name(std::size_t shard) const {
  if (shard_first_.size() == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", shard + 1, shard_first_.size());
  return buf;
}

void SafetensorsModelWriter::put(const void* bytes, std::size_t n) {
  if (std::fwrite(bytes, 1, n, file_) != n)
    throw HfError(file_path_.string() + ": write failed: " + std::strerror(errno));
}

void SafetensorsModelWriter::open_shard(std::size_t shard) {
  const std::size_t first = shard_first_[shard];
  const std::size_t last = shard + 1 < shard_first_.size() ? shard_first_[shard + 1] : plan_.size();
  json header = json::object();
  std::uint64_t offset = 0;
  for (std::size_t i = first; i < last; ++i) {
    const std::uint64_t bytes = numel_of(plan_[i].shape) * dtype_size(dtype_);
    header[plan_[i].name] = {
        {"dtype", dtype_name(dtype_)}, {"shape", plan_[i].shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  file_path_ = dir_ / shard_file_name(shard);
  file_ = std::fopen(file_path_.c_str(), "wb");
  if (!file_) throw HfError(file_path_.string() + ": cannot create: " + std::strerror(errno));
  std::setvbuf(file_, nullptr, _IOFBF, 1u << 20);
  unsigned char len[8];
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  put(len, 8);
  put(text.data(), text.size());
  open_shard_ = shard;
}

void SafetensorsModelWriter::close_shard() {
  if (!file_) return;
  const bool ok = std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  const int err = errno;
  std::fclose(file_);
  file_ = nullptr;
  if (!ok) throw HfError(file_path_.string() + ": write failed: " + std::strerror(err));
}

const PlannedTensor& SafetensorsModelWriter::next(const std::string& name) {
  if (next_ >= plan_.size()) throw HfError(dir_.string() + ": tensor '" + name + "' written past the end of the plan");
  const auto& t = plan_[next_];
  if (t.name != name)
    throw HfError(dir_.string() + ": tensor '" + name + "' written out of order, expected '" + t.name + "'");
  if (open_shard_ != shard_of_[next_]) {
    close_shard();
    open_shard(shard_of_[next_]);
  }
  ++next_;
  return t;
}

void SafetensorsModelWriter::write(const std::string& name, const float* data) {
  const auto& t = next(name);
  const std::size_t n = numel_of(t.shape);
  if (dtype_ == DType::f32) return put(data, n * 4);
  const std::size_t chunk = scratch_.size() / dtype_size(dtype_);
  for (std::size_t i = 0; i < n; i += chunk) {
    const std::size_t m = std::min(chunk, n - i);
    from_f32(dtype_, data + i, scratch_.data(), m);
    put(scratch_.data(), m * dtype_size(dtype_));
  }
}

void SafetensorsModelWriter::write_transposed(const std::string& name, const float* data) {
  const auto& t = next(name);
  if (t.shape.size() != 2) throw HfError(dir_.string() + ": tensor '" + name + "' is not 2-D, cannot transpose");
  const auto rows = static_cast<std::size_t>(t.shape[0]), cols = static_cast<std::size_t>(t.shape[1]);
  // File row r is source column r: gather it, convert, write.
  std::vector<float> row(cols);
  const std::size_t es = dtype_size(dtype_);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) row[c] = data[c * rows + r];
    from_f32(dtype_, row.data(), scratch_.data(), cols);
    put(scratch_.data(), cols * es);
  }
}

void SafetensorsModelWriter::write_rows(const std::string& name, const std::function<void(std::size_t, float*)>& fill) {
  const auto& t = next(name);
  const std::size_t n = numel_of(t.shape), cols = t.shape.empty() ? 1 : static_cast<std::size_t>(t.shape.back());
  const std::size_t rows = cols ? n / cols : 0, es = dtype_size(dtype_);
  std::vector<float> row(cols);
  std::vector<unsigned char> bytes(cols * es);
  for (std::size_t r = 0; r < rows; ++r) {
    fill(r, row.data());
    from_f32(dtype_, row.data(), bytes.data(), cols);
    put(bytes.data(), cols * es);
  }
}

void SafetensorsModelWriter::finish() {
  if (next_ != plan_.size())
    throw HfError(dir_.string() + ": finish() after " + std::to_string(next_) + " of " + std::to_string(plan_.size()) +
                  " tensors (next: '" + plan_[next_].name + "')");
  close_shard();
  if (shard_first_.size() > 1) {
    json index;
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < plan_.size(); ++i) {
      total += numel_of(plan_[i].shape) * dtype_size(dtype_);
      index["weight_map"][plan_[i].name] = shard_file_name(shard_of_[i]);
    }
    index["metadata"] = {{"total_size", total}};
    write_text_atomically(dir_ / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  finished_ = true;
}

}  // namespace mt::hf
