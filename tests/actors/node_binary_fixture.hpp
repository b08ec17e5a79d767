// Helpers for the tests that run the node binary `megatrain train` as a child process.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace mt::test {

namespace fs = std::filesystem;

struct Outcome {
  int code = -1;    // exit code (-1: killed by a signal)
  std::string out;  // stdout and stderr together
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

#ifdef MEGATRAIN_BINARY  // the tests that run the node binary (others use the helpers below alone)
// Runs `megatrain train ARGS` with optional environment assignments in front ("VAR=x").
inline Outcome run_node(const std::string& args, const std::string& env = "") {
  const fs::path log = fs::temp_directory_path() / ("mt_node_" + std::to_string(::getpid()) + ".log");
  const std::string cmd = env + " " + std::string(MEGATRAIN_BINARY) + " train " + args + " > " + log.string() + " 2>&1";
  Outcome o;
  const int rc = std::system(cmd.c_str());
  o.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  o.out = slurp(log);
  fs::remove(log);
  return o;
}
#endif

// A small llm.c token shard (uint16 tokens), written by hand as the format specifies, of a repeating
// pattern the model can learn.
inline fs::path make_shard(const fs::path& dir, std::size_t tokens) {
  fs::create_directories(dir);
  fs::path p = dir / "train_000000.bin";
  std::vector<std::int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<std::int32_t>(tokens);
  std::vector<std::uint16_t> t(tokens);
  for (std::size_t i = 0; i < tokens; ++i) t[i] = static_cast<std::uint16_t>((i * 7 + i / 13) % 61);
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
  return p;
}

}  // namespace mt::test
