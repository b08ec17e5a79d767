// gpt-oss's experts in Hugging Face files, and the layout's per-expert tensors they become.
//
// transformers' GptOssExperts (4.55+) keeps one layer's experts in four tensors, multiplied as x @ W:
//   mlp.experts.gate_up_proj       [E, hidden, 2 I]  gate and up interleaved: columns 2i (gate), 2i + 1 (up)
//   mlp.experts.gate_up_proj_bias  [E, 2 I]          interleaved the same way
//   mlp.experts.down_proj          [E, I, hidden]
//   mlp.experts.down_proj_bias     [E, hidden]
// The layout keeps each expert's matrices as torch.nn.Linear ([out, in]) under per-expert names
// (param_layout.hpp), so reading transposes and de-interleaves, and the export does the reverse.
//
// The hub's checkpoints hold the two matrices in MXFP4 instead (quantization_config quant_method "mxfp4";
// transformers' integrations/mxfp4.py): gate_up_proj_blocks U8 [E, 2 I, hidden / 32, 16] with
// gate_up_proj_scales U8 [E, 2 I, hidden / 32], and down_proj_blocks [E, hidden, I / 32, 16] with
// down_proj_scales [E, hidden, I / 32]. Row r of a matrix's blocks is its output column r (of 2 I, or of
// hidden): 32 values per block, two 4-bit e2m1 codes per byte (low nibble first), times 2^(scale - 127).
// A dequantized row is exactly one of the layout's rows (gate row i = blocks row 2i, up = 2i + 1, down
// row d = blocks row d). They are read, never written: the export is bf16 or fp32.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/param_layout.hpp"
#include "storage/hf/safetensors_reader.hpp"
#include "storage/hf/safetensors_writer.hpp"

namespace mt::hf::gpt_oss {

// Whether `tensor` (a layer's, relative to its prefix) is one of gpt-oss's per-expert tensors.
bool is_expert_tensor(const ModelConfig& c, const std::string& tensor);

// Where a per-expert tensor comes from in the files: the fused tensor (or the MXFP4 blocks and their
// scales), its shape in the file, and which part of it is ours.
struct ExpertSource {
  bool mxfp4 = false;
  std::string name;                 // fused tensor, or the blocks
  std::vector<std::int64_t> shape;  // its shape in the file
  std::string scales;               // MXFP4: the scales tensor
  std::vector<std::int64_t> scales_shape;
  std::int64_t expert = 0;
  ExpertMatrix matrix = ExpertMatrix::gate;
  bool bias = false;
};
// The source of `tensor` of the layer at `prefix` ("model.layers.N."), given which names the files hold;
// nullopt when it is not an expert tensor or neither form is in the files.
std::optional<ExpertSource> expert_source(const ModelConfig& c, const std::string& prefix, const std::string& tensor,
                                          const std::function<bool(const std::string&)>& in_files);
// Reads it into dst (the layout's shape); `scales_file` is the file holding s.scales (MXFP4 only).
// up_dst (a fused gate matrix only): the same expert's up matrix too, from the one slab both live in.
void read_expert(const ModelConfig& c, const ExpertSource& s, const SafetensorsReader& file,
                 const SafetensorsReader* scales_file, float* dst, float* up_dst = nullptr);
// Whether read_expert fills a second destination for this source (read_stage reads the pair once).
inline bool reads_gate_and_up(const ExpertSource& s) { return !s.mxfp4 && !s.bias && s.matrix == ExpertMatrix::gate; }

// MXFP4 rows: out[r * cols + j] for `rows` rows of `cols` values (cols a multiple of 32) from their
// blocks (rows x cols / 2 bytes) and scales (rows x cols / 32 bytes).
void dequantize_mxfp4(const std::uint8_t* blocks, const std::uint8_t* scales, std::size_t rows, std::size_t cols,
                      float* out);

// The export: the four fused tensors of the layer at `prefix`, planned, then written from the layer's
// buffer in that order.
std::vector<PlannedTensor> fused_tensors(const ModelConfig& c, const std::string& prefix);
void write_fused(SafetensorsModelWriter& w, const ModelConfig& c, const ParamLayout& layout, const float* buf);

}  // namespace mt::hf::gpt_oss
