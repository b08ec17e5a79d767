#include "data/shard.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mt::data {

namespace {

std::string errno_text() { return std::strerror(errno); }

int32_t read_i32(const unsigned char* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

std::string stem_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path;
  return path.substr(0, dot);
}

// A file written under a temporary name and renamed onto its final name by commit().
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)) {
    tmp_ = path_ + ".tmp." + std::to_string(::getpid());
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) throw DataError(tmp_ + ": cannot create: " + errno_text());
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (f_) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
  }
  void write(const void* p, std::size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) throw DataError(tmp_ + ": write failed: " + errno_text());
  }
  void write_at(long offset, const void* p, std::size_t n) {
    if (std::fseek(f_, offset, SEEK_SET) != 0) throw DataError(tmp_ + ": seek failed: " + errno_text());
    write(p, n);
  }
  void commit() {
    if (std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0) throw DataError(tmp_ + ": flush failed: " + errno_text());
    const int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) {
      std::remove(tmp_.c_str());
      throw DataError(tmp_ + ": close failed: " + errno_text());
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const std::string e = errno_text();
      std::remove(tmp_.c_str());
      throw DataError(path_ + ": cannot rename " + tmp_ + " onto it: " + e);
    }
  }

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
};

void make_header(int32_t magic, std::size_t n, int32_t* h) {
  std::memset(h, 0, kShardHeaderBytes);
  h[0] = magic;
  h[1] = kShardVersion;
  h[2] = static_cast<int32_t>(n);
}

void check_count(const std::string& path, std::size_t n) {
  if (n > std::size_t(INT32_MAX))
    throw DataError(path + ": " + std::to_string(n) + " tokens do not fit the llm.c header (int32 count)");
}

// Validates an llm.c-layout file (shard or mask); returns the element count.
std::size_t check_llmc(const MappedFile& f, int32_t magic_a, int32_t magic_b, int* width) {
  const std::string& p = f.path();
  if (f.size() < kShardHeaderBytes)
    throw DataError(p + ": truncated header: " + std::to_string(f.size()) + " bytes, need " +
                    std::to_string(kShardHeaderBytes));
  const int32_t magic = read_i32(f.data()), version = read_i32(f.data() + 4), count = read_i32(f.data() + 8);
  if (magic != magic_a && magic != magic_b)
    throw DataError(p + ": wrong magic " + std::to_string(magic) + " at offset 0 (expected " + std::to_string(magic_a) +
                    (magic_b != magic_a ? " or " + std::to_string(magic_b) : "") + ")");
  if (version != kShardVersion)
    throw DataError(p + ": unsupported version " + std::to_string(version) + " at offset 4 (expected 1)");
  if (count < 0) throw DataError(p + ": negative token count " + std::to_string(count) + " at offset 8");
  *width = magic == kShardMagicU32 ? 4 : (magic == kMaskMagic ? 1 : 2);
  const std::size_t want = kShardHeaderBytes + std::size_t(count) * std::size_t(*width);
  if (f.size() < want)
    throw DataError(p + ": truncated body: header says " + std::to_string(count) + " tokens (" + std::to_string(want) +
                    " bytes in all), file ends at offset " + std::to_string(f.size()));
  if (f.size() > want)
    throw DataError(p + ": " + std::to_string(f.size() - want) + " unexpected bytes after the last token at offset " +
                    std::to_string(want));
  return std::size_t(count);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(path + ": cannot open: " + errno_text());
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const std::string e = errno_text();
    ::close(fd);
    throw DataError(path + ": cannot stat: " + e);
  }
  size_ = std::size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const std::string e = errno_text();
      ::close(fd);
      throw DataError(path + ": cannot mmap: " + e);
    }
    data_ = static_cast<const unsigned char*>(p);
  }
  ::close(fd);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

// ---------------------------------------------------------------------------------------------------------
std::string mask_path_for(const std::string& shard_path) { return stem_of(shard_path) + ".mask"; }
std::string docs_path_for(const std::string& shard_path) { return stem_of(shard_path) + ".docs"; }

