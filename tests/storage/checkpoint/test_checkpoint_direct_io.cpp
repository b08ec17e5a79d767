// The datasets' bytes go beside HDF5, mostly with O_DIRECT (dataset_data_writer.hpp): the files are the
// same bytes as through the page cache, from buffers of any alignment, and the same state always gives
// the same files.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "storage/checkpoint/checkpoint_reader.hpp"
#include "storage/checkpoint/checkpoint_writer.hpp"
#include "storage/checkpoint/dataset_data_writer.hpp"
#include "tests/storage/checkpoint/ckpt_test_util.hpp"

using namespace mt;
using namespace mt::ckpt;
namespace fs = std::filesystem;

namespace {

// Tensors from 64 KiB up (the ones HDF5 aligns to 4 KiB), and small ones beside them.
ModelConfig direct_config() {
  ModelConfig c = test::tiny_config(Arch::llama, 2);
  c.hidden_size = 128;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.intermediate_size = 320;
  c.vocab_size = 600;
  return c;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// One stage's three states in one 4 KiB-aligned allocation, the first state `shift` bytes in.
struct StageBuffers {
  std::unique_ptr<char, FreeDeleter> block;
  const float* state[3] = {};
  StageBuffers(const ModelConfig& c, std::int64_t s, std::size_t shift) {
    const std::size_t bytes = stage_layout(c, s).total_floats * sizeof(float);
    const std::size_t stride = (bytes + 4095) / 4096 * 4096;
    block.reset(static_cast<char*>(std::aligned_alloc(4096, 3 * stride + 4096)));
    for (int k = 0; k < 3; ++k) {
      char* at = block.get() + k * stride + shift;
      const auto v = test::stage_values(c, s, k);
      std::memcpy(at, v.data(), bytes);
      state[k] = reinterpret_cast<const float*>(at);
    }
  }
};

struct Written {
  fs::path dir;
  std::uint64_t direct_bytes = 0;
  std::uint64_t bytes = 0;
};

Written write_checkpoint(const fs::path& root, bool direct, std::size_t shift) {
  const ModelConfig c = direct_config();
  CheckpointWriterOptions o;
  o.direct_io = direct;
  o.max_shard_bytes = 1u << 20;  // two shards
  CheckpointWriter w(root, 5, c, o);
  for (std::int64_t s = 0; s < num_stages(c); ++s) {
    const StageBuffers b(c, s, shift);
    w.write_stage(s, {b.state[0], b.state[1], b.state[2]});
  }
  Written out;
  out.dir = w.finalize({{"step", 5}});
  out.direct_bytes = w.direct_bytes();
  out.bytes = w.bytes_written();
  return out;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool same_shards(const fs::path& a, const fs::path& b) {
  const auto ra = CheckpointReader(a);
  bool same = true;
  for (const auto& shard : ra.manifest().at("shards")) {
    const std::string name = shard.at("file").get<std::string>();
    const std::string fa = file_bytes(a / name);
    INFO(name);
    CHECK(!fa.empty());
    same = same && !fa.empty() && fa == file_bytes(b / name);
  }
  return same;
}

void expect_values(const fs::path& dir) {
  const ModelConfig c = direct_config();
  const CheckpointReader r(dir);
  r.verify_datasets();
  for (std::int64_t s = 0; s < num_stages(c); ++s) {
    const auto n = stage_layout(c, s).total_floats;
    std::vector<float> p(n), m(n), v(n);
    r.read_stage(s, p.data(), m.data(), v.data());
    CHECK(std::memcmp(p.data(), test::stage_values(c, s, 0).data(), n * 4) == 0);
    CHECK(std::memcmp(m.data(), test::stage_values(c, s, 1).data(), n * 4) == 0);
    CHECK(std::memcmp(v.data(), test::stage_values(c, s, 2).data(), n * 4) == 0);
  }
}

// Does this file system take a 4 KiB O_DIRECT write (tmpfs does not)?
bool direct_io_works(const fs::path& dir) {
  const fs::path f = dir / "probe";
  const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  void* page = std::aligned_alloc(4096, 4096);
  std::memset(page, 0, 4096);
  const bool ok = ::pwrite(fd, page, 4096, 0) == 4096;
  std::free(page);
  ::close(fd);
  fs::remove(f);
  return ok;
}

}  // namespace

TEST_CASE("direct and buffered checkpoint writes give the same files, byte for byte") {
  test::TempDir direct_root, buffered_root, again_root, shifted_root;
  const Written direct = write_checkpoint(direct_root.path(), true, 0);
  const Written buffered = write_checkpoint(buffered_root.path(), false, 0);
  const Written again = write_checkpoint(again_root.path(), true, 0);
  // 4 bytes off a 512-byte boundary: no O_DIRECT from such a buffer, the page cache takes it all.
  const Written shifted = write_checkpoint(shifted_root.path(), true, 4);
  CHECK(buffered.direct_bytes == 0);
  CHECK(shifted.direct_bytes == 0);
  if (direct_io_works(direct_root.path())) {
    // Most of the bytes went direct: the large tensors' pages.
    CHECK(direct.direct_bytes > direct.bytes / 2);
  } else {
    WARN("the temporary directory's file system takes no O_DIRECT writes: only the page-cache path ran");
  }
  CHECK(same_shards(direct.dir, buffered.dir));
  CHECK(same_shards(direct.dir, again.dir));
  CHECK(same_shards(direct.dir, shifted.dir));
  for (const auto& d : {direct.dir, buffered.dir, shifted.dir}) expect_values(d);
}

TEST_CASE("a dataset's bytes reach the file whatever their offset, length and alignment") {
  test::TempDir tmp;
  const fs::path f = tmp.path() / "data.bin";
  std::ofstream(f).put('x');
  constexpr std::size_t kBytes = 3 * 4096 + 100;
  std::unique_ptr<char, FreeDeleter> src(static_cast<char*>(std::aligned_alloc(4096, kBytes + 4096)));
  for (std::size_t i = 0; i < kBytes + 4096; ++i) src.get()[i] = static_cast<char>(i * 131 + 7);
  std::string expect(1, 'x');  // written before, never overwritten
  {
    DatasetDataWriter w(f, true);
    // Page-aligned offset and buffer (direct body, buffered tail), then an odd offset, then a buffer
    // 512 bytes off a page (direct where the device allows it), then a short one.
    const struct {
      std::uint64_t offset;
      std::size_t shift, bytes;
    } writes[] = {{4096, 0, kBytes}, {1, 3, 1000}, {2 * 4096 + kBytes / 4096 * 4096, 512, 4096 * 2}, {20, 0, 7}};
    for (const auto& x : writes) {
      w.write(x.offset, src.get() + x.shift, x.bytes);
      if (expect.size() < x.offset + x.bytes) expect.resize(x.offset + x.bytes, '\0');
      std::memcpy(expect.data() + x.offset, src.get() + x.shift, x.bytes);
    }
    CHECK(w.direct_bytes() + w.buffered_bytes() == kBytes + 1000 + 8192 + 7);
  }
  std::string got = file_bytes(f);
  REQUIRE(got.size() == expect.size());
  CHECK(got == expect);
}

TEST_CASE("writing a dataset past the file size limit is a clear error naming the file") {
  test::TempDir tmp;
  const fs::path f = tmp.path() / "limited.bin";
  std::ofstream(f).put('x');
  std::unique_ptr<char, FreeDeleter> src(static_cast<char*>(std::aligned_alloc(4096, 1 << 20)));
  std::memset(src.get(), 1, 1 << 20);
  std::string err;
  {
    DatasetDataWriter w(f, true);
    REQUIRE_THROWS_AS(DatasetDataWriter(tmp.path() / "missing" / "x.bin", true), CheckpointError);
    try {
      // Past every file system's largest file: fails as a full disk does, naming the file and errno.
      w.write(std::uint64_t{1} << 62, src.get(), 1 << 20);
    } catch (const CheckpointError& e) {
      err = e.what();
    }
  }
  CHECK_THAT(err, Catch::Contains("limited.bin") && Catch::Contains("failed"));
}
