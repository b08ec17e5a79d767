#include "data/rdata.hpp"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include <zlib.h>

#include "data/shard.hpp"  // DataError

namespace mt::data {

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw DataError(path + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Inflates a zlib or gzip stream (auto-detected).
std::string inflate_all(const unsigned char* p, std::size_t n, const std::string& where) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 32) != Z_OK) throw DataError(where + ": zlib init failed");
  std::string out;
  char buf[1 << 16];
  z.next_in = const_cast<unsigned char*>(p);
  z.avail_in = uInt(n);
  int rc;
  do {
    z.next_out = reinterpret_cast<unsigned char*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      const std::string msg = z.msg ? z.msg : "corrupt stream";
      const std::size_t at = n - z.avail_in;
      inflateEnd(&z);
      throw DataError(where + ": zlib error at compressed offset " + std::to_string(at) + ": " + msg);
    }
    out.append(buf, sizeof buf - z.avail_out);
  } while (rc != Z_STREAM_END && (z.avail_in > 0 || z.avail_out == 0));
  inflateEnd(&z);
  if (rc != Z_STREAM_END) throw DataError(where + ": compressed stream is truncated");
  return out;
}

// R value types (SEXPTYPE) and serialization pseudo-types.
enum : int {
  NILSXP = 0,
  SYMSXP = 1,
  LISTSXP = 2,
  CLOSXP = 3,
  ENVSXP = 4,
  PROMSXP = 5,
  LANGSXP = 6,
  CHARSXP = 9,
  LGLSXP = 10,
  INTSXP = 13,
  REALSXP = 14,
  CPLXSXP = 15,
  STRSXP = 16,
  DOTSXP = 17,
  VECSXP = 19,
  EXPRSXP = 20,
  RAWSXP = 24,
  S4SXP = 25,
  REFSXP = 255,
  NILVALUE_SXP = 254,
  GLOBALENV_SXP = 253,
  UNBOUNDVALUE_SXP = 252,
  MISSINGARG_SXP = 251,
  BASENAMESPACE_SXP = 250,
  NAMESPACESXP = 249,
  PACKAGESXP = 248,
  PERSISTSXP = 247,
  EMPTYENV_SXP = 242,
  BASEENV_SXP = 241,
  ATTRLANGSXP = 240,
  ATTRLISTSXP = 239,
  ALTREP_SXP = 238
};

struct RValue;
using RPtr = std::shared_ptr<RValue>;
struct RValue {
  int type = NILSXP;
  std::string str;  // CHARSXP text, SYMSXP name
  bool na = false;
  std::vector<std::string> strs;  // STRSXP
  std::vector<int32_t> ints;      // LGLSXP / INTSXP
  std::vector<RPtr> items;        // VECSXP / EXPRSXP; pairlist: car values
  std::vector<std::string> tags;  // pairlist tags
  RPtr attr;                      // attributes pairlist

  // The "names" attribute, when there is one.
  std::vector<std::string> names() const {
    if (!attr) return {};
    for (std::size_t i = 0; i < attr->tags.size(); ++i)
      if (attr->tags[i] == "names" && attr->items[i] && attr->items[i]->type == STRSXP) return attr->items[i]->strs;
    return {};
  }
  RPtr get(const std::string& name) const {
    const auto n = names();
    for (std::size_t i = 0; i < n.size() && i < items.size(); ++i)
      if (n[i] == name) return items[i];
    for (std::size_t i = 0; i < tags.size(); ++i)
      if (tags[i] == name) return items[i];
    return nullptr;
  }
};

std::string latin1_to_utf8(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c < 0x80) {
      o += char(c);
    } else {
      o += char(0xC0 | (c >> 6));
      o += char(0x80 | (c & 0x3F));
    }
  }
  return o;
}

class Unserializer {
 public:
  Unserializer(std::string data, std::string where) : d_(std::move(data)), where_(std::move(where)) {}

