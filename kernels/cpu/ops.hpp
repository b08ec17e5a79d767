// The CPU kernels under the stage templates: fp32, vectorised (AVX2/FMA when built for x86-64-v3) and
// split over `threads` OpenMP threads by rows, so a row's result never depends on the thread count.
// Reductions across rows (norm weight and bias gradients) split over columns and sum rows in order.
// The plain loops they are tested against are the templates in kernels/cpu/reference_ops.hpp.
//
// Shapes: N rows (tokens) of D features, row-major. Matrices W are [out, in] (torch.nn.Linear).
// "grad" outputs named d*_acc are added into; others are overwritten unless `add` says otherwise.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/op_shapes.hpp"  // RopeParams, AttnShape: the op seam's shapes

namespace mt::cpu {

using mt::AttnShape;
using mt::RopeKind;
using mt::RopeParams;
using mt::RouterKind;
using mt::RouteShape;

// Ends the calling thread's OpenMP worker pool. libgomp keeps a thread's workers for its next parallel
// region, and once the workers of all pools outnumber the cores it stops spin-waiting in every team:
// each parallel region then wakes its workers from a futex. Measured here (2 cores, libgomp 12): a
// 2-thread region with a 10 us serial gap costs 16 us while it is the only pool, 90 us once another
// thread has run a 2-thread region, and still 90 us after that thread has exited or paused itself. A
// pause on the process's initial thread brings back 16 us in both cases (not when the other thread
// still holds its pool). Called by the thread that runs the engine (the initial thread in the node and
// the benchmarks) before compute's team starts.
void release_thread_pool();

// ---- matmul (oneDNN sgemm or OpenBLAS sgemm per product, chosen by measurement; see matmul.cpp) ----
// The three products of a linear layer, by orientation: forward y = x W^T (NT), backward-input
// dx = dy W (NN), backward-weight dW += dy^T x (TN).
enum class LinearProduct { forward, backward_input, backward_weight };
inline constexpr int kLinearProducts = 3;
const char* linear_product_name(LinearProduct p);  // "forward" | "backward_input" | "backward_weight"

// The fp32 products' library.
enum class Fp32Gemm { onednn, openblas };
const char* fp32_gemm_name(Fp32Gemm g);                            // "onednn" | "openblas"
std::optional<Fp32Gemm> parse_fp32_gemm(const std::string& name);  // nullopt for anything else

// The library of each of the three products, and of single layer shapes where it differs (one library
// need not be the fastest on every shape of a product: the probe measures each of a run's layers).
struct Fp32GemmChoice {
  Fp32Gemm lib[kLinearProducts] = {Fp32Gemm::onednn, Fp32Gemm::onednn, Fp32Gemm::onednn};
  struct Shape {  // product p of a layer with weights [out, in] runs on lib
    LinearProduct product = LinearProduct::forward;
    std::int64_t in = 0, out = 0;
    Fp32Gemm lib = Fp32Gemm::onednn;
    bool operator==(const Shape& o) const { return product == o.product && in == o.in && out == o.out && lib == o.lib; }
  };
  std::vector<Shape> shapes;
  Fp32Gemm operator[](LinearProduct p) const { return lib[static_cast<int>(p)]; }
  Fp32Gemm& operator[](LinearProduct p) { return lib[static_cast<int>(p)]; }
  // Product p of a layer [out, in]: its shape's library when listed, else the product's.
  Fp32Gemm of(LinearProduct p, std::int64_t in, std::int64_t out) const;
  bool operator==(const Fp32GemmChoice& o) const;
  bool operator!=(const Fp32GemmChoice& o) const { return !(*this == o); }
  static Fp32GemmChoice all(Fp32Gemm g);
  // "onednn" when the three agree, else "forward onednn, backward_input onednn, backward_weight openblas";
  // then each listed shape, e.g. "; forward 256x1024 openblas" (the weights' [out, in]).
  std::string str() const;
};

// The library MEGATRAIN_FP32_GEMM forces for all three products ("onednn" or "openblas"; read once),
// nullopt when unset. Any other value throws std::invalid_argument naming the variable.
std::optional<Fp32Gemm> fp32_gemm_forced();
// What the products run (or will run, when none has yet): set, else forced, else oneDNN for all three
// (the default of library callers and tests, which never probe).
Fp32GemmChoice fp32_gemm_choice();
// Whether the choice is fixed for this process: set_fp32_gemm_choice was called or a product ran.
bool fp32_gemm_fixed();
// Fixes the choice for the rest of the process and returns the one in effect (the forced library when
// MEGATRAIN_FP32_GEMM is set). Asking again for the choice in effect is a no-op; asking for another once
// fixed throws std::logic_error (a run's products must not change library under it).
Fp32GemmChoice set_fp32_gemm_choice(const Fp32GemmChoice& c);
// OpenBLAS's build and the core its kernels were picked for, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH
// NO_AFFINITY Zen MAX_THREADS=64, core Zen" (OPENBLAS_CORETYPE, read when the library loads, changes the
// core): with the CPU, what a measured choice is keyed by.
std::string openblas_version();

// One linear layer of a run, for the probes: `rows` tokens, weights [out, in].
struct LinearShape {
  std::int64_t rows = 0, in = 0, out = 0;
};

// What probe_fp32_gemm measured: per product and library, the sum over the probed shapes of each
// product's best time.
struct Fp32Probe {
  std::vector<LinearShape> shapes;  // as timed (rows and out capped, as probe_bf16_gemm caps them)
  int threads = 1, rounds = 0;
  double onednn_s[kLinearProducts] = {}, openblas_s[kLinearProducts] = {};
  double warmup_s = 0.0, wall_s = 0.0;
  Fp32GemmChoice choice;  // per product by its sum over the shapes; a shape listed where it differs
  // onednn_s / openblas_s for one product (> 1: OpenBLAS faster)
  double openblas_speedup(LinearProduct p) const {
    const int i = static_cast<int>(p);
    return openblas_s[i] > 0 ? onednn_s[i] / openblas_s[i] : 0.0;
  }
};
// OpenBLAS is chosen for a product when oneDNN takes at least this much longer on it; within the margin
// oneDNN stays (noise must not flip the choice, and oneDNN is what runs without a probe).
inline constexpr double kFp32OpenblasMargin = 1.10;
// A layer shape runs on the other library than its product's when that one took at most 1/this of the
// time on it: a wider margin, since one shape's times are fewer and noisier than a product's sum.
inline constexpr double kFp32ShapeMargin = 1.5;
// Times the three products of each shape on both libraries, split as the linear products split them, at
// `threads` threads (one untimed warm-up each), alternating the libraries in rounds while under
// `budget_s` (at least 2 rounds, at most 5), and picks per product by kFp32OpenblasMargin, then per
// shape where a shape's own times favour the other library by kFp32ShapeMargin. Rows are cut
// to 0.25 GFLOP a product (multiples of 64, at least 64), out to 8M weight elements. Fixes nothing.
Fp32Probe probe_fp32_gemm(const std::vector<LinearShape>& shapes, int threads, double budget_s = 0.2);

// The GEMM library of each product and what it dispatched to, e.g. "oneDNN 2.6.3 sgemm (avx512_core_amx)",
// or per product when they differ.
const char* gemm_backend_name();
// C[M, N] = op(A) op(B) + beta C, row-major, on the calling thread only (for kernels that split work
// themselves, e.g. attention's tiles): oneDNN's sgemm, whatever the linear products' choice.
void sgemm_serial(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda,
                  const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);
// y[N, out] = x[N, in] W^T (+ bias)
void linear_forward(const float* x, const float* W, const float* bias, float* y, std::int64_t N, std::int64_t in,
                    std::int64_t out, int threads);
// dx[N, in] (= or +=) dy[N, out] W
void linear_backward_input(const float* dy, const float* W, float* dx, std::int64_t N, std::int64_t in,
                           std::int64_t out, bool add, int threads);
// dW_acc[out, in] += dy^T x ; dbias_acc[out] += column sums of dy (when non-null)
void linear_backward_weight(const float* dy, const float* x, float* dW_acc, float* dbias_acc, std::int64_t N,
                            std::int64_t in, std::int64_t out, int threads);
// The grouped products of a mixture's experts (ops.hpp's grouped_linear_*, fp32): rows offsets[e] ..
// offsets[e + 1] through expert e's W + e * w_stride ([out, in]) and bias + e * b_stride (bias, dx and
// db_acc may be null). The bits of one linear product per expert, in one parallel region over every
// expert's tiles (matmul.cpp).
void grouped_linear_forward(const float* x, const float* W, std::int64_t w_stride, const float* bias,
                            std::int64_t b_stride, float* y, const std::int64_t* offsets, std::int64_t experts,
                            std::int64_t in, std::int64_t out, int threads);
void grouped_linear_backward(const float* dy, const float* x, const float* W, std::int64_t w_stride, float* dx,
                             bool add, float* dW_acc, float* db_acc, std::int64_t b_stride, const std::int64_t* offsets,
                             std::int64_t experts, std::int64_t in, std::int64_t out, int threads);
// db_acc[D] += sum over rows of dy[N, D], rows in order per column.
void colsum_add(const float* dy, float* db_acc, std::int64_t N, std::int64_t D, int threads);

// ---- RMSNorm (Llama): y = x * rsqrt(mean(x^2) + eps) * w ----
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, std::int64_t N, std::int64_t D, float eps,
                     int threads);
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw_acc,
                      std::int64_t N, std::int64_t D, bool add, int threads);

