// bf16 pair products (AVX512-BF16's vdpbf16ps): the attention's block products in a bf16 run, where the
// operands are small tiles made on the fly (a query block, a key block, a block of probabilities) and a
// library call per tile would cost more than the tile. Each 32-bit word holds two bf16 values, the pair a
// vdpbf16ps lane multiplies and adds into one fp32 accumulator:
//   C[m, n] (= or +=) sum over p < K2 of lo(A[m, p]) lo(B[p, n]) + hi(A[m, p]) hi(B[p, n])
// A is M rows of K2 words (lda words apart), B is K2 rows of N words (ldb apart): "pairs along K" on
// both sides, fp32 accumulation in a fixed order (p ascending), so a product's bits depend only on its
// operands. vdpbf16ps treats denormal inputs as zero and flushes denormal results (the instruction's
// contract); the plain reference below sums the exact products in double.
// Packers turn fp32 tiles into pair words (rounded to nearest even, cpu/bf16.hpp's rounding; the vector
// packers flush denormals to zero, which the product does to its inputs anyway); a pair whose second
// element lies past the tile's last row or column is padded with zero.
#pragma once
#include <cstdint>

#include "kernels/cpu/bf16.hpp"

namespace mt::cpu {

using pair_t = std::uint32_t;  // two bf16: the even element in the low half, the odd one in the high half

// Whether bf16_pair_gemm runs on this CPU (AVX512-BF16, BW and VL).
bool bf16_pairs_available();

class RowFetch;

// The product above; requires bf16_pairs_available(). With a `fetch`, a few of its queued lines are
// prefetched before each register block (row_fetch.hpp).
void bf16_pair_gemm(std::int64_t M, std::int64_t N, std::int64_t K2, const pair_t* A, std::int64_t lda, const pair_t* B,
                    std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc, RowFetch* fetch = nullptr);

// The plain reference: exact products summed in double, rounded once to fp32.
void bf16_pair_gemm_reference(std::int64_t M, std::int64_t N, std::int64_t K2, const pair_t* A, std::int64_t lda,
                              const pair_t* B, std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc);

// Pairs along a row: out[r, p] = (x[r, 2p], x[r, 2p+1]) for r < rows, p < (cols + 1) / 2.
void pack_row_pairs(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, pair_t* out,
                    std::int64_t ldo);
// Pairs across two rows: out[p, c] = (x[2p, c], x[2p+1, c]) for p < (rows + 1) / 2, c < cols.
void pack_column_pairs(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, pair_t* out,
                       std::int64_t ldo);
// pack_row_pairs transposed: out[p, r] = (x[r, 2p], x[r, 2p+1]) (a B operand that reduces along x's rows' K).
void pack_row_pairs_transposed(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, pair_t* out,
                               std::int64_t ldo);
// pack_column_pairs transposed: out[c, p] = (x[2p, c], x[2p+1, c]) (an A operand that reduces along x's rows).
void pack_column_pairs_transposed(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, pair_t* out,
                                  std::int64_t ldo);

// out[c * ldo + r] = x[r * ldx + c] for r < rows, c < cols: words moved, never changed. On AVX-512 in
// tiles of 16 x 16 held in registers (a tile's 16 rows are read whole, whatever their stride).
void transpose_words(const pair_t* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, pair_t* out,
                     std::int64_t ldo);
// transpose_words' floats, into an output the caller does not read again (the next op does): whole
// aligned lines are stored past the caches, neither read first nor evicting the lines being worked on.
void stream_transposed(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, float* out,
                       std::int64_t ldo);
// out[c * ldo + r] += x[r * ldx + c] for r < rows, c < cols: one add an element, so the same sums however
// the tiles go.
void add_transposed(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, float* out,
                    std::int64_t ldo);

inline pair_t make_pair_word(float even, float odd) {
  return static_cast<pair_t>(bf16_round_reference(even)) | static_cast<pair_t>(bf16_round_reference(odd)) << 16;
}

}  // namespace mt::cpu
