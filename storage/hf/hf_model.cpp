#include "storage/hf/hf_model.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <set>

#include "storage/hf/file_util.hpp"
#include "storage/hf/hf_config.hpp"
#include "storage/hf/safetensors_reader.hpp"
#include "storage/hf/safetensors_writer.hpp"

namespace mt::hf {

using nlohmann::json;

HfTensorName hf_tensor(const ModelConfig& c, const ParamLayout& layout, const TensorSpec& t) {
  HfTensorName n;
  n.name = layout.prefix + t.name;
  n.file_shape = t.shape;
  // GPT-2's Conv1D layers hold [in, out]: every matrix inside a GPT-2 decoder layer is one.
  if (c.is_gpt2() && layout.kind == StageKind::layer && t.shape.size() == 2) {
    n.transposed = true;
    std::swap(n.file_shape[0], n.file_shape[1]);
  }
  return n;
}

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Buffers and tied copies transformers may have saved that carry no parameters of ours.
bool ignorable(const ModelConfig& c, const std::string& name) {
  if (c.is_gpt2() && (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias"))) return true;
  if (ends_with(name, ".rotary_emb.inv_freq")) return true;
  return c.tie_word_embeddings && name == "lm_head.weight";
}

// Where transformers v5 keeps an expert tensor we name by v4's per-expert names: the fused tensor (for
// Mixtral under block_sparse_moe. or mlp., whichever the files have), its shape, and our matrix's slice.
struct FusedSource {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t first = 0, count = 0;
};
std::optional<FusedSource> fused_source(const ModelConfig& c, const std::string& prefix, const std::string& tensor,
                                        const std::function<bool(const std::string&)>& in_files) {
  if (!c.is_moe() || c.is_gpt_oss()) return std::nullopt;  // gpt-oss's own fused form: gpt_oss_experts.hpp
  const std::int64_t E = c.num_experts, d = c.hidden_size, ff = c.moe_intermediate_size;
  const std::size_t matrix = static_cast<std::size_t>(ff * d);
  const std::string experts = moe_experts_prefix(c);
  for (const char* module : {"block_sparse_moe.", "mlp."}) {
    const std::string base = prefix + module;
    if (tensor == moe_router_tensor(c)) {
      if (in_files(base + "gate.weight")) return FusedSource{base + "gate.weight", {E, d}, 0, 0};
      continue;
    }
    if (tensor.rfind(experts, 0) != 0) return std::nullopt;
    const std::size_t dot = tensor.find('.', experts.size());
    const std::size_t e = std::stoul(tensor.substr(experts.size(), dot - experts.size()));
    const auto ei = static_cast<std::int64_t>(e);
    if (tensor == moe_expert_tensor(c, ei, ExpertMatrix::down)) {
      if (in_files(base + "experts.down_proj"))
        return FusedSource{base + "experts.down_proj", {E, d, ff}, e * matrix, matrix};
    } else if (in_files(base + "experts.gate_up_proj")) {
      const bool up = tensor == moe_expert_tensor(c, ei, ExpertMatrix::up);
      return FusedSource{base + "experts.gate_up_proj", {E, 2 * ff, d}, (2 * e + (up ? 1 : 0)) * matrix, matrix};
    }
  }
  return std::nullopt;
}

}  // namespace

HfModelReader::HfModelReader(const std::filesystem::path& dir) : dir_(dir) {
  const auto config_path = dir / "config.json";
  config_json_ = read_json_file(config_path);
  config_ = parse_config(config_json_, config_path.string());

  // Which files, and (sharded) which file each tensor is promised in.
  std::map<std::string, std::string> promised;
  std::vector<std::string> file_names;
  const auto index_path = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(index_path)) {
    const json index = read_json_file(index_path);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      throw HfError(index_path.string() + ": no weight_map object");
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        throw HfError(index_path.string() + ": weight_map entry for '" + name + "' is not a plain file name");
      promised[name] = file.get<std::string>();
      if (std::find(file_names.begin(), file_names.end(), file.get<std::string>()) == file_names.end())
        file_names.push_back(file.get<std::string>());
    }
    for (const auto& f : file_names)
      if (!std::filesystem::exists(dir / f))
        throw HfError((dir / f).string() + ": shard listed in " + index_path.string() + " is missing");
  } else if (std::filesystem::exists(dir / "model.safetensors")) {
    file_names.push_back("model.safetensors");
  } else {
    throw HfError(dir.string() + ": neither model.safetensors nor model.safetensors.index.json found");
  }