// ---- LayerNorm with bias (GPT-2) ----
void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                       std::int64_t N, std::int64_t D, float eps, int threads);
void layernorm_backward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy,
                        float* dx, float* dw_acc, float* db_acc, std::int64_t N, std::int64_t D, bool add, int threads);

// ---- Rotary embeddings, Hugging Face layout (rotate_half over the two halves of each head) ----
// Tables cos/sin [seq, head_dim/2] for positions 0..seq-1, computed in fp32 the way transformers does
// (inv_freq = 1 / theta^(2i/d), then p.kind's scaling: llama3, linear, dynamic, yarn), each multiplied by
// the attention scaling (yarn's; 1 for the others). Dynamic scaling depends on seq (the forward's T).
void rope_table(const RopeParams& p, std::int64_t seq, std::int64_t head_dim, float* cos_t, float* sin_t);
// transformers' inv_freq [head_dim/2] for a forward over `seq` positions (only dynamic reads seq), in
// fp32 as it computes it; returns the fp32 factor cos and sin are multiplied by (attention_scaling).
float rope_inv_freq(const RopeParams& p, std::int64_t seq, std::int64_t head_dim, float* inv_freq);
// In place on x[B*T rows, heads, head_dim] with `row_stride` floats between tokens; position = row % seq,
// or positions[row] when given (documents). inverse = true applies the transpose rotation (the backward).
void rope_apply(float* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                std::int64_t row_stride, const float* cos_t, const float* sin_t, bool inverse, int threads,
                const std::int32_t* positions = nullptr);

