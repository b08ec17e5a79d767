#include "storage/checkpoint/checkpoint_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "kernels/param_layout.hpp"
#include "storage/checkpoint/checkpoint_dir.hpp"
#include "storage/checkpoint/checksum.hpp"
#include "storage/checkpoint/dataset_data_writer.hpp"
#include "storage/checkpoint/h5_util.hpp"
#include "storage/checkpoint/manifest.hpp"
#include "storage/checkpoint/shard_digest.hpp"
#include "storage/hf/file_util.hpp"
#include "storage/hf/hf_config.hpp"
#include "storage/hf/hf_model.hpp"

#ifndef MEGATRAIN_VERSION
#define MEGATRAIN_VERSION "unknown"
#endif

namespace mt::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

struct CheckpointWriter::Shard {
  std::string name;
  fs::path path;
  h5::Handle file;
  std::uint64_t data_bytes = 0;
  std::vector<DatasetExtent> extents;
  std::unique_ptr<DatasetDataWriter> data;  // the datasets' bytes (HDF5 writes the metadata)
};

namespace {

std::atomic<int> g_writer_counter{0};

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string hdf5_version() {
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  return std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel);
}

void fsync_file(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(file.string() + ": cannot open for fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw CheckpointError(file.string() + ": fsync failed: " + std::strerror(err));
}

// plan.json (temp file, fsync, rename, like the manifest): durable once the directory is fsynced.
void write_plan(const fs::path& file, const json& plan) {
  try {
    hf::write_text_atomically(file, plan.dump(1) + "\n");
  } catch (const hf::HfError& e) {
    throw CheckpointError(e.what());
  }
}

const char* kind_name(StageKind k) {
  return k == StageKind::embedding ? "embedding" : k == StageKind::head ? "head" : "layer";
}

const char* state_description(const std::string& state) {
  if (state == "params") return "fp32 master weights";
  if (state == "exp_avg") return "AdamW first moment (m), fp32";
  return "AdamW second moment (v), fp32";
}

}  // namespace

CheckpointWriter::CheckpointWriter(fs::path root, std::int64_t step, ModelConfig config,
                                   CheckpointWriterOptions options)
    : root_(std::move(root)), step_(step), config_(config), options_(std::move(options)) {
  if (step_ < 0) throw CheckpointError("checkpoint step must be >= 0, got " + std::to_string(step_));
  try {
    config_.validate();
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(std::string("checkpoint: ") + e.what());
  }
  h5::quiet_errors();
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw CheckpointError(root_.string() + ": cannot create checkpoint root: " + ec.message());
  if (options_.temp_name.empty()) {
    temp_dir_ = root_ / (std::string(kTempPrefix) + step_dir_name(step_) + "-" + std::to_string(::getpid()) + "-" +
                         std::to_string(g_writer_counter++));
    fs::create_directory(temp_dir_, ec);
  } else {  // shared with the checkpoint's other writers: whoever comes first makes it
    if (options_.temp_name.rfind(kTempPrefix, 0) != 0 || options_.temp_name.find('/') != std::string::npos)
      throw CheckpointError("checkpoint: a shared temporary directory name must start with " +
                            std::string(kTempPrefix) + " and name no subdirectory, got '" + options_.temp_name + "'");
    temp_dir_ = root_ / options_.temp_name;
    fs::create_directories(temp_dir_, ec);
  }
  if (ec) throw CheckpointError(temp_dir_.string() + ": cannot create: " + ec.message());
}

CheckpointWriter::~CheckpointWriter() {
  try {
    abort();
  } catch (...) {
  }
}

void CheckpointWriter::abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  h5::quiet_errors();
  if (shard_) shard_->file.reset();
  shard_.reset();
  if (!published_) {
    std::error_code ec;
    if (options_.part) {  // the directory is the publishing writer's: only this writer's files go
      for (const auto& e : fs::directory_iterator(temp_dir_, ec))
        if (e.path().filename().string().rfind(options_.shard_prefix, 0) == 0) fs::remove(e.path(), ec);
    } else {
      fs::remove_all(temp_dir_, ec);
    }
    failed_ = true;
  }
}

std::uint64_t CheckpointWriter::bytes_written() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_written_;
}

std::uint64_t CheckpointWriter::direct_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return direct_bytes_;
}