  std::map<std::string, Location> found;  // every tensor of every file, by name in file
  for (const auto& f : file_names) {
    files_.push_back(std::make_unique<SafetensorsReader>(dir / f));
    for (const auto& e : files_.back()->entries()) {
      if (found.count(e.name))
        throw HfError((dir / f).string() + ": tensor '" + e.name + "' also in " + found[e.name].file->path().string());
      found[e.name] = Location{files_.back().get(), e.name, {}, 0, 0, std::nullopt, nullptr};
    }
  }
  for (const auto& [name, file] : promised)
    if (!found.count(name) || found[name].file->path().filename() != file)
      throw HfError((dir / file).string() + ": tensor '" + name + "' listed in " + index_path.string() +
                    " is not in this file");

  // Map every expected tensor to its place and check it now, so a bad file fails before any reading.
  std::set<std::string> used;
  for (std::int64_t s = 0; s < num_stages(config_); ++s) {
    const ParamLayout layout = stage_layout(config_, s);
    for (const auto& t : layout.tensors) {
      const HfTensorName hn = hf_tensor(config_, layout, t);
      std::string in_file = hn.name;
      // GPT-2 files saved from GPT2Model lack the "transformer." prefix.
      if (!found.count(in_file) && config_.is_gpt2() && in_file.rfind("transformer.", 0) == 0)
        in_file = in_file.substr(12);
      std::vector<std::int64_t> shape_in_file = hn.file_shape;
      Location loc;
      if (found.count(in_file)) {
        loc = found[in_file];
      } else if (const auto expert = gpt_oss::expert_source(config_, layout.prefix, t.name,
                                                            [&](const std::string& n) { return found.count(n) > 0; })) {
        loc = found[expert->name];
        loc.expert = *expert;
        const SafetensorsEntry& e = *loc.file->find(expert->name);
        if (expert->mxfp4) {  // U8 blocks and scales, checked here (the generic checks below are for floats)
          loc.scales_file = found[expert->scales].file;
          const SafetensorsEntry& sc = *loc.scales_file->find(expert->scales);
          for (const SafetensorsEntry* u : {&e, &sc})
            if (u->dtype != "U8")
              throw HfError(loc.file->path().string() + ": MXFP4 tensor '" + u->name + "' has dtype " + u->dtype +
                            ", expected U8");
          if (e.shape != expert->shape || sc.shape != expert->scales_shape)
            throw HfError(loc.file->path().string() + ": MXFP4 tensors '" + e.name + "' " + shape_string(e.shape) +
                          " and '" + sc.name + "' " + shape_string(sc.shape) + ", expected " +
                          shape_string(expert->shape) + " and " + shape_string(expert->scales_shape) +
                          " from config.json");
          locations_[hn.name] = loc;
          used.insert(expert->name);
          used.insert(expert->scales);
          continue;
        }
        in_file = expert->name;
        shape_in_file = expert->shape;
      } else if (const auto fused = fused_source(config_, layout.prefix, t.name,
                                                 [&](const std::string& n) { return found.count(n) > 0; })) {
        in_file = fused->name;
        loc = found[in_file];
        if (fused->count > 0) loc.fused_shape = fused->shape, loc.first = fused->first, loc.count = fused->count;
        shape_in_file = fused->shape;
      } else {
        throw HfError(dir.string() + ": tensor '" + hn.name + "' (" + arch_name(config_.arch) + ", shape " +
                      shape_string(hn.file_shape) + ") is in none of the safetensors files");
      }
      const SafetensorsEntry& e = *loc.file->find(in_file);
      if (!parse_dtype(e.dtype))
        throw HfError(loc.file->path().string() + ": tensor '" + in_file + "' has dtype " + e.dtype +
                      " (supported: F32, BF16, F16)");
      if (e.shape != shape_in_file)
        throw HfError(loc.file->path().string() + ": tensor '" + in_file + "' has shape " + shape_string(e.shape) +
                      ", expected " + shape_string(shape_in_file) + " from config.json");
      locations_[hn.name] = loc;
      used.insert(in_file);
    }
  }
  for (const auto& [name, loc] : found) {
    if (used.count(name)) continue;
    const std::string full = config_.is_gpt2() && name.rfind("transformer.", 0) != 0 && name != "lm_head.weight"
                                 ? "transformer." + name
                                 : name;
    if (!ignorable(config_, full) && !ignorable(config_, name))
      throw HfError(loc.file->path().string() + ": unexpected tensor '" + name + "' for " +
                    architecture_class(config_.arch) + " with this config.json");
  }
}

HfModelReader::~HfModelReader() = default;

const HfModelReader::Location& HfModelReader::locate(const std::string& name) const {
  auto it = locations_.find(name);
  if (it == locations_.end()) throw HfError(dir_.string() + ": no tensor '" + name + "'");
  return it->second;
}

