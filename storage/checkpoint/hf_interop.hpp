// Checkpoint <-> Hugging Face model directory. Both stream one stage at a time: memory use is one
// stage buffer, never a second copy of the model.
#pragma once
#include <cstdint>
#include <filesystem>

#include "storage/checkpoint/checkpoint_reader.hpp"
#include "storage/checkpoint/checkpoint_writer.hpp"
#include "storage/hf/hf_model.hpp"

namespace mt::ckpt {

// Writes the checkpoint's fp32 master weights as a transformers model directory. The config.json is
// the manifest's model_config (which keeps the fields of the config the model was imported from);
// tokenizer files come from options.tokenizer_dir, else from the checkpoint's own tokenizer/ folder.
void export_to_hf(const CheckpointReader& checkpoint, const std::filesystem::path& out_dir,
                  hf::HfExportOptions options = {});

// Converts a Hugging Face directory into a params-only checkpoint ROOT/step-<step> (the starting point
// of a fine-tuning run: Adam moments start at zero) and publishes it. Tokenizer files found in hf_dir
// are stored with it. Returns the published directory.
std::filesystem::path import_from_hf(const std::filesystem::path& hf_dir, const std::filesystem::path& root,
                                     std::int64_t step = 0, CheckpointWriterOptions options = {});

}  // namespace mt::ckpt
