// Causal grouped-query attention, flash-style on the CPU: queries go in blocks of kQueryBlock rows, keys in
// blocks of kKeyBlock; the block products (Q K^T, P V, and the backward's four) are single-threaded GEMMs
// (sgemm_serial: the linear layers' library, on this thread only, so a task's bits never depend on the pool), and the
// softmax is online (running max and sum per query row), so the memory is a few kQueryBlock x kKeyBlock tiles per
// thread, never T x T. The backward recomputes the probabilities from the saved log-sum-exp.
// Query head h reads kv head h / (q_heads / kv_heads), as transformers' repeat_kv does.
// Work is split over (batch, head) tasks -- (batch, kv head) in the backward, so each task owns the
// dk/dv rows it writes -- and every task runs the same sequence whatever the thread count.
// Sequence tiles (AttnShape::q_start): the query rows are positions q_start.. of each sequence; key
// blocks stay aligned to position 0, so a query row meets its keys in the same blocks either way.
// Sliding window (AttnShape::window) and documents (AttnShape::positions): key blocks wholly before a
// query block's first key (its first row's window or document start) are skipped, never computed, and
// each row masks its keys outside [its first key, p]. Sinks (gpt-oss): one logit per head joins each
// row's softmax at the end of the forward; the saved lse includes it, so the backward's probabilities
// are exact as they are, and d(sink) is summed in a pass of its own (per head, batch and rows in order).
// Block products (AttnProducts): fp32 sgemm on the operands as they are, or, in a bf16 run where they
// measure faster, bf16 pairs (bf16_pairs.hpp: q, k, v, the probabilities and dS rounded to bf16, fp32
// accumulation, as torch.autocast's attention rounds them); the softmax and its statistics stay fp32.
// The pair path also holds, per thread and for the call, the task's keys and values packed (4 x T x
// head_dim bf16 in the backward) and dk, dv transposed (2 x T x head_dim fp32): 128 MiB a thread at 128k
// positions and head_dim 64, freed at the call's end when above kKeptRoomBytes.
// Memory: while a group of query blocks runs its products, the rows the next group reads are prefetched a
// few lines at a time (RowFetch, row_fetch.hpp): with documents the products are few, and waiting for these
// reads was about a tenth of the time. The rows written (out, dq, dk, dv) are read by the next op, not this
// one: they are stored past the caches (simd::scale_past_caches, stream_transposed), so they are not read
// from memory first and do not evict the prefetched rows, which sit in the same cache sets (head slices of
// rows a whole number of 512 bytes long).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/bf16_pairs.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/row_fetch.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/profile.hpp"

