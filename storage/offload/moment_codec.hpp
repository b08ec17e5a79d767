// How a stage's AdamW moments are held outside the tile (train.optimizer_compression):
//   none     fp32 m then v, as they are (8 bytes per parameter).
//   lossless each array, in chunks of 1M floats, split into its 4 byte planes (sign/exponent bytes
//            compress well, low mantissa bytes hardly), each plane of a chunk a zstd frame:
//            decoding gives the same bits.
//   int8     block-wise 8-bit, lossy (as in 8-bit Adam): blocks of 256 values, one fp32 scale per
//            block (its largest magnitude), one byte per value on a logarithmic code map (the
//            "dynamic" idea: relative, not absolute, precision), about 2 bytes per parameter for m and
//            v together. m: sign + 127 levels, 8 per octave, 16 octaves below the block's scale. v:
//            255 levels, 8 per octave, 32 octaves (v is a square: its range is twice m's in octaves);
//            a non-zero v never decodes to 0 (a zero would turn m / (sqrt(v) + eps) into m / eps).
// encode / decode work on one stage: m and v, n floats each.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mt::offload {

enum class MomentCodec { none, lossless, int8 };
const char* moment_codec_name(MomentCodec c);
MomentCodec parse_moment_codec(const std::string& name);  // throws std::invalid_argument naming the choices

// The largest encoding of n-float m and v (buffer size for encode).
std::size_t encoded_bound(MomentCodec c, std::size_t n);
// Encodes m and v into out (encoded_bound bytes); returns the bytes used.
std::size_t encode_moments(MomentCodec c, const float* m, const float* v, std::size_t n, std::byte* out);
// Decodes `bytes` bytes of `in` into m and v; throws std::runtime_error when they are not a valid
// encoding of n floats each (a damaged buffer that passed its checksums, a bug).
void decode_moments(MomentCodec c, const std::byte* in, std::size_t bytes, std::size_t n, float* m, float* v);

// --- int8 building blocks (also the test oracle's subject) ---------------------------------------
inline constexpr std::size_t kQuantBlock = 256;
inline constexpr int kSignedLevels = 127;    // m: codes 1..127 (+ sign bit), 0 = zero
inline constexpr int kUnsignedLevels = 255;  // v: codes 1..255, 0 = zero
inline constexpr int kCodesPerOctave = 8;
// Relative error bound of a value above the floor: half a code step, 2^(1/16) - 1.
double int8_relative_error_bound();
// The smallest non-zero magnitude of a block whose scale is 1 (signed: m; unsigned: v).
double int8_floor(bool is_signed);
// Quantises n (<= kQuantBlock) values: returns the block's scale, writes one code per value.
// Reference: a linear scan over the code thresholds; fast: the code guessed from the exponent bits and
// stepped to the same count, four values at a time (AVX2). The same codes, tested.
float quantize_block_reference(const float* x, std::size_t n, bool is_signed, std::uint8_t* codes);
float quantize_block(const float* x, std::size_t n, bool is_signed, std::uint8_t* codes);
// Values from codes: scale x the code's level (in double, rounded once to float), signed by bit 7 for m.
// Reference: one at a time; fast: four at a time (AVX2). The same bits, tested.
void dequantize_block_reference(const std::uint8_t* codes, std::size_t n, float scale, bool is_signed, float* x);
void dequantize_block(const std::uint8_t* codes, std::size_t n, float scale, bool is_signed, float* x);

}  // namespace mt::offload
