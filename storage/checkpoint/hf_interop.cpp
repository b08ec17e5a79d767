#include "storage/checkpoint/hf_interop.hpp"

#include <vector>

#include "kernels/param_layout.hpp"

namespace mt::ckpt {

namespace fs = std::filesystem;

void export_to_hf(const CheckpointReader& checkpoint, const fs::path& out_dir, hf::HfExportOptions options) {
  const ModelConfig& c = checkpoint.model_config();
  const nlohmann::json& base = checkpoint.manifest().at("model_config");
  options.base_config = &base;
  if (options.tokenizer_dir.empty() && fs::is_directory(checkpoint.dir() / "tokenizer"))
    options.tokenizer_dir = checkpoint.dir() / "tokenizer";
  std::vector<float> buf;
  hf::write_hf_model(
      out_dir, c,
      [&](std::int64_t stage) -> const float* {
        buf.resize(stage_layout(c, stage).total_floats);
        checkpoint.read_stage_state(stage, "params", buf.data());
        return buf.data();
      },
      options);
}

fs::path import_from_hf(const fs::path& hf_dir, const fs::path& root, std::int64_t step,
                        CheckpointWriterOptions options) {
  const hf::HfModelReader model(hf_dir);
  options.hf_config = model.config_json();
  if (options.tokenizer_dir.empty()) options.tokenizer_dir = hf_dir;
  CheckpointWriter writer(root, step, model.config(), options);
  std::vector<float> buf;
  for (std::int64_t s = 0; s < num_stages(model.config()); ++s) {
    buf.resize(stage_layout(model.config(), s).total_floats);
    model.read_stage(s, buf.data());
    StageState st;
    st.params = buf.data();
    writer.write_stage(s, st);
  }
  return writer.finalize({{"source", "imported from Hugging Face directory " + fs::absolute(hf_dir).string()}});
}

}  // namespace mt::ckpt
