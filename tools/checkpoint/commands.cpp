#include "tools/checkpoint/commands.hpp"

#include <chrono>
#include <cstdio>
#include <set>

#include "kernels/param_layout.hpp"
#include "storage/checkpoint/checkpoint_dir.hpp"
#include "storage/checkpoint/checkpoint_reader.hpp"
#include "storage/checkpoint/hf_interop.hpp"
#include "storage/hf/hf_config.hpp"
#include "storage/hf/safetensors_writer.hpp"

namespace mt::tools {

namespace fs = std::filesystem;
using Flags = std::map<std::string, std::string>;

namespace {

void expect_args(const std::vector<std::string>& pos, std::size_t n, const Flags& flags,
                 const std::set<std::string>& allowed) {
  if (pos.size() != n)
    throw UsageError("'" + pos[0] + "' takes " + std::to_string(n - 1) + " argument(s), got " +
                     std::to_string(pos.size() - 1));
  for (const auto& [k, v] : flags)
    if (!allowed.count(k)) throw UsageError("'" + pos[0] + "' does not take " + k);
}

std::string human_bytes(std::uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ull << 20));
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

std::uint64_t dir_bytes(const fs::path& dir) {
  std::uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

int cmd_list(const std::vector<std::string>& pos, const Flags& flags) {
  expect_args(pos, 2, flags, {});
  const fs::path root = pos[1];
  if (!fs::is_directory(root)) throw ckpt::CheckpointError(root.string() + ": no such directory");
  const auto all = ckpt::list_checkpoints(root);
  if (all.empty()) {
    std::printf("no checkpoints in %s\n", root.c_str());
    return 0;
  }
  std::printf("%-10s %-16s %12s  %-8s %s\n", "step", "directory", "size", "model", "status");
  for (const auto& c : all) {
    std::string model = "?", status;
    try {
      const ckpt::CheckpointReader r(c.dir, ckpt::Verify::manifest);
      model = arch_name(r.model_config().arch);
      status = "complete (" + std::to_string(r.manifest().at("states").size()) + " states)";
    } catch (const std::exception& e) {
      status = std::string("DAMAGED: ") + e.what();
    }
    std::printf("%-10lld %-16s %12s  %-8s %s%s\n", static_cast<long long>(c.step), c.dir.filename().c_str(),
                human_bytes(dir_bytes(c.dir)).c_str(), model.c_str(), status.c_str(), c.is_latest ? "  <- latest" : "");
  }
  return 0;
}

int cmd_inspect(const std::vector<std::string>& pos, const Flags& flags) {
  expect_args(pos, 2, flags, {"--json"});
  const auto r = ckpt::CheckpointReader::open(pos[1], ckpt::Fallback::none, ckpt::Verify::manifest);
  if (flags.count("--json")) {
    std::printf("%s\n", r.manifest().dump(2).c_str());
    return 0;
  }
  const auto& m = r.manifest();
  const ModelConfig& c = r.model_config();
  std::printf("checkpoint  %s\n", r.dir().c_str());
  std::printf("step        %lld\n", static_cast<long long>(r.step()));
  std::printf("created     %s\n", m.value("created_utc", "?").c_str());
  std::printf("versions    %s\n", m.at("versions").dump().c_str());
  std::printf("model       %s: %lld layers, hidden %lld, heads %lld/%lld, vocab %lld, %lld parameters\n",
              hf::architecture_class(c.arch), static_cast<long long>(c.num_hidden_layers),
              static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_attention_heads),
              static_cast<long long>(c.num_key_value_heads), static_cast<long long>(c.vocab_size),
              static_cast<long long>(total_param_count(c)));
  std::printf("states      %s\n", m.at("states").dump().c_str());
  std::printf("size        %s in %zu shard(s)\n", human_bytes(r.total_bytes()).c_str(), m.at("shards").size());
  for (const auto& s : m.at("shards"))
    std::printf("  %-16s %12s  xxh3_64 %s\n", s.at("file").get<std::string>().c_str(),
                human_bytes(s.at("bytes").get<std::uint64_t>()).c_str(), s.at("xxh3_64").get<std::string>().c_str());
  std::printf("stages      %zu\n", m.at("stages").size());
  std::printf("run state   %s\n", m.at("run").dump().c_str());
  return 0;
}

int cmd_verify(const std::vector<std::string>& pos, const Flags& flags) {
  expect_args(pos, 2, flags, {});
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = ckpt::CheckpointReader::open(pos[1], ckpt::Fallback::none, ckpt::Verify::full);
  r.verify_datasets();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("OK %s: step %lld, %zu shard(s), %s, every file and dataset checksum matches (%.2f s)\n", r.dir().c_str(),
              static_cast<long long>(r.step()), r.manifest().at("shards").size(), human_bytes(r.total_bytes()).c_str(),
              s);
  return 0;
}

hf::DType parse_export_dtype(const std::string& s) {
  if (s == "float32" || s == "fp32") return hf::DType::f32;
  if (s == "bfloat16" || s == "bf16") return hf::DType::bf16;
  if (s == "float16" || s == "fp16") return hf::DType::f16;
  throw UsageError("--dtype must be float32, bfloat16 or float16, got '" + s + "'");
}

int cmd_export(const std::vector<std::string>& pos, const Flags& flags) {
  expect_args(pos, 3, flags, {"--tokenizer", "--max-shard-size", "--dtype"});
  const auto r = ckpt::CheckpointReader::open(pos[1], ckpt::Fallback::none, ckpt::Verify::full);
  hf::HfExportOptions o;
  if (flags.count("--tokenizer")) o.tokenizer_dir = flags.at("--tokenizer");
  if (flags.count("--max-shard-size")) o.max_shard_bytes = hf::parse_size(flags.at("--max-shard-size"));
  if (flags.count("--dtype")) o.dtype = parse_export_dtype(flags.at("--dtype"));
  ckpt::export_to_hf(r, pos[2], o);
  std::printf("exported step %lld of %s to %s\n", static_cast<long long>(r.step()), r.dir().c_str(), pos[2].c_str());
  return 0;
}

int cmd_import(const std::vector<std::string>& pos, const Flags& flags) {
  expect_args(pos, 3, flags, {"--step", "--max-shard-size"});
  ckpt::CheckpointWriterOptions o;
  std::int64_t step = 0;
  try {
    if (flags.count("--step")) step = std::stoll(flags.at("--step"));
  } catch (const std::exception&) {
    throw UsageError("--step must be an integer");
  }
  if (flags.count("--max-shard-size")) o.max_shard_bytes = hf::parse_size(flags.at("--max-shard-size"));
  const fs::path out = ckpt::import_from_hf(pos[1], pos[2], step, o);
  std::printf("imported %s as %s\n", pos[1].c_str(), out.c_str());
  return 0;
}

}  // namespace

int run_command(const std::vector<std::string>& pos, const Flags& flags) {
  const std::string& cmd = pos[0];
  if (cmd == "list") return cmd_list(pos, flags);
  if (cmd == "inspect") return cmd_inspect(pos, flags);
  if (cmd == "verify") return cmd_verify(pos, flags);
  if (cmd == "export") return cmd_export(pos, flags);
  if (cmd == "import") return cmd_import(pos, flags);
  throw UsageError("unknown command '" + cmd + "'");
}

}  // namespace mt::tools