  RPtr read() {
    if (d_.size() < 2 || d_[0] != 'X' || d_[1] != '\n')
      throw DataError(where_ + ": not R's XDR serialization (no 'X\\n' at offset 0)");
    pos_ = 2;
    const int version = i32();
    i32();  // writer's R version
    i32();  // minimal R version
    if (version == 3) {
      const int n = i32();
      bytes(std::size_t(n));  // native encoding
    } else if (version != 2) {
      fail("unsupported serialization version " + std::to_string(version));
    }
    return item();
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(where_ + ": " + what + " at offset " + std::to_string(pos_));
  }
  int32_t i32() {
    if (pos_ + 4 > d_.size()) fail("truncated data");
    const auto* p = reinterpret_cast<const unsigned char*>(d_.data() + pos_);
    pos_ += 4;
    return int32_t(uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]));
  }
  std::string bytes(std::size_t n) {
    if (pos_ + n > d_.size()) fail("truncated data");
    std::string s = d_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::size_t length() {
    const int32_t n = i32();
    if (n >= 0) return std::size_t(n);
    if (n != -1) fail("bad vector length");
    const uint64_t hi = uint32_t(i32()), lo = uint32_t(i32());
    return std::size_t(hi << 32 | lo);
  }

  RPtr item() {
    const int32_t flags = i32();
    auto v = std::make_shared<RValue>();
    v->type = flags & 0xFF;
    if (RPtr done = structural_item(v, flags)) return done;
    if (vector_body(*v, flags >> 12) && (flags & (1 << 9))) v->attr = item();
    return v;
  }

  // The values that are not vectors, read whole (attributes included); null for a vector type.
  RPtr structural_item(const RPtr& v, int32_t flags) {
    switch (v->type) {
      case NILVALUE_SXP:
      case EMPTYENV_SXP:
      case BASEENV_SXP:
      case GLOBALENV_SXP:
      case UNBOUNDVALUE_SXP:
      case MISSINGARG_SXP:
      case BASENAMESPACE_SXP:
        return v;
      case REFSXP:
        return reference(flags);
      case PERSISTSXP:
      case PACKAGESXP:
      case NAMESPACESXP:
        return named_strings(v);
      case SYMSXP:
        refs_.push_back(v);
        v->str = item()->str;
        return v;
      case ENVSXP:
        return environment(v);
      case LISTSXP:
      case LANGSXP:
      case CLOSXP:
      case PROMSXP:
      case DOTSXP:
      case ATTRLANGSXP:
      case ATTRLISTSXP:
        return pairlist(v, flags);
      default:
        return nullptr;
    }
  }

  RPtr reference(int32_t flags) {
    int idx = flags >> 8;
    if (idx == 0) idx = i32();
    if (idx < 1 || std::size_t(idx) > refs_.size()) fail("bad reference " + std::to_string(idx));
    return refs_[std::size_t(idx) - 1];
  }

  RPtr named_strings(const RPtr& v) {
    refs_.push_back(v);
    i32();
    const std::size_t n = length();
    for (std::size_t i = 0; i < n; ++i) v->strs.push_back(item()->str);
    return v;
  }

  RPtr environment(const RPtr& v) {
    refs_.push_back(v);
    i32();                       // locked
    item();                      // enclosure
    v->items.push_back(item());  // frame
    item();                      // hash table
    v->attr = item();
    return v;
  }

  // A pairlist is read iteratively along its CDR chain.
  RPtr pairlist(const RPtr& v, int32_t flags) {
    v->attr = (flags & (1 << 9)) ? item() : nullptr;
    bool tag = flags & (1 << 10);
    for (;;) {
      v->tags.push_back(tag ? item()->str : std::string());
      v->items.push_back(item());
      const int32_t f2 = i32();
      const int t2 = f2 & 0xFF;
      if (t2 == NILVALUE_SXP) break;
      if (t2 != LISTSXP && t2 != LANGSXP && t2 != ATTRLISTSXP && t2 != ATTRLANGSXP) {
        pos_ -= 4;
        v->items.push_back(item());  // dotted pair tail
        v->tags.emplace_back();
        break;
      }
      if (f2 & (1 << 9)) item();  // attributes of an inner cell: dropped
      tag = f2 & (1 << 10);
    }
    return v;
  }

  // A vector's elements; false when no attributes follow (an NA string).
  bool vector_body(RValue& v, int levels) {
    switch (v.type) {
      case CHARSXP: {
        const int32_t n = i32();
        if (n == -1) return v.na = true, false;
        v.str = bytes(std::size_t(n));
        if (levels & 4) v.str = latin1_to_utf8(v.str);  // LATIN1_MASK
        return true;
      }
      case LGLSXP:
      case INTSXP:
        v.ints.resize(length());
        for (auto& x : v.ints) x = i32();
        return true;
      case REALSXP:
        bytes(length() * 8);
        return true;
      case CPLXSXP:
        bytes(length() * 16);
        return true;
      case RAWSXP:
        v.str = bytes(length());
        return true;
      case STRSXP:
        return strings(v), true;
      case VECSXP:
      case EXPRSXP: {
        const std::size_t n = length();
        for (std::size_t i = 0; i < n; ++i) v.items.push_back(item());
        return true;
      }
      case S4SXP:
        return true;
      default:
        fail("unsupported R value type " + std::to_string(v.type));
    }
  }

  void strings(RValue& v) {
    const std::size_t n = length();
    v.strs.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      RPtr c = item();
      v.strs.push_back(c->na ? std::string() : c->str);
    }
  }

  std::string d_;
  std::string where_;
  std::size_t pos_ = 0;
  std::vector<RPtr> refs_;
};

}  // namespace