namespace mt::cpu {

namespace {

// Key blocks twice as wide as query blocks: each block product does twice the work per call (at long
// context 1.3x the kernel's rate at 64 x 64, measured). Causal attention computes no pair more, since a
// query block's last key block is cut at the block's own last row (kn). Sliding windows do: key blocks
// before a window are skipped whole, so up to 127 masked keys a row are computed (63 before). A row meets
// its keys in blocks aligned to position 0, the last one cut at its query block's end: the same blocks
// whether the rows are tiled or not, as long as tiles start on a query block boundary of the whole sequence.
constexpr std::int64_t kQueryBlock = 64;
constexpr std::int64_t kKeyBlock = 128;
// Query blocks that walk the keys together: each key/value block is loaded once for kGroup query blocks
// and reused from cache (at 32k tokens a head's keys and values no longer fit it). Each query block
// still meets the key blocks in the same order with the same products: the grouping changes no bit.
constexpr std::int64_t kGroup = 4;

// C[m, n] (ldc) = op(A) op(B) (+ C when accumulate), single-threaded.
void mm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* A, std::int64_t lda,
        const float* B, std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc) {
  sgemm_serial(ta, tb, m, n, k, A, lda, B, ldb, accumulate ? 1.0f : 0.0f, C, ldc);
}

// ---- Documents' fp32 block products ----
// With documents the products run in slabs of 8 rows cut at the causal edge (Slabs): many small products
// of varying extents, a library call each. On AVX-512 CPUs (read as bf16_pairs_available) they are this
// register-blocked kernel instead, with no per-call cost: C[m, n] (+)= sum over k of A(m, k) B[k, n],
// each element one fma chain in k's order, so its bits depend on neither the slab nor a sequence tile.
// The stream (no positions) keeps oneDNN: its bits are unchanged.
#if defined(__x86_64__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define MT_DOCS_TARGET __attribute__((target("avx512f")))
MT_DOCS_TARGET inline __mmask16 doc_lanes(std::int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << std::max<std::int64_t>(n, 0)) - 1u);
}
// MR rows of C, 16 NV columns from C's and B's first; lanes outside m0, m1 are neither read nor written
// (kFull: all of them, unmasked).
constexpr __mmask16 kFull = 0xffff;
template <int MR, int NV>
MT_DOCS_TARGET void doc_panel(std::int64_t K, const float* A, std::int64_t am, std::int64_t ak, const float* B,
                              std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc, __mmask16 m0,
                              __mmask16 m1) {
  __m512 c0[MR], c1[MR];  // single vectors, every loop over them unrolled: kept in registers
  const bool full = m0 == kFull && m1 == kFull;
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    c0[r] = accumulate ? _mm512_maskz_loadu_ps(m0, C + r * ldc) : _mm512_setzero_ps();
    c1[r] = NV == 2 && accumulate ? _mm512_maskz_loadu_ps(m1, C + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (std::int64_t k = 0; k < K; ++k) {
    // The masks' loads only where a lane is out (they cost a tenth of the kernel).
    const __m512 b0 = full ? _mm512_loadu_ps(B + k * ldb) : _mm512_maskz_loadu_ps(m0, B + k * ldb);
    __m512 b1 = b0;
    if constexpr (NV == 2) b1 = full ? _mm512_loadu_ps(B + k * ldb + 16) : _mm512_maskz_loadu_ps(m1, B + k * ldb + 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 x = _mm512_set1_ps(A[r * am + k * ak]);
      c0[r] = _mm512_fmadd_ps(x, b0, c0[r]);
      if constexpr (NV == 2) c1[r] = _mm512_fmadd_ps(x, b1, c1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(C + r * ldc, m0, c0[r]);
    if constexpr (NV == 2) _mm512_mask_storeu_ps(C + r * ldc + 16, m1, c1[r]);
  }
}
// MR rows of C, all n columns: panels of 32, the last of 16 where that covers it.
template <int MR>
MT_DOCS_TARGET void doc_rows(std::int64_t n, std::int64_t K, const float* A, std::int64_t am, std::int64_t ak,
                             const float* B, std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc) {
  for (std::int64_t n0 = 0; n0 < n; n0 += 32) {
    const __mmask16 m0 = doc_lanes(n - n0), m1 = doc_lanes(n - n0 - 16);
    if (n - n0 <= 16)
      doc_panel<MR, 1>(K, A, am, ak, B + n0, ldb, accumulate, C + n0, ldc, m0, m1);
    else
      doc_panel<MR, 2>(K, A, am, ak, B + n0, ldb, accumulate, C + n0, ldc, m0, m1);
  }
}
MT_DOCS_TARGET void doc_rows8(std::int64_t n, std::int64_t K, const float* A, std::int64_t am, std::int64_t ak,
                              const float* B, std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc) {
  doc_rows<8>(n, K, A, am, ak, B, ldb, accumulate, C, ldc);
}
MT_DOCS_TARGET void doc_rows1(std::int64_t n, std::int64_t K, const float* A, std::int64_t am, std::int64_t ak,
                              const float* B, std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc) {
  doc_rows<1>(n, K, A, am, ak, B, ldb, accumulate, C, ldc);
}
#pragma GCC diagnostic pop
constexpr bool kDocGemm = true;
#else
constexpr bool kDocGemm = false;
void doc_rows8(std::int64_t, std::int64_t, const float*, std::int64_t, std::int64_t, const float*, std::int64_t, bool,
               float*, std::int64_t) {}
void doc_rows1(std::int64_t, std::int64_t, const float*, std::int64_t, std::int64_t, const float*, std::int64_t, bool,
               float*, std::int64_t) {}
#endif

// s[j] = exp(s[j] - m) for j < n; returns their sum in a fixed order.
float exp_shift(float* s, std::int64_t n, float m) {
  std::int64_t j = 0;
#ifdef MT_AVX2
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 e = simd::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = simd::hsum(acc);
  if (j < n) {
    const std::size_t rest = static_cast<std::size_t>(n - j);
    const __m256 e = simd::exp8(_mm256_sub_ps(simd::load_tail(s + j, rest), vm));
    simd::store_tail(s + j, e, rest);
    alignas(32) float buf[8];
    _mm256_store_ps(buf, e);
    for (std::size_t i = 0; i < rest; ++i) sum += buf[i];
  }
  return sum;
#else
  float sum = 0.0f;
  for (; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
  return sum;
#endif
}

// s[j] *= scale for j < n; returns the largest of them and `m` (std::max's order: a NaN is skipped). Vectorised:
// the row's running max was a serial chain of dependent scalar max operations, half the forward's time.
float scale_max(float* s, std::int64_t n, float scale, float m) {
  std::int64_t j = 0;
#ifdef MT_AVX2
  const __m256 vs = _mm256_set1_ps(scale);
  __m256 acc = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + j), vs);
    _mm256_storeu_ps(s + j, x);
    acc = _mm256_max_ps(x, acc);  // x > acc ? x : acc, as std::max(acc, x)
  }
  m = simd::hmax(acc);
#endif
  for (; j < n; ++j) m = std::max(m, s[j] *= scale);
  return m;
}

// The first key position `q` may see: its window's start and, with documents (AttnShape::positions,
// row: the sequence's), its document's start. Never decreasing in q: a block's first row has the lowest.
inline std::int64_t key_floor(std::int64_t q, std::int64_t window, const std::int32_t* row) {
  std::int64_t lo = window > 0 ? q - window + 1 : 0;
  if (row) lo = std::max<std::int64_t>(lo, q - row[q]);
  return std::max<std::int64_t>(0, lo);
}
// The keys query position `q` may see within the key block starting at k0 ([lo, hi) of its kn columns):
// causal, and from its key floor on.
struct Visible {
  std::int64_t lo, hi;
  bool empty() const { return hi <= lo; }
};
inline Visible visible(std::int64_t q, std::int64_t k0, std::int64_t kn, std::int64_t window, const std::int32_t* row) {
  const std::int64_t hi = std::max<std::int64_t>(0, std::min(kn, q - k0 + 1));
  const std::int64_t lo = std::clamp<std::int64_t>(key_floor(q, window, row) - k0, 0, hi);
  return {lo, hi};
}
// The first key block a query block starting at position pos0 meets (its first row's key floor).
inline std::int64_t first_key_block(std::int64_t pos0, std::int64_t window, const std::int32_t* row) {
  return key_floor(pos0, window, row) / kKeyBlock * kKeyBlock;
}

// Sink logits widened to fp32 (they arrive in the run's precision), into the calling thread's room.
const std::vector<float>& widen_sinks(const void* sinks, std::int64_t heads, bool bf16) {
  thread_local std::vector<float> s;
  s.resize(static_cast<std::size_t>(heads));
  for (std::int64_t h = 0; h < heads; ++h)
    s[static_cast<std::size_t>(h)] =
        bf16 ? bf16_to_float(static_cast<const bf16_t*>(sinks)[h]) : static_cast<const float*>(sinks)[h];
  return s;
}

// ---- The block products, on fp32 operands or on bf16 pairs ----
// The loops below are written once over a Blocks policy: per task (a head, or a kv head in the backward)
// head() sees the keys and values, per group of query blocks query_block() sees each block's rows, then
// each (query block, key block) pair calls scores() and, after the softmax, add_values() (forward) or
// grads() (backward). Fp32Blocks makes the single-threaded sgemm calls on the operands as they are;
// PairBlocks rounds them to bf16 pairs once (keys and values per task, queries per block, probabilities
// and dS per pair of blocks) and runs bf16_pair_gemm. Its backward adds dk and dv into transposed
// per-task accumulators ([head_dim, keys]: the products then reduce along the query rows, which both
// operands hold as pairs) and adds them into dk, dv at the task's end.

// With documents a block product runs in slabs cut at the causal edge (see pair()).
struct Slabs {
  // The next pair of blocks: its first query row's position less its first key's. Row i sees its block's
  // keys below diag + i + 1; with documents the products run in slabs of 8 rows (of keys, for dk and dv;
  // 32 on the pair path, its panels' width), each cut at its last row's causal edge, so the masked corner
  // of a diagonal block is computed a slab deep, not 64 rows (a document's products were 1.12 times its
  // pairs, the causal op's 1.008).
  // Without documents (cut false) one slab of the whole block: the stream's products are the calls they
  // always were, bit for bit. With documents, a block whose first row already sees all its keys (below
  // the diagonal) is one slab too: a product's bits do not depend on how its rows and keys are cut.
  bool cut = false;
  std::int64_t diag = 0;
  RowFetch fetch;  // the rows the task loops queue for the group's products to fetch
  void pair(std::int64_t d) { diag = d; }
  bool whole(std::int64_t kn) const { return !cut || diag + 1 >= kn; }
  // Row slabs [i0, i0 + rows) of qn and the keys their last row sees (of kn).
  template <class F>
  void by_row_slabs(std::int64_t qn, std::int64_t kn, const F& f) const {
    if (whole(kn)) return f(0, qn, kn);
    for (std::int64_t i0 = 0; i0 < qn; i0 += 8) {
      const std::int64_t rows = std::min<std::int64_t>(8, qn - i0);
      f(i0, rows, std::clamp<std::int64_t>(diag + i0 + rows, 0, kn));
    }
  }
  // Key slabs [j0, j0 + rows) of kn and the first query row (of qn) that sees their first key.
  template <class F>
  void by_key_slabs(std::int64_t qn, std::int64_t kn, const F& f, std::int64_t width = 8) const {
    if (whole(kn)) return f(0, kn, 0);
    for (std::int64_t j0 = 0; j0 < kn; j0 += width)
      f(j0, std::min<std::int64_t>(width, kn - j0), std::clamp<std::int64_t>(j0 - diag, 0, qn));
  }
};

struct Fp32Blocks : Slabs {
  static constexpr bool kStoresKvGrads = false;  // adds into dk, dv as it goes: the caller zeroes them first
  const AttnShape& a;
  const float *kb = nullptr, *vb = nullptr;
  float *dkb = nullptr, *dvb = nullptr;
  // Documents on AVX-512: the doc_rows kernel in slabs, reading the task's keys (and values, backward) transposed
  // ([head_dim, keys], kept in the thread's room; the forward's tasks of one kv head reuse them).
  const bool docs;
  std::int64_t k_lo = 0, keys = 0;
  const float* packed_k = nullptr;
  static std::vector<float>& room(int i) {
    thread_local std::vector<float> rooms[2];
    return rooms[i];
  }

  Fp32Blocks(const AttnShape& shape, bool /*backward*/)
      : a(shape), docs(shape.positions != nullptr && kDocGemm && bf16_pairs_available()) {
    cut = docs;
  }
  ~Fp32Blocks() {
    for (int i = 0; i < 2; ++i)
      if (room(i).capacity() * 4 > (std::size_t{16} << 20)) std::vector<float>().swap(room(i));
  }
  Fp32Blocks(const Fp32Blocks&) = delete;
  Fp32Blocks& operator=(const Fp32Blocks&) = delete;
  void head(const float* k_head, const float* v_head, float* dk_head, float* dv_head, std::int64_t lo,
            std::int64_t hi) {
    kb = k_head, vb = v_head, dkb = dk_head, dvb = dv_head;
    if (!docs || (!dk_head && k_head == packed_k && lo == k_lo && hi - lo == keys)) return;
    packed_k = dk_head ? nullptr : k_head;
    k_lo = lo, keys = hi - lo;
    transpose(k_head, room(0));
    if (dk_head) transpose(v_head, room(1));
  }
  // out[c, t - k_lo] = x[t, c]: the floats moved as words (this path runs only where the pairs' AVX-512
  // transpose does).
  void transpose(const float* x, std::vector<float>& out) const {
    out.resize(static_cast<std::size_t>(a.head_dim * keys));
    transpose_words(reinterpret_cast<const pair_t*>(x + k_lo * a.kv_stride), a.kv_stride, keys, a.head_dim,
                    reinterpret_cast<pair_t*>(out.data()), keys);
  }
  void query_block(std::int64_t, const float*, const float*, std::int64_t) {}
  void keys_until(std::int64_t, std::int64_t) {}
  // Before a product of `macs` multiply-adds, its share of the queued rows (the library's products take no
  // RowFetch): a line a kMacsPerLine, at most kLinesPerCall at once.
  static constexpr std::int64_t kMacsPerLine = 2048, kLinesPerCall = 32;
  void fetch_before(std::int64_t macs) {
    fetch.issue(std::min(kLinesPerCall, (macs + kMacsPerLine - 1) / kMacsPerLine));
  }
  void product(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* A, std::int64_t lda,
               const float* B, std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc) {
    fetch_before(m * n * k);
    mm(ta, tb, m, n, k, A, lda, B, ldb, accumulate, C, ldc);
  }
  void slab(std::int64_t rows, std::int64_t n, std::int64_t K, const float* A, std::int64_t am, std::int64_t ak,
            const float* B, std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc) {
    if (n <= 0) return;
    fetch_before(rows * n * K);
    std::int64_t r = 0;
    for (; r + 8 <= rows; r += 8) doc_rows8(n, K, A + r * am, am, ak, B, ldb, accumulate, C + r * ldc, ldc);
    for (; r < rows; ++r) doc_rows1(n, K, A + r * am, am, ak, B, ldb, accumulate, C + r * ldc, ldc);
  }
  // S[qn, kn] (ld kKeyBlock) = Q K^T over the key block at k0; dP likewise from dout and V (backward).
  void scores(std::int64_t, const float* qb, std::int64_t qn, std::int64_t k0, std::int64_t kn, float* S) {
    if (docs)
      return by_row_slabs(qn, kn, [&](std::int64_t i0, std::int64_t rows, std::int64_t edge) {
        slab(rows, edge, a.head_dim, qb + i0 * a.q_stride, a.q_stride, 1, room(0).data() + (k0 - k_lo), keys, false,
             S + i0 * kKeyBlock, kKeyBlock);
      });
    product(false, true, qn, kn, a.head_dim, qb, a.q_stride, kb + k0 * a.kv_stride, a.kv_stride, false, S, kKeyBlock);
  }
  void dscores(std::int64_t, const float* dob, std::int64_t qn, std::int64_t k0, std::int64_t kn, float* dP) {
    if (docs)
      return by_row_slabs(qn, kn, [&](std::int64_t i0, std::int64_t rows, std::int64_t edge) {
        slab(rows, edge, a.head_dim, dob + i0 * a.o_stride, a.o_stride, 1, room(1).data() + (k0 - k_lo), keys, false,
             dP + i0 * kKeyBlock, kKeyBlock);
      });
    product(false, true, qn, kn, a.head_dim, dob, a.o_stride, vb + k0 * a.kv_stride, a.kv_stride, false, dP, kKeyBlock);
  }
  // O[qn, head_dim] += P V (a slab's P is 0 past its edge)
  void add_values(std::int64_t, std::int64_t qn, std::int64_t k0, std::int64_t kn, const float* P, float* O) {
    const std::int64_t hd = a.head_dim;
    if (docs)
      return by_row_slabs(qn, kn, [&](std::int64_t i0, std::int64_t rows, std::int64_t edge) {
        if (edge > 0)
          slab(rows, hd, edge, P + i0 * kKeyBlock, kKeyBlock, 1, vb + k0 * a.kv_stride, a.kv_stride, true, O + i0 * hd,
               hd);
      });
    product(false, false, qn, hd, kn, P, kKeyBlock, vb + k0 * a.kv_stride, a.kv_stride, true, O, hd);
  }
  // dv += P^T dout, dq += dS K, dk += dS^T q (P and dS are 0 past each row's edge)
  void grads(std::int64_t, const float* qb, const float* dob, std::int64_t qn, std::int64_t k0, std::int64_t kn,
             const float* P, const float* dS, float* dQ) {
    const std::int64_t hd = a.head_dim;
    if (docs) {
      by_key_slabs(qn, kn, [&](std::int64_t j0, std::int64_t rows, std::int64_t i0) {
        if (i0 >= qn) return;
        float* dvr = dvb + (k0 + j0) * a.kv_stride;
        float* dkr = dkb + (k0 + j0) * a.kv_stride;
        slab(rows, hd, qn - i0, P + i0 * kKeyBlock + j0, 1, kKeyBlock, dob + i0 * a.o_stride, a.o_stride, true, dvr,
             a.kv_stride);
        slab(rows, hd, qn - i0, dS + i0 * kKeyBlock + j0, 1, kKeyBlock, qb + i0 * a.q_stride, a.q_stride, true, dkr,
             a.kv_stride);
      });
      by_row_slabs(qn, kn, [&](std::int64_t i0, std::int64_t rows, std::int64_t edge) {
        if (edge > 0)
          slab(rows, hd, edge, dS + i0 * kKeyBlock, kKeyBlock, 1, kb + k0 * a.kv_stride, a.kv_stride, true,
               dQ + i0 * hd, hd);
      });
      return;
    }
    product(true, false, kn, hd, qn, P, kKeyBlock, dob, a.o_stride, true, dvb + k0 * a.kv_stride, a.kv_stride);
    product(false, false, qn, hd, kn, dS, kKeyBlock, kb + k0 * a.kv_stride, a.kv_stride, true, dQ, hd);
    product(true, false, kn, hd, qn, dS, kKeyBlock, qb, a.q_stride, true, dkb + k0 * a.kv_stride, a.kv_stride);
  }
  void end_head() {}
};

struct PairBlocks : Slabs {
  // The calling thread's rooms, kept across calls (the pool's threads run every call).
  struct Rooms {
    std::vector<pair_t> k_t, v_t, k_pairs, v_pairs;  // per task: keys and values packed as each product reads them
    std::vector<pair_t> q_rows, do_rows, q_cols, do_cols;  // per query block: kGroup blocks
    std::vector<pair_t> p_rows, p_cols, ds_rows, ds_cols;  // per pair of blocks
    std::vector<float> dk_t, dv_t;                         // [head_dim, keys] accumulators (backward)
    std::vector<pair_t> block_rows;                        // a block packed as rows, before its transposition
  };
  static constexpr bool kStoresKvGrads = true;  // end_head writes every row of dk, dv (a.add_kv_grads: adds)
  const AttnShape& a;
  const std::int64_t hd, hd2;  // head_dim and its pairs
  static constexpr std::int64_t kQ2 = kQueryBlock / 2, kK2 = kKeyBlock / 2;
  Rooms& r;
  std::int64_t k_lo = 0, keys = 0;
  // The accumulators' row length: the keys and 16 more, so that their rows (read together by the
  // products and by end_head's tiles) are not a power of two apart, all in the same few cache sets.
  std::int64_t ldk = 0;
  float *dkb = nullptr, *dvb = nullptr;
  const float *kb = nullptr, *vb = nullptr;
  const float *packed_k = nullptr, *packed_v = nullptr;  // the forward's head packed last in this call
  std::int64_t packed_until = 0;                         // keys [k_lo, packed_until) are packed

  // Rooms above this are freed when the call ends: at long context they are the keys' size, and the
  // fp32 path keeps nothing of that size between calls either.
  static constexpr std::size_t kKeptRoomBytes = std::size_t{16} << 20;
  ~PairBlocks() {
    const std::size_t words = r.k_t.capacity() + r.v_t.capacity() + r.k_pairs.capacity() + r.v_pairs.capacity() +
                              r.dk_t.capacity() + r.dv_t.capacity();
    if (4 * words > kKeptRoomBytes) r = Rooms{};
  }
  PairBlocks(const PairBlocks&) = delete;
  PairBlocks& operator=(const PairBlocks&) = delete;
  PairBlocks(const AttnShape& shape, bool backward)
      : a(shape), hd(shape.head_dim), hd2((shape.head_dim + 1) / 2), r(rooms()) {
    cut = shape.positions != nullptr;
    r.q_rows.resize(static_cast<std::size_t>(kGroup * kQueryBlock * hd2));
    r.p_rows.resize(static_cast<std::size_t>(kQueryBlock * kK2));
    r.block_rows.resize(static_cast<std::size_t>(std::max(kQ2 * hd, kKeyBlock * hd2)));  // a key block or q's pairs
    if (!backward) return;
    r.do_rows.resize(r.q_rows.size());
    r.q_cols.resize(static_cast<std::size_t>(kGroup * hd * kQ2));
    r.do_cols.resize(r.q_cols.size());
    r.p_cols.resize(static_cast<std::size_t>(kQ2 * kKeyBlock));
    r.ds_rows.resize(r.p_rows.size());
    r.ds_cols.resize(r.p_cols.size());
  }
  static Rooms& rooms() {
    thread_local Rooms rooms;
    return rooms;
  }
  // Keys [k_lo, k_hi) of this task, k_lo on a key block's start, packed a block at a time as the groups
  // reach them (keys_until), their rows fetched while the group before runs its products.
  // Forward: K^T by key blocks (each block's hd2 x kKeyBlock words together) and V as pairs of rows; backward
  // adds V^T by blocks and K as pairs of rows, and zeroes the dk, dv accumulators.
  // The forward's tasks of one kv head's query heads often follow each other on a thread: the keys and
  // values this call packed already stay packed (the same words; within one call they do not change).
  void head(const float* k_head, const float* v_head, float* dk_head, float* dv_head, std::int64_t lo,
            std::int64_t hi) {
    if (!dk_head && k_head == packed_k && v_head == packed_v && lo == k_lo && hi - lo == keys) return;
    kb = k_head, vb = v_head;
    packed_k = dk_head ? nullptr : k_head, packed_v = v_head;
    k_lo = lo, keys = hi - lo, dkb = dk_head, dvb = dv_head, packed_until = lo;
    const std::int64_t blocks = (keys + kKeyBlock - 1) / kKeyBlock, pairs = (keys + 1) / 2;
    r.k_t.resize(static_cast<std::size_t>(blocks * hd2 * kKeyBlock));
    (dk_head ? r.k_pairs : r.v_pairs).resize(static_cast<std::size_t>(pairs * hd));
    if (!dk_head) return;
    r.v_t.resize(r.k_t.size());
    ldk = (keys + 15) / 16 * 16 + 16;
    r.dk_t.resize(static_cast<std::size_t>(hd * ldk));
    r.dv_t.resize(static_cast<std::size_t>(hd * ldk));
  }
  // Packs the key blocks up to the one holding key k_end - 1, and queues the rows of the keys up to
  // k_next for the fetch.
  void keys_until(std::int64_t k_end, std::int64_t k_next) {
    const std::int64_t hi = k_lo + keys;
    for (; packed_until < std::min(k_end, hi); packed_until += kKeyBlock) pack_block(packed_until);
    const std::int64_t from = std::max(packed_until, k_end), n = std::min(k_next, hi) - from;
    if (n <= 0) return;
    fetch.add(kb + from * a.kv_stride, a.kv_stride, n, hd);
    fetch.add(vb + from * a.kv_stride, a.kv_stride, n, hd);
  }
  // The key block at t0: pack_row_pairs_transposed's words, made by the vector packer into rows and then
  // transposed (the same words: a word's rounding does not depend on where it goes); the per-element packer
  // was a fixed cost a head that, with documents, weighs as much as a tenth of the pairs.
  void pack_block(std::int64_t t0) {
    const std::int64_t n = std::min(kKeyBlock, k_lo + keys - t0), b = (t0 - k_lo) / kKeyBlock;
    auto by_blocks = [&](const float* x, std::vector<pair_t>& out) {
      pack_row_pairs(x + t0 * a.kv_stride, a.kv_stride, n, hd, r.block_rows.data(), hd2);
      transpose_words(r.block_rows.data(), hd2, n, hd2, out.data() + b * hd2 * kKeyBlock, kKeyBlock);
    };
    auto row_pairs = [&](const float* x, std::vector<pair_t>& out) {  // t0 is even: the same pairs as from k_lo
      pack_column_pairs(x + t0 * a.kv_stride, a.kv_stride, n, hd, out.data() + (t0 - k_lo) / 2 * hd, hd);
    };
    by_blocks(kb, r.k_t);
    if (!dkb) return row_pairs(vb, r.v_pairs);
    by_blocks(vb, r.v_t);
    row_pairs(kb, r.k_pairs);
    for (float* acc : {r.dk_t.data(), r.dv_t.data()})
      for (std::int64_t c = 0; c < hd; ++c) std::fill_n(acc + c * ldk + (t0 - k_lo), n, 0.0f);
  }
  // Query block j of the group: its rows as pairs (the scores' A operand) and, in the backward, q and dout
  // transposed into pairs of query rows (dk's and dv's A operands).
  void query_block(std::int64_t j, const float* qb, const float* dob, std::int64_t qn) {
    pack_row_pairs(qb, a.q_stride, qn, hd, r.q_rows.data() + j * kQueryBlock * hd2, hd2);
    if (!dob) return;
    pack_row_pairs(dob, a.o_stride, qn, hd, r.do_rows.data() + j * kQueryBlock * hd2, hd2);
    // pack_column_pairs_transposed's words, the same way as the keys' blocks (head()).
    const std::int64_t qn2 = (qn + 1) / 2;
    pack_column_pairs(qb, a.q_stride, qn, hd, r.block_rows.data(), hd);
    transpose_words(r.block_rows.data(), hd, qn2, hd, r.q_cols.data() + j * hd * kQ2, kQ2);
    pack_column_pairs(dob, a.o_stride, qn, hd, r.block_rows.data(), hd);
    transpose_words(r.block_rows.data(), hd, qn2, hd, r.do_cols.data() + j * hd * kQ2, kQ2);
  }
  void product(std::int64_t M, std::int64_t N, std::int64_t K2, const pair_t* A, std::int64_t lda, const pair_t* B,
               std::int64_t ldb, bool accumulate, float* C, std::int64_t ldc) {
    bf16_pair_gemm(M, N, K2, A, lda, B, ldb, accumulate, C, ldc, &fetch);
  }
  const pair_t* key_block(const std::vector<pair_t>& by_blocks, std::int64_t k0) const {
    return by_blocks.data() + (k0 - k_lo) / kKeyBlock * hd2 * kKeyBlock;
  }
  void scores(std::int64_t j, const float*, std::int64_t qn, std::int64_t k0, std::int64_t kn, float* S) {
    by_row_slabs(qn, kn, [&](std::int64_t i0, std::int64_t rows, std::int64_t edge) {
      product(rows, edge, hd2, r.q_rows.data() + (j * kQueryBlock + i0) * hd2, hd2, key_block(r.k_t, k0), kKeyBlock,
              false, S + i0 * kKeyBlock, kKeyBlock);
    });
  }
  void dscores(std::int64_t j, const float*, std::int64_t qn, std::int64_t k0, std::int64_t kn, float* dP) {
    by_row_slabs(qn, kn, [&](std::int64_t i0, std::int64_t rows, std::int64_t edge) {
      product(rows, edge, hd2, r.do_rows.data() + (j * kQueryBlock + i0) * hd2, hd2, key_block(r.v_t, k0), kKeyBlock,
              false, dP + i0 * kKeyBlock, kKeyBlock);
    });
  }
  // A slab's probabilities and dS are 0 past its edge: its products over the keys stop at the edge's pair,
  // and only that much of each row is packed (the pair at an odd edge takes the zero after it either way).
  void add_values(std::int64_t, std::int64_t qn, std::int64_t k0, std::int64_t kn, const float* P, float* O) {
    by_row_slabs(qn, kn, [&](std::int64_t i0, std::int64_t rows, std::int64_t edge) {
      pack_row_pairs(P + i0 * kKeyBlock, kKeyBlock, rows, edge, r.p_rows.data() + i0 * kK2, kK2);
      product(rows, hd, (edge + 1) / 2, r.p_rows.data() + i0 * kK2, kK2, r.v_pairs.data() + (k0 - k_lo) / 2 * hd, hd,
              true, O + i0 * hd, hd);
    });
  }
  // A key slab's products over the query rows start at the pair of the first row that sees it; its
  // columns of P and dS are packed from that pair on.
  void grads(std::int64_t j, const float*, const float*, std::int64_t qn, std::int64_t k0, std::int64_t kn,
             const float* P, const float* dS, float* dQ) {
    const std::int64_t qn2 = (qn + 1) / 2, col = k0 - k_lo;
    by_key_slabs(
        qn, kn,
        [&](std::int64_t j0, std::int64_t n, std::int64_t i0) {
          const std::int64_t p0 = i0 / 2;
          if (p0 >= qn2) return;
          const std::int64_t at = p0 * kKeyBlock + j0, from = 2 * p0 * kKeyBlock + j0;              // words, floats
          pack_column_pairs(P + from, kKeyBlock, qn - 2 * p0, n, r.p_cols.data() + at, kKeyBlock);  // dv^T += dout^T P
          pack_column_pairs(dS + from, kKeyBlock, qn - 2 * p0, n, r.ds_cols.data() + at, kKeyBlock);  // dk^T += q^T dS
          product(hd, n, qn2 - p0, r.do_cols.data() + j * hd * kQ2 + p0, kQ2, r.p_cols.data() + at, kKeyBlock, true,
                  r.dv_t.data() + col + j0, ldk);
          product(hd, n, qn2 - p0, r.q_cols.data() + j * hd * kQ2 + p0, kQ2, r.ds_cols.data() + at, kKeyBlock, true,
                  r.dk_t.data() + col + j0, ldk);
        },
        32);
    by_row_slabs(qn, kn, [&](std::int64_t i0, std::int64_t rows, std::int64_t edge) {  // dq += dS K
      pack_row_pairs(dS + i0 * kKeyBlock, kKeyBlock, rows, edge, r.ds_rows.data() + i0 * kK2, kK2);
      product(rows, hd, (edge + 1) / 2, r.ds_rows.data() + i0 * kK2, kK2, r.k_pairs.data() + col / 2 * hd, hd, true,
              dQ + i0 * hd, hd);
    });
  }
  void end_head() {
    if (!dkb) return;            // the forward's task
    keys_until(k_lo + keys, 0);  // keys no query row met: their gradients are zeros
    for (auto [acc, grad] : {std::pair{r.dk_t.data(), dkb}, std::pair{r.dv_t.data(), dvb}}) {
      if (a.add_kv_grads) {
        add_transposed(acc, ldk, hd, keys, grad + k_lo * a.kv_stride, a.kv_stride);
        continue;
      }
      // Stored, not added to zeros: the same bits, since an accumulator that starts at +0 is never -0.
      for (std::int64_t t = 0; t < k_lo; ++t) std::fill_n(grad + t * a.kv_stride, hd, 0.0f);
      stream_transposed(acc, ldk, hd, keys, grad + k_lo * a.kv_stride, a.kv_stride);
    }
  }
};

template <class Blocks>
void forward_tasks(const float* q, const float* k, const float* v, const float* sink, float* out, float* lse,
                   const AttnShape& a, int threads) {
  const std::int64_t T = a.seq, Q = a.q_rows(), q_start = a.q_start, hd = a.head_dim, group = a.q_heads / a.kv_heads;
  const std::int64_t W = a.window;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::int64_t tasks = a.batch * a.q_heads;
  // The query heads of one kv head in a row on one thread where that still gives every thread work: the
  // keys and values packed for the first serve the others (PairBlocks::head).
  const int chunk = tasks / group >= threads ? static_cast<int>(group) : 1;
#pragma omp parallel num_threads(threads) if (tasks > 1 && Q * T * hd > 4096)
  {
    // Per-thread tiles, kept across calls by the pool's threads (allocated once, not per call).
    thread_local std::vector<float> S, O, m, l;
    S.resize(kQueryBlock * kKeyBlock);
    O.resize(static_cast<std::size_t>(kGroup * kQueryBlock * hd));
    m.resize(kGroup * kQueryBlock);
    l.resize(kGroup * kQueryBlock);
    Blocks blocks_of(a, false);
#pragma omp for schedule(dynamic, chunk)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / a.q_heads, h = task % a.q_heads, kvh = h / group;
      const std::int32_t* row = a.positions ? a.positions + b * T : nullptr;
      blocks_of.head(k + b * T * a.kv_stride + kvh * hd, v + b * T * a.kv_stride + kvh * hd, nullptr, nullptr,
                     first_key_block(q_start, W, row), T);
      for (std::int64_t g0 = 0; g0 < Q; g0 += kGroup * kQueryBlock) {  // g0: the group's first query row
        const std::int64_t blocks = std::min<std::int64_t>(kGroup, (Q - g0 + kQueryBlock - 1) / kQueryBlock);
        const std::int64_t g_end = q_start + std::min(Q, g0 + kGroup * kQueryBlock);  // the group's last position + 1
        std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.end(), 0.0f);
        std::fill(O.begin(), O.end(), 0.0f);
        for (std::int64_t j = 0; j < blocks; ++j) {
          const std::int64_t q0 = g0 + j * kQueryBlock;
          blocks_of.query_block(j, q + (b * Q + q0) * a.q_stride + h * hd, nullptr, std::min(kQueryBlock, Q - q0));
        }
        RowFetch& fetch = blocks_of.fetch;
        fetch.restart();
        blocks_of.keys_until(g_end, std::min(T, g_end + kGroup * kQueryBlock));
        if (const std::int64_t next = g0 + kGroup * kQueryBlock; next < Q)  // the next group's queries
          fetch.add(q + (b * Q + next) * a.q_stride + h * hd, a.q_stride, std::min(kGroup * kQueryBlock, Q - next), hd);
        for (std::int64_t k0 = first_key_block(q_start + g0, W, row); k0 < g_end; k0 += kKeyBlock) {
          for (std::int64_t j = 0; j < blocks; ++j) {  // each query block of the group that sees this key block
            const std::int64_t q0 = g0 + j * kQueryBlock, qn = std::min(kQueryBlock, Q - q0), pos0 = q_start + q0;
            if (k0 >= pos0 + qn || k0 < first_key_block(pos0, W, row)) continue;
            const std::int64_t kn = std::min(kKeyBlock, pos0 + qn - k0);
            float* Oj = O.data() + j * kQueryBlock * hd;
            float* mj = m.data() + j * kQueryBlock;
            float* lj = l.data() + j * kQueryBlock;
            blocks_of.pair(pos0 - k0);
            blocks_of.scores(j, q + (b * Q + q0) * a.q_stride + h * hd, qn, k0, kn, S.data());
            for (std::int64_t i = 0; i < qn; ++i) {
              float* s = S.data() + i * kKeyBlock;
              const Visible vis = visible(pos0 + i, k0, kn, W, row);
              if (vis.empty()) {  // no key of this block: the row's state stays as it is
                std::fill(s, s + kn, 0.0f);
                continue;
              }
              const std::int64_t n = vis.hi - vis.lo;
              float* sv = s + vis.lo;
              const float mx = scale_max(sv, n, scale, mj[i]);
              const float corr = simd::exp1(mj[i] - mx);  // 0 on the row's first block (m = -inf)
              lj[i] = lj[i] * corr + exp_shift(sv, n, mx);
              std::fill(s, sv, 0.0f);  // masked keys: before the window, after the causal edge
              std::fill(s + vis.hi, s + kn, 0.0f);
              simd::scale(corr, Oj + i * hd, hd);
              mj[i] = mx;
            }
            blocks_of.add_values(j, qn, k0, kn, S.data(), Oj);
          }
        }
        for (std::int64_t j = 0; j < blocks; ++j) {
          const std::int64_t q0 = g0 + j * kQueryBlock, qn = std::min(kQueryBlock, Q - q0);
          for (std::int64_t i = 0; i < qn; ++i) {
            const std::int64_t r = j * kQueryBlock + i;
            float* o = out + (b * Q + q0 + i) * a.o_stride + h * hd;
            float mr = m[static_cast<std::size_t>(r)], lr = l[static_cast<std::size_t>(r)], corr = 1.0f;
            if (sink) {  // the sink's column joins the row: rescale to the larger of its max and the sink
              const float sh = sink[h], mx = std::max(mr, sh);
              corr = std::exp(mr - mx);
              lr = lr * corr + std::exp(sh - mx);
              mr = mx;
            }
            simd::scale_past_caches(O.data() + r * hd, corr / lr, o, hd);
            lse[(b * a.q_heads + h) * Q + q0 + i] = mr + std::log(lr);
          }
        }
      }
      blocks_of.end_head();
      blocks_of.fetch.clear();
      simd::fence_streams();
    }
  }
}