// The documents' starts: a Megatron index's sequences, else `x.docs` (validated: its header, then starts
// ascending from 0 and inside the shard).
void TokenShard::load_docs(const std::string& path) {
  if (format_ == ShardFormat::Megatron) {
    docs_ = seq_offsets_.data();
    doc_count_ = seq_offsets_.empty() ? 0 : seq_offsets_.size() - 1;
    return;
  }
  const std::string dp = docs_path_for(path);
  if (dp == path || !file_exists(dp))
    throw DataError(dp + ": missing: data.packing = documents needs the documents' starts beside " + path +
                    "; rebuild the shards with `megatrain-data shards` (or the Python front door), which write it, "
                    "or train with data.packing = stream");
  docs_file_ = MappedFile(dp);
  const MappedFile& f = docs_file_;
  if (f.size() < kShardHeaderBytes)
    throw DataError(dp + ": truncated header: " + std::to_string(f.size()) + " bytes, need " +
                    std::to_string(kShardHeaderBytes));
  const int32_t magic = read_i32(f.data()), version = read_i32(f.data() + 4), count = read_i32(f.data() + 8);
  if (magic != kDocsMagic)
    throw DataError(dp + ": wrong magic " + std::to_string(magic) + " at offset 0 (expected " +
                    std::to_string(kDocsMagic) + ")");
  if (version != kShardVersion)
    throw DataError(dp + ": unsupported version " + std::to_string(version) + " at offset 4 (expected 1)");
  if (count < 0 || f.size() != kShardHeaderBytes + std::size_t(count) * 8)
    throw DataError(dp + ": header says " + std::to_string(count) + " documents at offset 8 but the file holds " +
                    std::to_string((f.size() - kShardHeaderBytes) / 8.0) + " uint64 starts");
  docs_ = reinterpret_cast<const uint64_t*>(f.data() + kShardHeaderBytes);
  doc_count_ = std::size_t(count);
  for (std::size_t i = 0; i < doc_count_; ++i) {
    const bool ok = i == 0 ? docs_[0] == 0 : docs_[i] > docs_[i - 1] && docs_[i] < count_;
    if (!ok)
      throw DataError(dp + ": document " + std::to_string(i) + " starts at token " + std::to_string(docs_[i]) +
                      " (offset " + std::to_string(kShardHeaderBytes + i * 8) +
                      "): starts must ascend from 0 and lie inside " + path + " (" + std::to_string(count_) +
                      " tokens)");
  }
  if (doc_count_ == 0 && count_ > 0)
    throw DataError(dp + ": no documents for the " + std::to_string(count_) + " tokens of " + path);
}

bool TokenShard::starts_document(std::size_t i) const {
  if (i == 0) return true;
  return std::binary_search(docs_, docs_ + doc_count_, uint64_t(i));
}

TokenShard TokenShard::open(const std::string& path, ShardFormat format, bool load_mask, bool load_docs) {
  TokenShard s;
  if (format == ShardFormat::Auto) {
    MappedFile f(path);
    if (f.size() >= 4 && (read_i32(f.data()) == kShardMagicU16 || read_i32(f.data()) == kShardMagicU32))
      format = ShardFormat::LlmC;
    else if (file_exists(stem_of(path) + ".idx"))
      format = ShardFormat::Megatron;
    else
      throw DataError(path + ": not an llm.c shard (magic " +
                      (f.size() >= 4 ? std::to_string(read_i32(f.data())) : std::string("missing")) +
                      " at offset 0, expected 20240520 or 20240801) and no Megatron .idx beside it; "
                      "for nanoGPT's raw uint16 .bin give the format explicitly");
  }
  s.format_ = format;
  if (format == ShardFormat::LlmC) {
    s.file_ = MappedFile(path);
    s.count_ = check_llmc(s.file_, kShardMagicU16, kShardMagicU32, &s.width_);
    s.tokens_ = s.file_.data() + kShardHeaderBytes;
  } else if (format == ShardFormat::NanoGpt) {
    s.file_ = MappedFile(path);
    if (s.file_.size() % 2 != 0)
      throw DataError(path + ": raw uint16 file has an odd size (" + std::to_string(s.file_.size()) +
                      " bytes): truncated at offset " + std::to_string(s.file_.size() - 1));
    s.width_ = 2;
    s.count_ = s.file_.size() / 2;
    s.tokens_ = s.file_.data();
  } else {  // Megatron
    const std::string stem = stem_of(path), idx_path = stem + ".idx", bin_path = stem + ".bin";
    MappedFile idx(idx_path);
    const unsigned char* d = idx.data();
    const std::size_t n = idx.size();
    static const unsigned char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    if (n < 34 || std::memcmp(d, kMagic, 9) != 0)
      throw DataError(idx_path + ": not a Megatron index (magic MMIDIDX missing at offset 0)");
    uint64_t version, nseq, ndoc;
    std::memcpy(&version, d + 9, 8);
    if (version != 1)
      throw DataError(idx_path + ": unsupported index version " + std::to_string(version) + " at offset 9");
    const int code = d[17];
    if (code == 8)
      s.width_ = 2;  // uint16
    else if (code == 4)
      s.width_ = 4;  // int32
    else
      throw DataError(idx_path + ": unsupported token dtype code " + std::to_string(code) +
                      " at offset 17 (uint16=8, int32=4)");
    std::memcpy(&nseq, d + 18, 8);
    std::memcpy(&ndoc, d + 26, 8);
    // The counts are untrusted: bound them by the file's size before any arithmetic or allocation (an
    // absurd count would overflow the size computation below or ask for an impossible reservation).
    if (nseq > (n - 34) / 12 || ndoc > (n - 34 - nseq * 12) / 8)
      throw DataError(idx_path + ": " + std::to_string(nseq) + " sequences and " + std::to_string(ndoc) +
                      " documents (offsets 18 and 26) cannot fit in its " + std::to_string(n) + " bytes");
    const std::size_t need = 34 + nseq * 4 + nseq * 8 + ndoc * 8;
    if (n < need)
      throw DataError(idx_path + ": truncated: " + std::to_string(nseq) + " sequences need " + std::to_string(need) +
                      " bytes, file ends at offset " + std::to_string(n));
    s.file_ = MappedFile(bin_path);
    if (s.file_.size() % std::size_t(s.width_) != 0)
      throw DataError(bin_path + ": size " + std::to_string(s.file_.size()) + " is not a multiple of the token size");
    s.count_ = s.file_.size() / std::size_t(s.width_);
    s.tokens_ = s.file_.data();
    s.seq_offsets_.reserve(nseq + 1);
    for (uint64_t i = 0; i < nseq; ++i) {
      int32_t len;
      int64_t ptr;
      std::memcpy(&len, d + 34 + i * 4, 4);
      std::memcpy(&ptr, d + 34 + nseq * 4 + i * 8, 8);
      if (len < 0 || ptr < 0 || ptr % s.width_ != 0 || uint64_t(ptr) / uint64_t(s.width_) + uint64_t(len) > s.count_)
        throw DataError(idx_path + ": sequence " + std::to_string(i) + " (offset " + std::to_string(34 + i * 4) +
                        ") lies outside " + bin_path);
      s.seq_offsets_.push_back(uint64_t(ptr) / uint64_t(s.width_));
      if (i + 1 == nseq) s.seq_offsets_.push_back(uint64_t(ptr) / uint64_t(s.width_) + uint64_t(len));
    }
  }
  if (load_mask && format != ShardFormat::Megatron) {
    const std::string mp = mask_path_for(path);
    if (mp != path && file_exists(mp)) {
      s.mask_file_ = MappedFile(mp);
      int w = 0;
      const std::size_t mn = check_llmc(s.mask_file_, kMaskMagic, kMaskMagic, &w);
      if (mn != s.count_)
        throw DataError(mp + ": mask has " + std::to_string(mn) + " entries but " + path + " has " +
                        std::to_string(s.count_) + " tokens");
      s.mask_ = s.mask_file_.data() + kShardHeaderBytes;
    }
  }
  if (load_docs) s.load_docs(path);
  return s;
}