void CheckpointWriter::open_shard_locked() {
  auto s = std::make_unique<Shard>();
  s->name = shard_file_name(shards_.size(), options_.shard_prefix);
  s->path = temp_dir_ / s->name;
  h5::Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // v1.8+ object headers carry checksums; datasets from 64 KiB up start on 4 KiB boundaries, so their
  // bytes can go to disk with O_DIRECT (dataset_data_writer.hpp).
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  H5Pset_alignment(fapl.get(), 64u << 10, 4096);
  // No modification times in any object header, the root group's included: the same state gives the
  // same file, byte for byte.
  h5::Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  H5Pset_obj_track_times(fcpl.get(), false);
  s->file = h5::Handle(H5Fcreate(s->path.c_str(), H5F_ACC_EXCL, fcpl.get(), fapl.get()), H5Fclose);
  if (!s->file.valid()) throw CheckpointError(s->path.string() + ": cannot create HDF5 file: " + h5::last_error());
  s->data = std::make_unique<DatasetDataWriter>(s->path, options_.direct_io);
  h5::set_attr(s->file.get(), "format", std::string(kFormatName));
  h5::set_attr(s->file.get(), "format_version", std::int64_t{kFormatVersion});
  h5::set_attr(s->file.get(), "step", step_);
  h5::set_attr(s->file.get(), "model_type", std::string(arch_name(config_.arch)));
  h5::set_attr(s->file.get(), "checksum_algorithm", std::string(kChecksumAlgorithm));
  shard_ = std::move(s);
}

void CheckpointWriter::close_shard_locked() {
  if (!shard_) return;
  auto s = std::move(shard_);
  if (!s->file.close())
    throw CheckpointError(s->path.string() + ": closing HDF5 file failed (disk full?): " + h5::last_error());
  fsync_file(s->path);
  direct_bytes_ += s->data->direct_bytes();
  // Only HDF5's metadata is read back: the datasets' checksums came from the caller's buffers.
  shards_.push_back(shard_manifest_entry(s->name, digest_written_shard(s->path, s->extents), s->extents));
}

