// Element types of tensors on disk. The engine computes in fp32; files hold F32, BF16 or F16 and are
// converted at the boundary (bf16/f16 -> fp32 is exact; fp32 -> bf16/f16 rounds to nearest even).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace mt::hf {

enum class DType { f32, bf16, f16 };

const char* dtype_name(DType t);                            // safetensors spelling: "F32", "BF16", "F16"
std::optional<DType> parse_dtype(const std::string& name);  // nullopt for any other spelling
std::size_t dtype_size(DType t);

// Size in bytes of any safetensors dtype ("F64", "I64", "BOOL", ...); 0 when the name is not one.
std::size_t safetensors_dtype_size(const std::string& name);

void to_f32(DType src_type, const void* src, float* dst, std::size_t n);
void from_f32(DType dst_type, const float* src, void* dst, std::size_t n);

}  // namespace mt::hf