// A backward task's steps: each of its query heads (heads from first_head) meets each group of kGroup query
// blocks. Heads outer, as the stream has always summed dk and dv; with documents, groups outer: a group's
// keys, their packed words and dk, dv accumulators, and its rows of every head are used while in cache
// (heads outer brought them all in from memory again for each head). dk and dv then sum their terms in
// another order, fixed whatever the thread count; every other output's bits are the same either way.
struct TaskSteps {
  std::int64_t first_head, heads, groups;
  bool groups_outer;
  std::int64_t size() const { return heads * groups; }
  // Step st's query head and its group's first query row.
  std::pair<std::int64_t, std::int64_t> operator[](std::int64_t st) const {
    const std::int64_t h = groups_outer ? st % heads : st / groups, g = groups_outer ? st / heads : st % groups;
    return {first_head + h, g * kGroup * kQueryBlock};
  }
};

template <class Blocks>
void backward_tasks(const float* q, const float* k, const float* v, const float* out, const float* lse,
                    const float* dout, float* dq, float* dk, float* dv, const AttnShape& a, int threads) {
  const std::int64_t T = a.seq, Q = a.q_rows(), q_start = a.q_start, hd = a.head_dim, group = a.q_heads / a.kv_heads;
  const std::int64_t W = a.window;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::int64_t tasks = a.batch * a.kv_heads;
#pragma omp parallel num_threads(threads) if (tasks > 1 && Q * T * hd > 4096)
  {
    thread_local std::vector<float> P, dP, dQ, D;  // per-thread tiles, allocated once
    P.resize(kQueryBlock * kKeyBlock);
    dP.resize(kQueryBlock * kKeyBlock);
    dQ.resize(static_cast<std::size_t>(kGroup * kQueryBlock * hd));
    D.resize(kGroup * kQueryBlock);
    Blocks blocks_of(a, true);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / a.kv_heads, kvh = task % a.kv_heads;
      float* dkb = dk + b * T * a.kv_stride + kvh * hd;
      float* dvb = dv + b * T * a.kv_stride + kvh * hd;
      if (!a.add_kv_grads && !Blocks::kStoresKvGrads)
        for (std::int64_t t = 0; t < T; ++t) {
          std::fill_n(dkb + t * a.kv_stride, hd, 0.0f);
          std::fill_n(dvb + t * a.kv_stride, hd, 0.0f);
        }
      const std::int32_t* row = a.positions ? a.positions + b * T : nullptr;
      blocks_of.head(k + b * T * a.kv_stride + kvh * hd, v + b * T * a.kv_stride + kvh * hd, dkb, dvb,
                     first_key_block(q_start, W, row), T);
      const TaskSteps steps{kvh * group, group, (Q + kGroup * kQueryBlock - 1) / (kGroup * kQueryBlock),
                            row != nullptr};
      for (std::int64_t st = 0; st < steps.size(); ++st) {
        const auto [h, g0] = steps[st];
        const std::int64_t blocks = std::min<std::int64_t>(kGroup, (Q - g0 + kQueryBlock - 1) / kQueryBlock);
        const std::int64_t g_end = q_start + std::min(Q, g0 + kGroup * kQueryBlock);
        for (std::int64_t j = 0; j < blocks; ++j) {
          const std::int64_t q0 = g0 + j * kQueryBlock, qn = std::min(kQueryBlock, Q - q0);
          const float* dob = dout + (b * Q + q0) * a.o_stride + h * hd;
          for (std::int64_t i = 0; i < qn; ++i)
            D[static_cast<std::size_t>(j * kQueryBlock + i)] =
                simd::dot(dob + i * a.o_stride, out + (b * Q + q0 + i) * a.o_stride + h * hd, hd);
          blocks_of.query_block(j, q + (b * Q + q0) * a.q_stride + h * hd, dob, qn);
        }
        std::fill(dQ.begin(), dQ.end(), 0.0f);
        RowFetch& fetch = blocks_of.fetch;
        fetch.restart();
        blocks_of.keys_until(g_end, std::min(T, g_end + kGroup * kQueryBlock));
        if (st + 1 < steps.size()) {  // the next step's rows
          const auto [hn, next] = steps[st + 1];
          const std::int64_t n = std::min(kGroup * kQueryBlock, Q - next);
          fetch.add(dout + (b * Q + next) * a.o_stride + hn * hd, a.o_stride, n, hd);
          fetch.add(out + (b * Q + next) * a.o_stride + hn * hd, a.o_stride, n, hd);
          fetch.add(q + (b * Q + next) * a.q_stride + hn * hd, a.q_stride, n, hd);
        }
        for (std::int64_t k0 = first_key_block(q_start + g0, W, row); k0 < g_end; k0 += kKeyBlock) {
          for (std::int64_t j = 0; j < blocks; ++j) {  // each query block of the group that sees this key block
            const std::int64_t q0 = g0 + j * kQueryBlock, qn = std::min(kQueryBlock, Q - q0), pos0 = q_start + q0;
            if (k0 >= pos0 + qn || k0 < first_key_block(pos0, W, row)) continue;
            const std::int64_t kn = std::min(kKeyBlock, pos0 + qn - k0);
            const float* qb = q + (b * Q + q0) * a.q_stride + h * hd;
            const float* dob = dout + (b * Q + q0) * a.o_stride + h * hd;
            const float* lb = lse + (b * a.q_heads + h) * Q + q0;
            const float* Dj = D.data() + j * kQueryBlock;
            blocks_of.pair(pos0 - k0);
            blocks_of.scores(j, qb, qn, k0, kn, P.data());
            blocks_of.dscores(j, dob, qn, k0, kn, dP.data());
            for (std::int64_t i = 0; i < qn; ++i) {
              float* p = P.data() + i * kKeyBlock;
              float* dp = dP.data() + i * kKeyBlock;
              const Visible vis = visible(pos0 + i, k0, kn, W, row);
              for (std::int64_t c = vis.lo; c < vis.hi; ++c) p[c] *= scale;
              if (!vis.empty()) exp_shift(p + vis.lo, vis.hi - vis.lo, lb[i]);  // p = exp(s - lse)
              for (std::int64_t c = vis.lo; c < vis.hi; ++c) dp[c] = p[c] * (dp[c] - Dj[i]) * scale;  // dS, scaled
              std::fill(p, p + vis.lo, 0.0f);  // lo <= hi: visible() clamps it
              std::fill(dp, dp + vis.lo, 0.0f);
              std::fill(p + vis.hi, p + kn, 0.0f);
              std::fill(dp + vis.hi, dp + kn, 0.0f);
            }
            blocks_of.grads(j, qb, dob, qn, k0, kn, P.data(), dP.data(), dQ.data() + j * kQueryBlock * hd);
          }
        }
        for (std::int64_t j = 0; j < blocks; ++j) {
          const std::int64_t q0 = g0 + j * kQueryBlock, qn = std::min(kQueryBlock, Q - q0);
          for (std::int64_t i = 0; i < qn; ++i)
            simd::scale_past_caches(dQ.data() + (j * kQueryBlock + i) * hd, 1.0f,
                                    dq + (b * Q + q0 + i) * a.q_stride + h * hd, hd);
        }
      }
      blocks_of.end_head();
      blocks_of.fetch.clear();
      simd::fence_streams();
    }
  }
}