void CheckpointWriter::write_stage(std::int64_t stage, const StageState& state) {
  std::lock_guard<std::mutex> lock(mutex_);
  h5::quiet_errors();
  if (published_ || failed_)
    throw CheckpointError(temp_dir_.string() + ": write_stage after finalize, abort or a failure");
  if (stage < 0 || stage >= num_stages(config_))
    throw CheckpointError(temp_dir_.string() + ": stage " + std::to_string(stage) + " out of range [0, " +
                          std::to_string(num_stages(config_)) + ")");
  if (stages_.count(stage))
    throw CheckpointError(temp_dir_.string() + ": stage " + std::to_string(stage) + " written twice");
  std::vector<std::pair<std::string, const float*>> states;
  if (state.params) states.emplace_back("params", state.params);
  if (state.exp_avg) states.emplace_back("exp_avg", state.exp_avg);
  if (state.exp_avg_sq) states.emplace_back("exp_avg_sq", state.exp_avg_sq);
  std::vector<std::string> names;
  names.reserve(states.size());
  for (const auto& st : states) names.push_back(st.first);
  if (names.empty()) throw CheckpointError("write_stage(" + std::to_string(stage) + "): no buffers given");
  if (state_names_.empty()) state_names_ = names;
  if (names != state_names_)
    throw CheckpointError("write_stage(" + std::to_string(stage) +
                          "): every stage must save the same buffers as the first");

  try {
    const ParamLayout layout = stage_layout(config_, stage);
    const std::uint64_t stage_bytes = layout.param_count() * sizeof(float) * states.size();
    if (shard_ && shard_->data_bytes > 0 && shard_->data_bytes + stage_bytes > options_.max_shard_bytes)
      close_shard_locked();
    if (!shard_) open_shard_locked();
    Shard& sh = *shard_;
    const std::string group_name = stage_group_name(stage);
    auto fail = [&](const std::string& what) -> void {
      throw CheckpointError(sh.path.string() + ": " + group_name + ": " + what + ": " + h5::last_error());
    };
    // No modification times (see open_shard_locked).
    h5::Handle gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
    H5Pset_obj_track_times(gcpl.get(), false);
    h5::Handle group(H5Gcreate2(sh.file.get(), group_name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose);
    if (!group.valid()) fail("cannot create group");
    h5::set_attr(group.get(), "stage", stage);
    h5::set_attr(group.get(), "kind", std::string(kind_name(layout.kind)));
    h5::set_attr(group.get(), "prefix", layout.prefix);
    h5::set_attr_u64(group.get(), "total_floats", layout.total_floats);

    h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);    // data is written once: no fill pass first
    H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);  // the storage's address is known at creation
    H5Pset_obj_track_times(dcpl.get(), false);
    for (const auto& [state_name, buffer] : states) {
      h5::Handle sg(H5Gcreate2(group.get(), state_name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose);
      if (!sg.valid()) fail("cannot create group " + state_name);
      h5::set_attr(sg.get(), "description", std::string(state_description(state_name)));
      for (const auto& t : layout.tensors) {
        std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
        h5::Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
        h5::Handle ds(
            H5Dcreate2(sg.get(), t.name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
            H5Dclose);
        if (!ds.valid()) fail("cannot create dataset " + state_name + "/" + t.name);
        const float* data = buffer + t.offset;
        const haddr_t where = H5Dget_offset(ds.get());
        if (where == HADDR_UNDEF) fail("dataset " + state_name + "/" + t.name + " has no contiguous storage");
        // The bytes go beside HDF5, straight to the storage it allocated (little-endian fp32 on
        // every host we build for, as the dataset's type says).
        sh.data->write(static_cast<std::uint64_t>(where), data, t.numel * sizeof(float));
        const std::uint64_t sum = checksum(data, t.numel * sizeof(float));
        h5::set_attr_u64(ds.get(), kChecksumAlgorithm, sum);
        std::string extent_name = group_name;
        extent_name.append("/").append(state_name).append("/").append(t.name);
        sh.extents.push_back({std::move(extent_name), static_cast<std::uint64_t>(where), t.numel * sizeof(float), sum});
        h5::set_attr_u64(ds.get(), "offset", t.offset);
        if (!ds.close()) fail("closing dataset " + state_name + "/" + t.name + " failed");
        sh.data_bytes += t.numel * sizeof(float);
        bytes_written_ += t.numel * sizeof(float);
      }
    }
    // Start writing this stage to disk now, in the background: the final fsync then waits for little,
    // and dirty pages do not pile up in RAM while the next stages are written.
    sh.data->start_writeback();
    stages_[stage] = {{"stage", stage},          {"shard", sh.name},
                      {"group", group_name},     {"kind", kind_name(layout.kind)},
                      {"prefix", layout.prefix}, {"total_floats", layout.total_floats}};
  } catch (const std::runtime_error& e) {
    failed_ = true;
    if (dynamic_cast<const CheckpointError*>(&e)) throw;
    throw CheckpointError(temp_dir_.string() + ": stage " + std::to_string(stage) + ": " + e.what());
  }
}

void CheckpointWriter::failing_on_error(const std::function<void()>& body) {
  try {
    body();
  } catch (const hf::HfError& e) {
    failed_ = true;
    throw CheckpointError(e.what());
  } catch (const CheckpointError&) {
    failed_ = true;
    throw;
  } catch (const std::exception& e) {
    failed_ = true;
    throw CheckpointError(temp_dir_.string() + ": " + e.what());
  }
}

json CheckpointWriter::close_part() {
  std::lock_guard<std::mutex> lock(mutex_);
  h5::quiet_errors();
  if (!options_.part) throw CheckpointError(temp_dir_.string() + ": close_part on the publishing writer");
  if (published_ || failed_)
    throw CheckpointError(temp_dir_.string() + ": close_part after close_part, abort or a failure");
  failing_on_error([&] {
    close_shard_locked();
    hf::fsync_directory(temp_dir_);  // this writer's file names are durable too
  });
  published_ = true;  // handed over: the publishing writer owns the files now
  json part{{"states", state_names_}, {"stages", json::array()}, {"shards", shards_}, {"bytes", bytes_written_}};
  for (const auto& [stage, entry] : stages_) part["stages"].push_back(entry);
  return part;
}

void CheckpointWriter::add_part(const json& part) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (options_.part || published_ || failed_)
    throw CheckpointError(temp_dir_.string() + ": add_part needs the publishing writer before finalize");
  h5::quiet_errors();
  try {
    close_shard_locked();  // this writer's stages come first in the manifest's shards, then each part's
    const auto names = part.at("states").get<std::vector<std::string>>();
    if (!part.at("stages").empty()) {
      if (state_names_.empty()) state_names_ = names;
      if (names != state_names_)
        throw CheckpointError(temp_dir_.string() + ": a part saves other buffers than this checkpoint's stages");
    }
    for (const auto& entry : part.at("stages")) {
      const auto stage = entry.at("stage").get<std::int64_t>();
      if (stage < 0 || stage >= num_stages(config_) || stages_.count(stage))
        throw CheckpointError(temp_dir_.string() + ": a part's stage " + std::to_string(stage) +
                              " is out of range or written twice");
      stages_[stage] = entry;
    }
    for (const auto& shard : part.at("shards")) {
      const auto file = shard.at("file").get<std::string>();
      for (const auto& mine : shards_)
        if (mine.at("file").get<std::string>() == file)
          throw CheckpointError(temp_dir_.string() + ": two parts name the shard " + file);
      if (!fs::is_regular_file(temp_dir_ / file))
        throw CheckpointError((temp_dir_ / file).string() + ": a part's shard is not in the checkpoint's directory");
      shards_.push_back(shard);
    }
    bytes_written_ += part.at("bytes").get<std::uint64_t>();
  } catch (const json::exception& e) {
    failed_ = true;
    throw CheckpointError(temp_dir_.string() + ": a part's description is malformed: " + e.what());
  } catch (const CheckpointError&) {
    failed_ = true;
    throw;
  }
}

