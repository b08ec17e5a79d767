#include "storage/hf/gpt_oss_experts.hpp"

#include <cmath>
#include <cstring>

#include "storage/hf/hf_config.hpp"

namespace mt::hf::gpt_oss {

namespace {

const char* const kGateUp = "mlp.experts.gate_up_proj";
const char* const kDown = "mlp.experts.down_proj";

// "mlp.experts.<e>.<gate_proj|up_proj|down_proj>.<weight|bias>" -> its parts.
struct ExpertName {
  std::int64_t expert;
  ExpertMatrix matrix;
  bool bias;
};
std::optional<ExpertName> parse_expert_name(const ModelConfig& c, const std::string& tensor) {
  const std::string prefix = moe_experts_prefix(c);
  if (!c.is_gpt_oss() || tensor.rfind(prefix, 0) != 0) return std::nullopt;
  const std::size_t dot = tensor.find('.', prefix.size());
  if (dot == std::string::npos) return std::nullopt;
  const std::string index = tensor.substr(prefix.size(), dot - prefix.size());
  if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const std::int64_t e = std::stoll(index);
  if (e >= c.num_experts) return std::nullopt;
  for (ExpertMatrix m : {ExpertMatrix::gate, ExpertMatrix::up, ExpertMatrix::down}) {
    if (tensor == moe_expert_tensor(c, e, m)) return ExpertName{e, m, false};
    if (tensor == moe_expert_bias_tensor(c, e, m)) return ExpertName{e, m, true};
  }
  return std::nullopt;
}

// FP4 e2m1 codes: sign, two exponent bits, one mantissa bit (OCP microscaling formats, MXFP4).
constexpr float kFp4Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

bool is_expert_tensor(const ModelConfig& c, const std::string& tensor) {
  return parse_expert_name(c, tensor).has_value();
}

void dequantize_mxfp4(const std::uint8_t* blocks, const std::uint8_t* scales, std::size_t rows, std::size_t cols,
                      float* out) {
  const std::size_t groups = cols / 32;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t g = 0; g < groups; ++g) {
      const int exponent = static_cast<int>(scales[r * groups + g]) - 127;  // e8m0, bias 127
      const std::uint8_t* b = blocks + (r * groups + g) * 16;
      float* o = out + r * cols + g * 32;
      for (int i = 0; i < 16; ++i) {
        o[2 * i] = std::ldexp(kFp4Values[b[i] & 0x0F], exponent);
        o[2 * i + 1] = std::ldexp(kFp4Values[b[i] >> 4], exponent);
      }
    }
}

std::optional<ExpertSource> expert_source(const ModelConfig& c, const std::string& prefix, const std::string& tensor,
                                          const std::function<bool(const std::string&)>& in_files) {
  const auto n = parse_expert_name(c, tensor);
  if (!n) return std::nullopt;
  const std::int64_t E = c.num_experts, d = c.hidden_size, ff = c.moe_intermediate_size;
  const bool gate_up = n->matrix != ExpertMatrix::down;
  ExpertSource s;
  s.expert = n->expert, s.matrix = n->matrix, s.bias = n->bias;
  const std::string base = prefix + (gate_up ? kGateUp : kDown);
  if (n->bias) {
    s.name = base + "_bias";
    s.shape = gate_up ? std::vector<std::int64_t>{E, 2 * ff} : std::vector<std::int64_t>{E, d};
    return in_files(s.name) ? std::optional<ExpertSource>(s) : std::nullopt;
  }
  if (in_files(base)) {
    s.name = base;
    s.shape = gate_up ? std::vector<std::int64_t>{E, d, 2 * ff} : std::vector<std::int64_t>{E, ff, d};
    return s;
  }
  if (in_files(base + "_blocks")) {
    const std::int64_t rows = gate_up ? 2 * ff : d, cols = gate_up ? d : ff;
    if (cols % 32 != 0)
      throw HfError(base + "_blocks: MXFP4 needs rows of a multiple of 32 values, these have " + std::to_string(cols));
    s.mxfp4 = true;
    s.name = base + "_blocks";
    s.shape = {E, rows, cols / 32, 16};
    s.scales = base + "_scales";
    s.scales_shape = {E, rows, cols / 32};
    if (!in_files(s.scales)) throw HfError(s.name + " is in the files but its scales " + s.scales + " are not");
    return s;
  }
  return std::nullopt;
}

void read_expert(const ModelConfig& c, const ExpertSource& s, const SafetensorsReader& file,
                 const SafetensorsReader* scales_file, float* dst, float* up_dst) {
  const auto d = static_cast<std::size_t>(c.hidden_size), ff = static_cast<std::size_t>(c.moe_intermediate_size);
  const auto e = static_cast<std::size_t>(s.expert);
  const bool gate_up = s.matrix != ExpertMatrix::down;
  const std::size_t parity = s.matrix == ExpertMatrix::up ? 1 : 0;  // up is the odd column of gate_up
  if (s.mxfp4) {
    const std::size_t cols = gate_up ? d : ff, row_bytes = cols / 2, row_scales = cols / 32;
    const std::size_t rows_per_expert = gate_up ? 2 * ff : d, rows = gate_up ? ff : d;
    std::vector<std::uint8_t> blocks(rows * row_bytes), scales(rows * row_scales);
    for (std::size_t r = 0; r < rows; ++r) {  // our row r is the file's row 2r + parity (gate/up) or r (down)
      const std::size_t file_row = e * rows_per_expert + (gate_up ? 2 * r + parity : r);
      file.read_u8_range(s.name, s.shape, file_row * row_bytes, row_bytes, blocks.data() + r * row_bytes);
      scales_file->read_u8_range(s.scales, s.scales_shape, file_row * row_scales, row_scales,
                                 scales.data() + r * row_scales);
    }
    dequantize_mxfp4(blocks.data(), scales.data(), rows, cols, dst);
    return;
  }
  if (s.bias) {
    if (!gate_up) return file.read_f32_range(s.name, s.shape, e * d, d, dst);
    std::vector<float> both(2 * ff);
    file.read_f32_range(s.name, s.shape, e * 2 * ff, 2 * ff, both.data());
    for (std::size_t i = 0; i < ff; ++i) dst[i] = both[2 * i + parity];
    return;
  }
  std::vector<float> slab(d * ff * (gate_up ? 2 : 1));  // this expert's [d, 2 ff] or [ff, d]
  file.read_f32_range(s.name, s.shape, e * slab.size(), slab.size(), slab.data());
  if (gate_up) {  // ours [ff, d]: row i = column 2i + parity of the file's [d, 2 ff]
    for (std::size_t k = 0; k < d; ++k)
      for (std::size_t i = 0; i < ff; ++i) dst[i * d + k] = slab[k * 2 * ff + 2 * i + parity];
    if (up_dst && s.matrix == ExpertMatrix::gate)  // the odd columns of the same slab
      for (std::size_t k = 0; k < d; ++k)
        for (std::size_t i = 0; i < ff; ++i) up_dst[i * d + k] = slab[k * 2 * ff + 2 * i + 1];
  } else {  // ours [d, ff] = the file's [ff, d] transposed
    for (std::size_t i = 0; i < ff; ++i)
      for (std::size_t k = 0; k < d; ++k) dst[k * ff + i] = slab[i * d + k];
  }
}

std::vector<PlannedTensor> fused_tensors(const ModelConfig& c, const std::string& prefix) {
  const std::int64_t E = c.num_experts, d = c.hidden_size, ff = c.moe_intermediate_size;
  return {{prefix + kGateUp, {E, d, 2 * ff}},
          {prefix + kGateUp + std::string("_bias"), {E, 2 * ff}},
          {prefix + kDown, {E, ff, d}},
          {prefix + kDown + std::string("_bias"), {E, d}}};
}

void write_fused(SafetensorsModelWriter& w, const ModelConfig& c, const ParamLayout& layout, const float* buf) {
  const auto d = static_cast<std::size_t>(c.hidden_size), ff = static_cast<std::size_t>(c.moe_intermediate_size);
  auto at = [&](std::size_t e, ExpertMatrix m, bool bias) {
    const auto ei = static_cast<std::int64_t>(e);
    return buf + layout.at(bias ? moe_expert_bias_tensor(c, ei, m) : moe_expert_tensor(c, ei, m)).offset;
  };
  const std::vector<PlannedTensor> t = fused_tensors(c, layout.prefix);
  w.write_rows(t[0].name, [&](std::size_t r, float* row) {  // row (e, k) of [E, d, 2 ff]
    const float *g = at(r / d, ExpertMatrix::gate, false), *u = at(r / d, ExpertMatrix::up, false);
    const std::size_t k = r % d;
    for (std::size_t i = 0; i < ff; ++i) row[2 * i] = g[i * d + k], row[2 * i + 1] = u[i * d + k];
  });
  w.write_rows(t[1].name, [&](std::size_t e, float* row) {
    const float *g = at(e, ExpertMatrix::gate, true), *u = at(e, ExpertMatrix::up, true);
    for (std::size_t i = 0; i < ff; ++i) row[2 * i] = g[i], row[2 * i + 1] = u[i];
  });
  w.write_rows(t[2].name, [&](std::size_t r, float* row) {  // row (e, i) of [E, ff, d]
    const float* dn = at(r / ff, ExpertMatrix::down, false);
    const std::size_t i = r % ff;
    for (std::size_t k = 0; k < d; ++k) row[k] = dn[k * ff + i];
  });
  w.write_rows(t[3].name, [&](std::size_t e, float* row) {
    std::memcpy(row, at(e, ExpertMatrix::down, true), d * sizeof(float));
  });
}

}  // namespace mt::hf::gpt_oss
