#include "storage/checkpoint/checkpoint_reader.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/param_layout.hpp"
#include "storage/checkpoint/checkpoint_dir.hpp"
#include "storage/checkpoint/checksum.hpp"
#include "storage/checkpoint/h5_util.hpp"
#include "storage/checkpoint/manifest.hpp"
#include "storage/checkpoint/shard_digest.hpp"
#include "storage/hf/hf_config.hpp"

namespace mt::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

CheckpointReader::CheckpointReader(const fs::path& dir, Verify verify) : dir_(dir) {
  h5::quiet_errors();
  if (!fs::is_directory(dir)) throw CheckpointError(dir.string() + ": no such checkpoint directory");
  const fs::path mfile = dir / kManifestFile;
  manifest_ = read_manifest(mfile);
  try {
    step_ = manifest_.at("step").get<std::int64_t>();
    config_ = hf::parse_config(manifest_.at("model_config"), mfile.string() + " (model_config)");
    const auto& stages = manifest_.at("stages");
    if (!stages.is_array() || static_cast<std::int64_t>(stages.size()) != num_stages(config_))
      throw CheckpointError(mfile.string() + ": lists " + std::to_string(stages.size()) + " stages, the model has " +
                            std::to_string(num_stages(config_)));
    for (std::size_t i = 0; i < stages.size(); ++i)
      if (stages[i].at("stage").get<std::int64_t>() != static_cast<std::int64_t>(i))
        throw CheckpointError(mfile.string() + ": stages are not listed in order 0..N-1");
    if (!manifest_.at("shards").is_array() || !manifest_.at("states").is_array() || !manifest_.contains("run"))
      throw CheckpointError(mfile.string() + ": malformed manifest");
  } catch (const json::exception& e) {
    throw CheckpointError(mfile.string() + ": malformed manifest: " + e.what());
  } catch (const hf::HfError& e) {
    throw CheckpointError(e.what());
  }
  // Sizes are cheap to check and catch truncation at once.
  for (const auto& s : manifest_["shards"]) {
    const fs::path f = dir / s.at("file").get<std::string>();
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    if (ec) throw CheckpointError(f.string() + ": shard is missing (" + ec.message() + ")");
    if (size != s.at("bytes").get<std::uint64_t>())
      throw CheckpointError(f.string() + ": shard has " + std::to_string(size) + " bytes, the manifest says " +
                            std::to_string(s.at("bytes").get<std::uint64_t>()) + " (truncated or damaged)");
  }
  if (verify == Verify::full) verify_files();
}

CheckpointReader CheckpointReader::open(const fs::path& path, Fallback fallback, Verify verify) {
  if (!fs::exists(path)) throw CheckpointError(path.string() + ": no such checkpoint or checkpoint root");
  if (fs::exists(path / kManifestFile) || parse_step_dir_name(path.filename().string()))
    return CheckpointReader(path, verify);
  const auto latest = read_latest(path);
  if (fallback == Fallback::none) {
    if (!latest)
      throw CheckpointError(path.string() +
                            ": no `latest` pointer: not a checkpoint root, or no checkpoint published yet");
    return CheckpointReader(*latest, verify);
  }
  // Newest first: the latest pointer, then every other published directory by decreasing step.
  std::vector<fs::path> candidates;
  if (latest) candidates.push_back(*latest);
  auto all = list_checkpoints(path);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (!latest || it->dir.filename() != latest->filename()) candidates.push_back(it->dir);
  std::vector<std::string> skipped;
  for (const auto& c : candidates) {
    try {
      CheckpointReader r(c, verify);
      r.skipped_ = std::move(skipped);
      return r;
    } catch (const CheckpointError& e) {
      skipped.push_back(e.what());
    }
  }
  std::string why;
  for (const auto& s : skipped) why += "\n  " + s;
  throw CheckpointError(path.string() + ": no usable checkpoint" +
                        (why.empty() ? std::string(" (none published)") : ":" + why));
}

bool CheckpointReader::has_state(const std::string& state) const {
  const auto& s = manifest_.at("states");
  return std::find(s.begin(), s.end(), state) != s.end();
}