fs::path CheckpointWriter::finalize(const json& run_state) {
  std::lock_guard<std::mutex> lock(mutex_);
  h5::quiet_errors();
  if (options_.part) throw CheckpointError(temp_dir_.string() + ": a part writer does not publish (close_part)");
  if (published_ || failed_)
    throw CheckpointError(temp_dir_.string() + ": finalize after finalize, abort or a failure");
  // A missing stage is the caller's mistake, not a failure: it may still write it and finalize again.
  for (std::int64_t s = 0; s < num_stages(config_); ++s)
    if (!stages_.count(s))
      throw CheckpointError(temp_dir_.string() + ": finalize before stage " + std::to_string(s) + " was written");
  fs::path target = root_ / step_dir_name(step_);
  failing_on_error([&] {
    close_shard_locked();

    json manifest;
    manifest["format"] = kFormatName;
    manifest["format_version"] = kFormatVersion;
    manifest["step"] = step_;
    manifest["created_utc"] = utc_now();
    manifest["versions"] = {{"megatrain", MEGATRAIN_VERSION}, {"hdf5", hdf5_version()}, {"format", kFormatVersion}};
    manifest["checksum_algorithm"] = kChecksumAlgorithm;
    manifest["model_config"] =
        hf::config_to_json(config_, options_.hf_config.is_object() ? &options_.hf_config : nullptr);
    manifest["states"] = state_names_;
    manifest["stages"] = json::array();
    for (const auto& [s, entry] : stages_) manifest["stages"].push_back(entry);
    manifest["shards"] = shards_;
    if (!options_.tokenizer_dir.empty()) {
      fs::create_directory(temp_dir_ / "tokenizer");
      manifest["tokenizer_files"] = hf::copy_tokenizer_files(options_.tokenizer_dir, temp_dir_ / "tokenizer");
      for (const auto& f : manifest["tokenizer_files"]) fsync_file(temp_dir_ / "tokenizer" / f.get<std::string>());
      hf::fsync_directory(temp_dir_ / "tokenizer");
    }
    manifest["run"] = run_state.is_null() ? json::object() : run_state;
    if (!options_.plan.is_null()) write_plan(temp_dir_ / kPlanFile, options_.plan);
    write_manifest(temp_dir_ / kManifestFile, manifest);
    hf::fsync_directory(temp_dir_);

    // Publish: one rename. Re-publishing a step swaps the directories atomically (latest stays valid).
    if (fs::exists(target)) {
      if (::renameat2(AT_FDCWD, temp_dir_.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0)
        throw CheckpointError(target.string() + ": cannot replace the existing checkpoint: " + std::strerror(errno));
      published_ = true;
      std::error_code ec;
      fs::remove_all(temp_dir_, ec);  // now holds the replaced checkpoint
    } else {
      if (::rename(temp_dir_.c_str(), target.c_str()) != 0)
        throw CheckpointError(target.string() + ": cannot rename " + temp_dir_.string() + ": " + std::strerror(errno));
      published_ = true;
    }
    hf::fsync_directory(root_);
    write_latest(root_, target.filename().string());
  });
  apply_retention(root_, options_.keep_last);
  remove_stale_temp_dirs(root_);
  return target;
}

}  // namespace mt::ckpt
