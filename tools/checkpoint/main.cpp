// megatrain-ckpt: list, inspect, verify checkpoints; export them to Hugging Face; import Hugging Face
// models as initial checkpoints. Exit status: 0 success, 1 failure (message on stderr), 2 bad usage.
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "tools/checkpoint/commands.hpp"

namespace {

const char* kUsage =
    "usage: megatrain-ckpt COMMAND ARGS\n"
    "  list DIR                         checkpoints under a checkpoint root (step, size, status)\n"
    "  inspect CKPT [--json]            step, sizes, model config, shards of one checkpoint\n"
    "  verify CKPT                      check every shard and dataset checksum\n"
    "  export CKPT OUT_HF_DIR [--tokenizer DIR] [--max-shard-size 5GB] [--dtype float32|bfloat16|float16]\n"
    "                                   write a transformers model directory\n"
    "  import HF_DIR OUT_CKPT_ROOT [--step N] [--max-shard-size 2GiB]\n"
    "                                   convert a Hugging Face model into an initial checkpoint\n"
    "CKPT is a step directory or a checkpoint root (then its `latest`).\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--json") {
      flags[a] = "1";
    } else if (a.rfind("--", 0) == 0) {
      const auto eq = a.find('=');
      if (eq != std::string::npos) {
        flags[a.substr(0, eq)] = a.substr(eq + 1);
      } else if (i + 1 < argc) {
        flags[a] = argv[++i];
      } else {
        std::fprintf(stderr, "megatrain-ckpt: option %s needs a value\n%s", a.c_str(), kUsage);
        return 2;
      }
    } else {
      positional.push_back(a);
    }
  }
  if (positional.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  try {
    return mt::tools::run_command(positional, flags);
  } catch (const mt::tools::UsageError& e) {
    std::fprintf(stderr, "megatrain-ckpt: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megatrain-ckpt: error: %s\n", e.what());
    return 1;
  }
}