void HfModelReader::read_stage(std::int64_t stage, float* dst) const {
  const ParamLayout layout = stage_layout(config_, stage);
  std::memset(dst, 0, layout.total_floats * sizeof(float));
  std::set<std::string> read_with_gate;  // gpt-oss's fused up matrices, filled from their gate's slab
  for (const auto& t : layout.tensors) {
    const HfTensorName hn = hf_tensor(config_, layout, t);
    const Location& loc = locate(hn.name);
    if (read_with_gate.count(t.name)) continue;
    if (loc.expert && gpt_oss::reads_gate_and_up(*loc.expert)) {
      const std::string up = moe_expert_tensor(config_, loc.expert->expert, ExpertMatrix::up);
      gpt_oss::read_expert(config_, *loc.expert, *loc.file, loc.scales_file, dst + t.offset,
                           dst + layout.at(up).offset);
      read_with_gate.insert(up);
    } else if (loc.expert)
      gpt_oss::read_expert(config_, *loc.expert, *loc.file, loc.scales_file, dst + t.offset);
    else if (loc.count > 0)
      loc.file->read_f32_range(loc.name_in_file, loc.fused_shape, loc.first, loc.count, dst + t.offset);
    else if (hn.transposed)
      loc.file->read_f32_transposed(loc.name_in_file, hn.file_shape, dst + t.offset);
    else
      loc.file->read_f32(loc.name_in_file, hn.file_shape, dst + t.offset);
  }
}

void write_hf_model(const std::filesystem::path& dir, const ModelConfig& c,
                    const std::function<const float*(std::int64_t)>& stage_source, const HfExportOptions& options) {
  json config = config_to_json(c, options.base_config);
  config["torch_dtype"] = options.dtype == DType::f32    ? "float32"
                          : options.dtype == DType::bf16 ? "bfloat16"
                                                         : "float16";
  std::filesystem::create_directories(dir);

  // gpt-oss's experts go out fused, after the rest of their layer (gpt_oss_experts.hpp).
  auto fused_experts = [&](const ParamLayout& layout) { return c.is_gpt_oss() && layout.kind == StageKind::layer; };
  std::vector<PlannedTensor> plan;
  for (std::int64_t s = 0; s < num_stages(c); ++s) {
    const ParamLayout layout = stage_layout(c, s);
    for (const auto& t : layout.tensors) {
      if (fused_experts(layout) && gpt_oss::is_expert_tensor(c, t.name)) continue;
      const HfTensorName hn = hf_tensor(c, layout, t);
      plan.push_back({hn.name, hn.file_shape});
    }
    if (fused_experts(layout))
      for (auto& t : gpt_oss::fused_tensors(c, layout.prefix)) plan.push_back(std::move(t));
  }
  // Stale weight files of an earlier export would confuse transformers (index vs single file), and
  // config.json goes first and comes back last, so a failed export never looks like a model.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string n = entry.path().filename().string();
    if (ends_with(n, ".safetensors") || n == "model.safetensors.index.json" || n == "config.json")
      std::filesystem::remove(entry.path());
  }
  SafetensorsModelWriter writer(dir, std::move(plan), options.dtype, options.max_shard_bytes);
  for (std::int64_t s = 0; s < num_stages(c); ++s) {
    const ParamLayout layout = stage_layout(c, s);
    const float* buf = stage_source(s);
    for (const auto& t : layout.tensors) {
      if (fused_experts(layout) && gpt_oss::is_expert_tensor(c, t.name)) continue;
      const HfTensorName hn = hf_tensor(c, layout, t);
      if (hn.transposed)
        writer.write_transposed(hn.name, buf + t.offset);
      else
        writer.write(hn.name, buf + t.offset);
    }
    if (fused_experts(layout)) gpt_oss::write_fused(writer, c, layout, buf);
  }
  writer.finish();
  if (!options.tokenizer_dir.empty()) copy_tokenizer_files(options.tokenizer_dir, dir);
  write_text_atomically(dir / "config.json", config.dump(2) + "\n");
  fsync_directory(dir);
}

std::vector<std::string> copy_tokenizer_files(const std::filesystem::path& from, const std::filesystem::path& to) {
  static const char* names[] = {
      "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
      "merges.txt",     "tokenizer.model",       "added_tokens.json",       "generation_config.json"};
  if (!std::filesystem::is_directory(from)) throw HfError(from.string() + ": tokenizer directory not found");
  std::vector<std::string> copied;
  for (const char* n : names) {
    if (!std::filesystem::exists(from / n)) continue;
    std::filesystem::copy_file(from / n, to / n, std::filesystem::copy_options::overwrite_existing);
    copied.push_back(n);
  }
  return copied;
}

}  // namespace mt::hf
