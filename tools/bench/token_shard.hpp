// A token shard (llm.c format: a 1 KiB header, then uint16 tokens) of reproducible random tokens below
// the demo vocabulary (4096), for the benchmarks that run `megatrain train` on the demo's shapes
// without its corpus.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace mt::bench {

inline std::filesystem::path write_token_shard(const std::filesystem::path& dir, std::size_t tokens) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path p = dir / "train_000000.bin";
  std::vector<std::int32_t> header(256, 0);
  header[0] = 20240520;  // llm.c's magic
  header[1] = 1;         // version: uint16 tokens
  header[2] = static_cast<std::int32_t>(tokens);
  std::vector<std::uint16_t> t(tokens);
  std::uint64_t x = 12345;
  for (auto& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<std::uint16_t>((x >> 33) % 4096);
  }
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
  if (!out) throw std::runtime_error("cannot write " + p.string());
  return p;
}

}  // namespace mt::bench
