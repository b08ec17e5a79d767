// Stage files and the I/O pool: what is written reads back; damage, truncation, a full disk and a read
// error are each an error naming the file (and the block), never silent.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <functional>

#include "storage/host/aligned_buffer.hpp"
#include "storage/host/moment_store.hpp"
#include "storage/offload/stage_file.hpp"
#include "tests/storage/offload/offload_test_util.hpp"

using namespace mt;
using namespace mt::offload;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const MomentStoreError& e) {
    return e.what();
  }
  return "";
}

void flip_byte(const std::string& path, std::size_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("a stage file round-trips its payload with O_DIRECT and detects damage by block") {
  test::OffloadTempDir tmp;
  IoPool io(3, 64 * 1024);
  const std::size_t payload = 3 * kChecksumBlock + 1000;  // 4 blocks, the last partial
  const std::string path = tmp.path() + "/s.moments";
  StageFile f(path, 5, payload, true);
  AlignedBuffer buf(f.buffer_bytes(), "test", true, kDirectAlign), back(f.buffer_bytes(), "test", true, kDirectAlign);
  for (std::size_t i = 0; i < payload; ++i) buf.data()[f.header_bytes() + i] = static_cast<std::byte>(i * 7 + 1);
  f.write(buf.data(), payload, 1, io);
  REQUIRE(f.read(back.data(), 1, io) == payload);
  CHECK(std::memcmp(back.data() + f.header_bytes(), buf.data() + f.header_bytes(), payload) == 0);

  SECTION("a stale generation is refused") {
    CHECK_THAT(error_of([&] { f.read(back.data(), 2, io); }), Catch::Contains("a write was lost"));
  }
  SECTION("a flipped payload byte names the file and the block") {
    flip_byte(path, f.header_bytes() + 2 * kChecksumBlock + 5);
    const std::string e = error_of([&] { f.read(back.data(), 1, io); });
    CHECK_THAT(e, Catch::Contains(path) && Catch::Contains("block 2") && Catch::Contains("checksum"));
  }
  SECTION("a flipped header byte is found") {
    flip_byte(path, 70);  // inside the checksum table
    CHECK_THAT(error_of([&] { f.read(back.data(), 1, io); }), Catch::Contains(path) && Catch::Contains("header"));
  }
  SECTION("a truncated file is named as truncated") {
    REQUIRE(::truncate(path.c_str(), static_cast<off_t>(f.header_bytes() + kChecksumBlock)) == 0);
    CHECK_THAT(error_of([&] { f.read(back.data(), 1, io); }), Catch::Contains(path) && Catch::Contains("truncated"));
  }
}

TEST_CASE("an I/O error is reported with the file, the offset and the reason") {
  test::OffloadTempDir tmp;
  const std::string path = tmp.path() + "/w";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT, 0600);  // reading it fails (EBADF)
  REQUIRE(fd >= 0);
  IoPool io(2, 4096);
  AlignedBuffer buf(3 * 4096, "test", true, kDirectAlign);
  REQUIRE(::pwrite(fd, buf.data(), buf.bytes(), 0) == static_cast<ssize_t>(buf.bytes()));
  const std::string e = error_of([&] { io.transfer(fd, path, false, buf.data(), buf.bytes(), 0); });
  ::close(fd);
  CHECK_THAT(e, Catch::Contains(path) && Catch::Contains("read of 4096 bytes at offset") &&
                    Catch::Contains(std::strerror(EBADF)));
}

TEST_CASE("a full disk (file-size limit) fails the write with a message naming the file") {
  test::OffloadTempDir tmp;
  const std::string path = tmp.path() + "/full.moments";
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Child: the limit makes the kernel refuse to grow the file past 1 MiB (EFBIG / a short write).
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{1 << 20, 1 << 20};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    IoPool io(2, 256 * 1024);
    const std::size_t payload = 3 * kChecksumBlock;
    StageFile f(path, 0, payload, true);
    AlignedBuffer buf(f.buffer_bytes(), "test", true, kDirectAlign);
    const std::string e = error_of([&] { f.write(buf.data(), payload, 1, io); });
    const bool named = e.find(path) != std::string::npos && (e.find("file-size limit") != std::string::npos ||
                                                             e.find(std::strerror(EFBIG)) != std::string::npos);
    if (!named) std::fprintf(stderr, "unexpected error: '%s'\n", e.c_str());
    std::_Exit(named ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