// The bf16 pair path needs AVX512-BF16; a request for it elsewhere is a caller's error.
bool use_pairs(AttnProducts products) {
  if (products == AttnProducts::fp32) return false;
  if (!bf16_pairs_available())
    throw std::logic_error("attention: bf16 pair products were asked for on a CPU without AVX512-BF16");
  return true;
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, const void* sinks, bool sinks_bf16, float* out,
                       float* lse, const AttnShape& a, int threads, AttnProducts products) {
  prof::Scope prof_scope(prof::attention);
  const float* sink = sinks ? widen_sinks(sinks, a.q_heads, sinks_bf16).data() : nullptr;  // read by every thread
  if (use_pairs(products))
    forward_tasks<PairBlocks>(q, k, v, sink, out, lse, a, threads);
  else
    forward_tasks<Fp32Blocks>(q, k, v, sink, out, lse, a, threads);
}

void attention_backward(const float* q, const float* k, const float* v, const void* sinks, bool sinks_bf16,
                        const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv,
                        float* dsinks_acc, const AttnShape& a, int threads, AttnProducts products) {
  prof::Scope prof_scope(prof::attention);
  const std::int64_t Q = a.q_rows(), hd = a.head_dim;
  if (use_pairs(products))
    backward_tasks<PairBlocks>(q, k, v, out, lse, dout, dq, dk, dv, a, threads);
  else
    backward_tasks<Fp32Blocks>(q, k, v, out, lse, dout, dq, dk, dv, a, threads);
  if (!sinks || !dsinks_acc) return;
  // d(sink_h) = sum over rows of p_sink * (0 - D): the sink's column has no value, so dP_sink = 0.
  const float* sink = widen_sinks(sinks, a.q_heads, sinks_bf16).data();
#pragma omp parallel for num_threads(threads) schedule(static) if (a.q_heads > 1 && a.batch * Q * hd > 4096)
  for (std::int64_t h = 0; h < a.q_heads; ++h) {
    float acc = 0.0f;
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t i = 0; i < Q; ++i) {
        const std::int64_t row = (b * Q + i);
        const float D = simd::dot(dout + row * a.o_stride + h * hd, out + row * a.o_stride + h * hd, hd);
        acc -= std::exp(sink[h] - lse[(b * a.q_heads + h) * Q + i]) * D;
      }
    dsinks_acc[h] += acc;
  }
}