// ---- Causal grouped-query attention, tiled over keys with an online softmax (no T x T buffers) ----
// out[token, h*hd + i]; lse[(b*q_heads + h)*seq + t] = log-sum-exp of the scaled scores (for backward),
// the sink's logit included. sinks: null, or q_heads logits (bf16_t when sinks_bf16, else float); the
// sliding window is s.window (ops.hpp says both).
// products: how the block products run (attention.cpp): fp32, or bf16 pairs (AVX512-BF16 only; a logic
// error elsewhere).
enum class AttnProducts { fp32, bf16_pairs };
const char* attn_products_name(AttnProducts p);                            // "fp32" | "pairs"
std::optional<AttnProducts> parse_attn_products(const std::string& name);  // nullopt for anything else

// The products a bf16 run's attention takes on the CPU backend: the run sets them before its first step
// (plan/kernel_choice.hpp measures which is faster); fp32 until then. MEGATRAIN_BF16_ATTENTION=pairs|fp32
// forces them over any setting (read once; another value throws std::invalid_argument naming the
// variable); pairs on a CPU without AVX512-BF16 run fp32. set_ returns what is in effect.
AttnProducts bf16_attention_products();
AttnProducts set_bf16_attention_products(AttnProducts p);
std::optional<AttnProducts> bf16_attention_forced();

// What probe_bf16_attention measured: the forward + backward of one attention on each path (best of its
// rounds, the paths alternating), and the faster one (pairs need kBf16PairsMargin).
struct AttnProbe {
  AttnShape shape;
  int threads = 1, rounds = 0;
  bool pairs_available = false;  // false: only fp32 was timed
  double fp32_s = 0.0, pairs_s = 0.0, wall_s = 0.0;
  AttnProducts choice = AttnProducts::fp32;
  double pairs_speedup() const { return pairs_available && pairs_s > 0 ? fp32_s / pairs_s : 0.0; }
};
inline constexpr double kBf16PairsMargin = 1.10;
// The run's heads at `seq` positions (batch 1; cut to 1024, and to ~5 GFLOP a forward + backward for wide
// models, so the probe stays near its budget), `threads` threads, one untimed warm-up of each path, then
// rounds while under budget_s (at least 1, at most 5). Fixes nothing.
AttnProbe probe_bf16_attention(const AttnShape& shape, int threads, double budget_s = 0.1);
void attention_forward(const float* q, const float* k, const float* v, const void* sinks, bool sinks_bf16, float* out,
                       float* lse, const AttnShape& s, int threads, AttnProducts products = AttnProducts::fp32);
