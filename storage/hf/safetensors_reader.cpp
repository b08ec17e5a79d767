#include "storage/hf/safetensors_reader.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "storage/hf/hf_config.hpp"

namespace mt::hf {

using nlohmann::json;

std::size_t SafetensorsEntry::numel() const {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;  // the safetensors library's own limit

SafetensorsEntry parse_entry(const std::string& name, const json& v, std::uint64_t data_size, const std::string& file) {
  auto fail = [&](const std::string& what) -> SafetensorsEntry {
    throw HfError(file + ": tensor '" + name + "': " + what);
  };
  if (!v.is_object()) return fail("header entry is not an object");
  SafetensorsEntry e;
  e.name = name;
  if (!v.contains("dtype") || !v["dtype"].is_string()) return fail("missing or non-string dtype");
  e.dtype = v["dtype"].get<std::string>();
  const std::size_t esize = safetensors_dtype_size(e.dtype);
  if (esize == 0) return fail("unknown dtype '" + e.dtype + "'");
  if (!v.contains("shape") || !v["shape"].is_array()) return fail("missing or non-array shape");
  std::uint64_t numel = 1;
  for (const auto& d : v["shape"]) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 0) return fail("bad shape " + v["shape"].dump());
    const auto dim = static_cast<std::uint64_t>(d.get<std::int64_t>());
    if (dim != 0 && numel > (std::uint64_t{1} << 62) / dim) return fail("shape " + v["shape"].dump() + " overflows");
    numel *= dim;
    e.shape.push_back(d.get<std::int64_t>());
  }
  const json& off = v.contains("data_offsets") ? v["data_offsets"] : json();
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    return fail("data_offsets must be [begin, end] with non-negative integers");
  e.begin = off[0].get<std::uint64_t>();
  e.end = off[1].get<std::uint64_t>();
  if (e.begin > e.end)
    return fail("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] are reversed");
  if (e.end > data_size)
    return fail("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                "] run past the end of the data (" + std::to_string(data_size) + " bytes)");
  if (e.end - e.begin != numel * esize)
    return fail("data_offsets span " + std::to_string(e.end - e.begin) + " bytes but dtype " + e.dtype + " and shape " +
                shape_string(e.shape) + " need " + std::to_string(numel * esize));
  return e;
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::filesystem::path& file) : path_(file) {
  const std::string f = file.string();
  fd_ = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw HfError(f + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    ::close(fd_);
    throw HfError(f + ": cannot stat: " + std::strerror(errno));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  auto fail = [&](const std::string& what) {
    if (base_) ::munmap(base_, size_);
    ::close(fd_);
    throw HfError(f + ": " + what);
  };
  if (size_ < 8)
    fail("not a safetensors file (" + std::to_string(size_) + " bytes, shorter than the 8-byte header length)");
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) fail(std::string("cannot mmap: ") + std::strerror(errno));
  base_ = static_cast<unsigned char*>(p);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base_[i];  // little-endian
  if (header_len > kMaxHeaderBytes || header_len > size_ - 8)
    fail("header length " + std::to_string(header_len) + " exceeds the file size " + std::to_string(size_) +
         " or 100 MB");
  data_start_ = 8 + static_cast<std::size_t>(header_len);
  const std::uint64_t data_size = size_ - data_start_;
  json header;
  try {
    header = json::parse(base_ + 8, base_ + data_start_);
  } catch (const json::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header is not a JSON object");
  try {
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        if (!value.is_object()) fail("__metadata__ is not an object");
        for (const auto& [k, v] : value.items()) {
          if (!v.is_string()) fail("__metadata__ value for '" + k + "' is not a string");
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      entries_.push_back(parse_entry(name, value, data_size, f));
    }
  } catch (const HfError&) {
    ::munmap(base_, size_);
    ::close(fd_);
    throw;
  }
  // No two tensors may share bytes: a header that overlaps them lies about at least one.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->begin < b->begin || (a->begin == b->begin && a->end < b->end); });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const auto *prev = by_offset[i - 1], *cur = by_offset[i];
    if (cur->begin < prev->end)
      fail("tensors '" + prev->name + "' [" + std::to_string(prev->begin) + ", " + std::to_string(prev->end) +
           ") and '" + cur->name + "' [" + std::to_string(cur->begin) + ", " + std::to_string(cur->end) + ") overlap");
  }
  for (std::size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
  ::madvise(base_, size_, MADV_SEQUENTIAL);
}

SafetensorsReader::~SafetensorsReader() {
  if (base_) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const SafetensorsEntry& SafetensorsReader::checked(const std::string& name,
                                                   const std::vector<std::int64_t>& expected_shape, DType* dt) const {
  const auto* e = find(name);
  if (!e) throw HfError(path_.string() + ": no tensor '" + name + "'");
  const auto t = parse_dtype(e->dtype);
  if (!t)
    throw HfError(path_.string() + ": tensor '" + name + "' has dtype " + e->dtype + " (supported: F32, BF16, F16)");
  if (e->shape != expected_shape)
    throw HfError(path_.string() + ": tensor '" + name + "' has shape " + shape_string(e->shape) + ", expected " +
                  shape_string(expected_shape));
  *dt = *t;
  return *e;
}

// Drops the tensor's pages from this process's resident set (they stay in the page cache), so reading a
// whole model never holds a second copy of it in RSS.
void SafetensorsReader::release(const SafetensorsEntry& e) const {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t lo = data_start_ + e.begin, hi = data_start_ + e.end;
  lo = (lo + page - 1) / page * page;
  hi = hi / page * page;
  if (hi > lo) ::madvise(base_ + lo, hi - lo, MADV_DONTNEED);
}

void SafetensorsReader::read_f32(const std::string& name, const std::vector<std::int64_t>& expected_shape,
                                 float* dst) const {
  DType dt;
  const auto& e = checked(name, expected_shape, &dt);
  to_f32(dt, data(e), dst, e.numel());
  release(e);
}

void SafetensorsReader::read_f32_range(const std::string& name, const std::vector<std::int64_t>& expected_shape,
                                       std::size_t first, std::size_t count, float* dst) const {
  DType dt;
  const auto& e = checked(name, expected_shape, &dt);
  if (first > e.numel() || count > e.numel() - first)
    throw HfError(path_.string() + ": tensor '" + name + "' has " + std::to_string(e.numel()) + " elements, elements " +
                  std::to_string(first) + " + " + std::to_string(count) + " asked");
  to_f32(dt, data(e) + first * dtype_size(dt), dst, count);
  release(e);
}

void SafetensorsReader::read_u8_range(const std::string& name, const std::vector<std::int64_t>& expected_shape,
                                      std::size_t first, std::size_t count, std::uint8_t* dst) const {
  const auto* e = find(name);
  if (!e) throw HfError(path_.string() + ": no tensor '" + name + "'");
  if (e->dtype != "U8")
    throw HfError(path_.string() + ": tensor '" + name + "' has dtype " + e->dtype + ", expected U8");
  if (e->shape != expected_shape)
    throw HfError(path_.string() + ": tensor '" + name + "' has shape " + shape_string(e->shape) + ", expected " +
                  shape_string(expected_shape));
  if (first > e->numel() || count > e->numel() - first)
    throw HfError(path_.string() + ": tensor '" + name + "' has " + std::to_string(e->numel()) + " bytes, bytes " +
                  std::to_string(first) + " + " + std::to_string(count) + " asked");
  std::memcpy(dst, data(*e) + first, count);
}

void SafetensorsReader::read_f32_transposed(const std::string& name, const std::vector<std::int64_t>& expected_shape,
                                            float* dst) const {
  DType dt;
  const auto& e = checked(name, expected_shape, &dt);
  if (e.shape.size() != 2) throw HfError(path_.string() + ": tensor '" + name + "' is not 2-D, cannot transpose");
  const auto rows = static_cast<std::size_t>(e.shape[0]), cols = static_cast<std::size_t>(e.shape[1]);
  const std::size_t es = dtype_size(dt);
  const unsigned char* src = data(e);
  // Row by row: convert one file row, scatter it into a destination column (blocks keep it cache-friendly).
  constexpr std::size_t kBlock = 64;
  float row[kBlock];
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c0 = 0; c0 < cols; c0 += kBlock) {
      const std::size_t n = std::min(kBlock, cols - c0);
      to_f32(dt, src + (r * cols + c0) * es, row, n);
      for (std::size_t c = 0; c < n; ++c) dst[(c0 + c) * rows + r] = row[c];
    }
  release(e);
}

}  // namespace mt::hf