namespace {
std::atomic<int> g_bf16_attention{static_cast<int>(AttnProducts::fp32)};
}  // namespace

const char* attn_products_name(AttnProducts p) { return p == AttnProducts::bf16_pairs ? "pairs" : "fp32"; }

std::optional<AttnProducts> parse_attn_products(const std::string& name) {
  if (name == "pairs") return AttnProducts::bf16_pairs;
  if (name == "fp32") return AttnProducts::fp32;
  return std::nullopt;
}

std::optional<AttnProducts> bf16_attention_forced() {
  static const std::optional<AttnProducts> forced = []() -> std::optional<AttnProducts> {
    const char* e = std::getenv("MEGATRAIN_BF16_ATTENTION");
    if (e == nullptr || *e == 0) return std::nullopt;
    const auto p = parse_attn_products(e);
    if (!p)
      throw std::invalid_argument(std::string("MEGATRAIN_BF16_ATTENTION=") + e + ": expected pairs or fp32 (or unset)");
    return p;
  }();
  return forced;
}

AttnProducts bf16_attention_products() {
  if (const auto f = bf16_attention_forced())
    return *f == AttnProducts::bf16_pairs && !bf16_pairs_available() ? AttnProducts::fp32 : *f;
  return static_cast<AttnProducts>(g_bf16_attention.load(std::memory_order_acquire));
}