void TokenShard::copy(std::size_t begin, std::size_t n, uint32_t* out) const {
  if (width_ == 4) {
    std::memcpy(out, tokens_ + begin * 4, n * 4);
  } else {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(tokens_) + begin;
    for (std::size_t i = 0; i < n; ++i) out[i] = p[i];
  }
}

std::vector<uint32_t> read_shard(const std::string& path) {
  const TokenShard s = TokenShard::open(path, ShardFormat::LlmC, false);
  std::vector<uint32_t> v(s.size());
  s.copy(0, s.size(), v.data());
  return v;
}

void write_shard(const std::string& path, const uint32_t* tokens, std::size_t n, int token_bytes) {
  ShardWriter w(path, token_bytes, false);
  w.append(tokens, nullptr, n);
  w.commit();
}

void write_mask(const std::string& path, const uint8_t* mask, std::size_t n) {
  check_count(path, n);
  AtomicFile f(path);
  int32_t h[kShardHeaderInts];
  make_header(kMaskMagic, n, h);
  f.write(h, sizeof h);
  f.write(mask, n);
  f.commit();
}

void write_docs(const std::string& path, const std::vector<uint64_t>& starts, std::size_t tokens) {
  check_count(path, starts.size());
  for (std::size_t i = 0; i < starts.size(); ++i)
    if (i == 0 ? starts[0] != 0 : starts[i] <= starts[i - 1] || starts[i] >= tokens)
      throw DataError(path + ": document " + std::to_string(i) + " would start at token " + std::to_string(starts[i]) +
                      ": starts must ascend from 0 and lie inside the shard's " + std::to_string(tokens) + " tokens");
  AtomicFile f(path);
  int32_t h[kShardHeaderInts];
  make_header(kDocsMagic, starts.size(), h);
  f.write(h, sizeof h);
  f.write(starts.data(), starts.size() * 8);
  f.commit();
}