std::uint64_t CheckpointReader::total_bytes() const {
  std::uint64_t n = 0;
  for (const auto& s : manifest_.at("shards")) n += s.at("bytes").get<std::uint64_t>();
  return n;
}

void CheckpointReader::verify_files() const {
  for (const auto& s : manifest_.at("shards")) {
    const fs::path f = dir_ / s.at("file").get<std::string>();
    try {
      verify_shard(f, s);
    } catch (const json::exception& e) {
      throw CheckpointError((dir_ / kManifestFile).string() + ": malformed shard entry for " + f.string() + ": " +
                            e.what());
    } catch (const std::logic_error& e) {  // a checksum that is not hex
      throw CheckpointError((dir_ / kManifestFile).string() + ": malformed shard entry for " + f.string() + ": " +
                            e.what());
    }
  }
}

void CheckpointReader::verify_datasets() const {
  std::vector<float> buf;
  for (std::int64_t s = 0; s < num_stages(config_); ++s) {
    buf.resize(stage_layout(config_, s).total_floats);
    for (const auto& state : manifest_.at("states")) read_stage_state(s, state.get<std::string>(), buf.data());
  }
}

void CheckpointReader::read_stage(std::int64_t stage, float* params, float* exp_avg, float* exp_avg_sq) const {
  if (params) read_stage_state(stage, "params", params);
  if (exp_avg) read_stage_state(stage, "exp_avg", exp_avg);
  if (exp_avg_sq) read_stage_state(stage, "exp_avg_sq", exp_avg_sq);
}

void CheckpointReader::read_stage_state(std::int64_t stage, const std::string& state, float* dst) const {
  if (stage < 0 || stage >= num_stages(config_))
    throw CheckpointError(dir_.string() + ": stage " + std::to_string(stage) + " out of range");
  if (!has_state(state)) throw CheckpointError(dir_.string() + ": checkpoint has no '" + state + "' state");
  h5::quiet_errors();
  const json& entry = manifest_.at("stages").at(static_cast<std::size_t>(stage));
  const fs::path file = dir_ / entry.at("shard").get<std::string>();
  const std::string group = entry.at("group").get<std::string>() + "/" + state;
  auto fail = [&](const std::string& what) -> void {
    const std::string h5 = h5::last_error();
    throw CheckpointError(file.string() + ": " + what + (h5.empty() ? "" : " (" + h5 + ")"));
  };
  const ParamLayout layout = stage_layout(config_, stage);
  h5::Handle f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.valid()) fail("cannot open HDF5 shard (damaged?)");
  h5::Handle g(H5Gopen2(f.get(), group.c_str(), H5P_DEFAULT), H5Gclose);
  if (!g.valid()) fail("no group " + group);
  std::memset(dst, 0, layout.total_floats * sizeof(float));
  for (const auto& t : layout.tensors) {
    const std::string where = group + "/" + t.name;
    h5::Handle ds(H5Dopen2(g.get(), t.name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) fail("no dataset " + where);
    h5::Handle space(H5Dget_space(ds.get()), H5Sclose);
    std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(0, H5Sget_simple_extent_ndims(space.get()))));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    if (!std::equal(dims.begin(), dims.end(), t.shape.begin(), t.shape.end(),
                    [](hsize_t a, std::int64_t b) { return a == static_cast<hsize_t>(b); }))
      fail("dataset " + where + " has the wrong shape for this model");
    if (H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst + t.offset) < 0)
      fail("reading dataset " + where + " failed");
    std::uint64_t want = 0;
    if (!h5::get_attr_u64(ds.get(), kChecksumAlgorithm, &want)) fail("dataset " + where + " has no checksum attribute");
    const std::uint64_t got = checksum(dst + t.offset, t.numel * sizeof(float));
    if (got != want)
      fail("dataset " + where + " checksum " + checksum_hex(got) + " differs from the stored " + checksum_hex(want) +
           " (damaged)");
  }
}

}  // namespace mt::ckpt