std::vector<RStringVariable> read_r_lazyload_strings(const std::string& stem) {
  const std::string rdx_path = stem + ".rdx", rdb_path = stem + ".rdb";
  const std::string rdx_raw = read_all(rdx_path);
  // The index is one compressed serialization: gzip'd in packages' data/, or R's 4-byte length + zlib.
  std::string rdx;
  const auto* rp = reinterpret_cast<const unsigned char*>(rdx_raw.data());
  if (rdx_raw.size() >= 2 && rp[0] == 0x1f && rp[1] == 0x8b)
    rdx = inflate_all(rp, rdx_raw.size(), rdx_path);
  else if (rdx_raw.size() > 4)
    rdx = inflate_all(rp + 4, rdx_raw.size() - 4, rdx_path);
  else
    throw DataError(rdx_path + ": too short for an R lazy-load index");
  const RPtr index = Unserializer(std::move(rdx), rdx_path).read();
  const RPtr vars = index->get("variables");
  if (!vars || vars->type != VECSXP) throw DataError(rdx_path + ": no 'variables' list in the index");
  const RPtr comp = index->get("compressed");
  int compression = 1;
  if (comp && !comp->ints.empty()) compression = comp->ints[0];
  if (compression != 1)
    throw DataError(rdx_path + ": compression type " + std::to_string(compression) + " is not supported (zlib only)");
  const std::string rdb = read_all(rdb_path);
  const auto names = vars->names();
  std::vector<RStringVariable> out;
  for (std::size_t i = 0; i < vars->items.size(); ++i) {
    const RPtr& pos = vars->items[i];
    if (!pos || pos->ints.size() != 2)
      throw DataError(rdx_path + ": variable " + std::to_string(i) + " has no (offset, length)");
    const std::size_t off = std::size_t(uint32_t(pos->ints[0])), len = std::size_t(uint32_t(pos->ints[1]));
    if (off + len > rdb.size() || len < 5)
      throw DataError(rdb_path + ": variable '" + (i < names.size() ? names[i] : "?") + "' at offset " +
                      std::to_string(off) + " (+" + std::to_string(len) + ") lies outside the file");
    const auto* p = reinterpret_cast<const unsigned char*>(rdb.data() + off);
    const std::string where =
        rdb_path + " (variable '" + (i < names.size() ? names[i] : "?") + "' at offset " + std::to_string(off) + ")";
    const RPtr v = Unserializer(inflate_all(p + 4, len - 4, where), where).read();
    if (v->type != STRSXP) continue;
    out.push_back({i < names.size() ? names[i] : std::string(), v->strs});
  }
  return out;
}

RStringVariable read_rds_strings(const std::string& path) {
  const std::string raw = read_all(path);
  const auto* p = reinterpret_cast<const unsigned char*>(raw.data());
  std::string data = raw;
  if (raw.size() >= 2 && ((p[0] == 0x1f && p[1] == 0x8b) || p[0] == 0x78)) data = inflate_all(p, raw.size(), path);
  const RPtr v = Unserializer(std::move(data), path).read();
  if (v->type != STRSXP) throw DataError(path + ": the serialized value is not a character vector");
  return {"", v->strs};
}

std::vector<RStringVariable> read_janeaustenr(const std::string& package_dir) {
  auto vars = read_r_lazyload_strings(package_dir + "/data/Rdata");
  if (vars.empty())
    throw DataError(package_dir + "/data/Rdata.rdx: no character vectors (is r-cran-janeaustenr installed?)");
  return vars;
}

std::string janeaustenr_text(const std::string& package_dir) {
  std::string out;
  for (const auto& v : read_janeaustenr(package_dir))
    for (const auto& line : v.values) {
      out += line;
      out += '\n';
    }
  return out;
}

}  // namespace mt::data