void write_megatron(const std::string& stem, const std::vector<std::vector<uint32_t>>& docs, int token_bytes) {
  if (token_bytes != 2 && token_bytes != 4) throw DataError(stem + ": token size must be 2 or 4 bytes");
  AtomicFile bin(stem + ".bin"), idx(stem + ".idx");
  std::vector<int32_t> sizes;
  std::vector<int64_t> ptrs;
  int64_t off = 0;
  for (const auto& d : docs) {
    sizes.push_back(int32_t(d.size()));
    ptrs.push_back(off);
    for (uint32_t t : d) {
      if (token_bytes == 2) {
        if (t > 0xffff) throw DataError(stem + ".bin: token " + std::to_string(t) + " does not fit uint16");
        const uint16_t v = uint16_t(t);
        bin.write(&v, 2);
      } else {
        const int32_t v = int32_t(t);
        bin.write(&v, 4);
      }
    }
    off += int64_t(d.size()) * token_bytes;
  }
  const unsigned char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  idx.write(magic, 9);
  const uint64_t version = 1, nseq = docs.size(), ndoc = docs.size() + 1;
  const uint8_t code = token_bytes == 2 ? 8 : 4;
  idx.write(&version, 8);
  idx.write(&code, 1);
  idx.write(&nseq, 8);
  idx.write(&ndoc, 8);
  idx.write(sizes.data(), sizes.size() * 4);
  idx.write(ptrs.data(), ptrs.size() * 8);
  for (uint64_t i = 0; i < ndoc; ++i) {
    const int64_t v = int64_t(i);
    idx.write(&v, 8);
  }
  bin.commit();
  idx.commit();
}

// ---------------------------------------------------------------------------------------------------------
struct ShardWriter::Out {
  std::unique_ptr<AtomicFile> tokens, mask;
  std::vector<unsigned char> buf;
};

ShardWriter::ShardWriter(std::string path, int token_bytes, bool with_mask, bool with_docs)
    : path_(std::move(path)),
      width_(token_bytes),
      with_mask_(with_mask),
      with_docs_(with_docs),
      out_(std::make_unique<Out>()) {
  if (token_bytes != 2 && token_bytes != 4) throw DataError(path_ + ": token size must be 2 or 4 bytes");
  int32_t h[kShardHeaderInts];
  make_header(width_ == 2 ? kShardMagicU16 : kShardMagicU32, 0, h);
  out_->tokens = std::make_unique<AtomicFile>(path_);
  out_->tokens->write(h, sizeof h);
  if (with_mask_) {
    make_header(kMaskMagic, 0, h);
    out_->mask = std::make_unique<AtomicFile>(mask_path_for(path_));
    out_->mask->write(h, sizeof h);
  }
}

ShardWriter::~ShardWriter() = default;

void ShardWriter::append(const uint32_t* tokens, const uint8_t* mask, std::size_t n) {
  if (!out_) throw DataError(path_ + ": append after commit");
  if (width_ == 2) {
    out_->buf.resize(n * 2);
    uint16_t* p = reinterpret_cast<uint16_t*>(out_->buf.data());
    for (std::size_t i = 0; i < n; ++i) {
      if (tokens[i] > 0xffff)
        throw DataError(path_ + ": token " + std::to_string(tokens[i]) + " does not fit uint16 (use 4-byte tokens)");
      p[i] = uint16_t(tokens[i]);
    }
    out_->tokens->write(p, n * 2);
  } else {
    out_->tokens->write(tokens, n * 4);
  }
  if (with_mask_) {
    if (mask) {
      out_->mask->write(mask, n);
    } else {
      out_->buf.assign(n, 1);
      out_->mask->write(out_->buf.data(), n);
    }
  }
  count_ += n;
}

void ShardWriter::begin_document() {
  if (!out_) throw DataError(path_ + ": begin_document after commit");
  if (doc_starts_.empty() || doc_starts_.back() != count_) doc_starts_.push_back(count_);
}

void ShardWriter::commit() {
  if (!out_) return;
  check_count(path_, count_);
  if (with_docs_ || !doc_starts_.empty()) {  // told of documents: their starts, the shard's first token among them
    if (doc_starts_.empty() || doc_starts_.front() != 0) doc_starts_.insert(doc_starts_.begin(), 0);
    if (count_ > 0 && doc_starts_.back() == count_) doc_starts_.pop_back();  // begun, but nothing appended
    if (count_ == 0) doc_starts_.clear();
    write_docs(docs_path_for(path_), doc_starts_, count_);
  }
  int32_t h[kShardHeaderInts];
  make_header(width_ == 2 ? kShardMagicU16 : kShardMagicU32, count_, h);
  out_->tokens->write_at(0, h, 12);
  if (with_mask_) {
    make_header(kMaskMagic, count_, h);
    out_->mask->write_at(0, h, 12);
    out_->mask->commit();
  }
  out_->tokens->commit();
  out_.reset();
}

}  // namespace mt::data