// dq, dk, dv overwritten (same strides as q, k, v); dsinks_acc += (with sinks). Parallel over (batch, kv
// head), the sinks over heads: deterministic.
void attention_backward(const float* q, const float* k, const float* v, const void* sinks, bool sinks_bf16,
                        const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv,
                        float* dsinks_acc, const AttnShape& s, int threads, AttnProducts products = AttnProducts::fp32);

// ---- Activations ----
// SwiGLU: h = silu(g) * u over n elements.
void swiglu_forward(const float* g, const float* u, float* h, std::size_t n, int threads);
void swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, std::size_t n, int threads);
// gpt-oss's clamped form: c = min(g, limit), h = (clamp(u, -limit, limit) + 1) * c * sigmoid(alpha c); the
// backward passes no gradient through clamped values.
void clamped_swiglu_forward(const float* g, const float* u, float* h, std::size_t n, float alpha, float limit,
                            int threads);
void clamped_swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, std::size_t n,
                             float alpha, float limit, int threads);
// GELU, tanh form (GPT-2's gelu_new): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(const float* x, float* y, std::size_t n, int threads);
void gelu_backward(const float* x, const float* dy, float* dx, std::size_t n, int threads);

// ---- Embedding rows (cpu/embedding.cpp) ----
// y[r] = wte[tokens[r]] (+ wpe[r % seq], or wpe[positions[r]] with documents), bf16 rows widened exactly;
// ids already validated.
void embedding_gather(const float* wte, const float* wpe, const std::int32_t* tokens, std::int64_t N, std::int64_t seq,
                      std::int64_t d, float* y, int threads, const std::int32_t* positions = nullptr);
void embedding_gather(const std::uint16_t* wte, const std::uint16_t* wpe, const std::int32_t* tokens, std::int64_t N,
                      std::int64_t seq, std::int64_t d, float* y, int threads, const std::int32_t* positions = nullptr);
// dwte_acc[tokens[r]] += dx[r] (and dwpe_acc at r's position as the gather reads it, when non-null);
// every column adds rows in token order, so repeated tokens sum the same way whatever the thread count.
void embedding_scatter(const std::int32_t* tokens, const float* dx, std::int64_t N, std::int64_t seq, std::int64_t d,
                       float* dwte_acc, float* dwpe_acc, int threads, const std::int32_t* positions = nullptr);

// ---- Softmax cross-entropy over one chunk of rows ----
// logits[rows, V] is overwritten with d(sum of losses)/d(logits) = softmax - onehot(target) for counted
// rows and 0 for ignored ones (target == -100); row_loss[r] = lse - logit[target] (0 when ignored).
// want_grad = false leaves logits as they are.
void cross_entropy_rows(float* logits, const std::int32_t* targets, float* row_loss, std::int64_t rows, std::int64_t V,
                        bool want_grad, int threads);

// ---- Mixture of experts (cpu/moe.cpp): the ops of the same names in ops.hpp, with their contracts ----
void moe_route(const float* logits, const RouteShape& s, std::int32_t* expert, float* weight, int threads);
void moe_route_backward(const float* logits, const std::int32_t* expert, const float* weight, const float* dweight,
                        float* dlogits, const RouteShape& s, int threads);
void moe_dispatch(const std::int32_t* expert, const RouteShape& s, std::int32_t* order, std::int32_t* slot_pos,
                  std::int64_t* offsets);
void moe_gather(const float* x, const std::int32_t* order, const RouteShape& s, std::int64_t d, float* xe, int threads);
void moe_gather_backward(const float* dxe, const std::int32_t* slot_pos, const RouteShape& s, std::int64_t d, float* dx,
                         bool add, int threads);
void moe_combine(const float* ye, const std::int32_t* slot_pos, const float* weight, const RouteShape& s,
                 std::int64_t d, float* y, int threads);
void moe_combine_backward(const float* dy, const float* ye, const std::int32_t* slot_pos, const float* weight,
                          const RouteShape& s, std::int64_t d, float* dye, float* dweight, int threads);
void moe_balance_stats(const float* logits, const std::int32_t* expert, const float* weight, const RouteShape& s,
                       float* prob_sums, int threads);
void moe_balance_backward(const float* logits, const std::int32_t* expert, const float* weight, const float* grad,
                          const RouteShape& s, float* dlogits, float* dweight, int threads);

}  // namespace mt::cpu