AttnProducts set_bf16_attention_products(AttnProducts p) {
  if (p == AttnProducts::bf16_pairs && !bf16_pairs_available()) p = AttnProducts::fp32;
  g_bf16_attention.store(static_cast<int>(p), std::memory_order_release);
  return bf16_attention_products();
}

AttnProbe probe_bf16_attention(const AttnShape& shape, int threads, double budget_s) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  AttnProbe r;
  r.threads = std::max(1, threads);
  r.pairs_available = bf16_pairs_available();
  AttnShape a = shape;
  a.batch = 1;
  // Up to 1024 positions, fewer for wide models: one forward + backward at most ~5 GFLOP (7 T^2 q_dim).
  const double q_dim = static_cast<double>(std::max<std::int64_t>(1, a.q_heads * a.head_dim));
  const auto fit = static_cast<std::int64_t>(std::sqrt(5e9 / (7.0 * q_dim))) / kQueryBlock * kQueryBlock;
  a.seq = std::clamp<std::int64_t>(a.seq, 1, std::clamp<std::int64_t>(fit, kQueryBlock, 1024));
  a.q_start = 0;
  a.add_kv_grads = false;
  a.q_stride = a.o_stride = a.q_heads * a.head_dim;
  a.kv_stride = a.kv_heads * a.head_dim;
  r.shape = a;
  // Operands: small values of a fixed pattern (timing only; never checked).
  auto filled = [](std::int64_t n, std::uint32_t seed) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) {
      seed = seed * 1664525u + 1013904223u;
      x = static_cast<float>(seed >> 9) * (1.0f / 8388608.0f) - 0.5f;
    }
    return v;
  };
  const std::int64_t T = a.seq;
  const auto q = filled(T * a.q_stride, 1), k = filled(T * a.kv_stride, 2), v = filled(T * a.kv_stride, 3),
             dout = filled(T * a.o_stride, 4);
  std::vector<float> out(q.size()), lse(static_cast<std::size_t>(T * a.q_heads)), dq(q.size()), dk(k.size()),
      dv(v.size());
  auto seconds = [&](AttnProducts p) {
    const auto s = Clock::now();
    attention_forward(q.data(), k.data(), v.data(), nullptr, false, out.data(), lse.data(), a, r.threads, p);
    attention_backward(q.data(), k.data(), v.data(), nullptr, false, out.data(), lse.data(), dout.data(), dq.data(),
                       dk.data(), dv.data(), nullptr, a, r.threads, p);
    return std::chrono::duration<double>(Clock::now() - s).count();
  };
  seconds(AttnProducts::fp32);  // warm-up: the threads' rooms
  if (r.pairs_available) seconds(AttnProducts::bf16_pairs);
  r.fp32_s = r.pairs_s = 1e300;
  constexpr int kMaxRounds = 5;
  while (r.rounds < kMaxRounds &&
         (r.rounds == 0 || std::chrono::duration<double>(Clock::now() - t0).count() < budget_s)) {
    const bool pairs_first = r.pairs_available && r.rounds % 2 == 1;  // a drifting machine favours neither
    if (pairs_first) r.pairs_s = std::min(r.pairs_s, seconds(AttnProducts::bf16_pairs));
    r.fp32_s = std::min(r.fp32_s, seconds(AttnProducts::fp32));
    if (r.pairs_available && !pairs_first) r.pairs_s = std::min(r.pairs_s, seconds(AttnProducts::bf16_pairs));
    ++r.rounds;
  }
  if (!r.pairs_available) r.pairs_s = 0.0;
  r.choice =
      r.pairs_available && r.fp32_s >= kBf16PairsMargin * r.pairs_s ? AttnProducts::bf16_pairs : AttnProducts::fp32;
  r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace mt::cpu
