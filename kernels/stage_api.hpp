// The per-stage compute API the streaming engine calls. A stage is a *stateless template*: it knows its
// shapes (from the ModelConfig) and its kernels, holds no weights, and computes with whatever parameter
// buffer it is handed at call time (a pointer into a streamed slot, laid out by stage_layout(); never
// copied).
//
// Precision (ComputeCtx::precision, kernels/precision.hpp): the weight pointers (`params`, `head_params`,
// `embed_params`) are `const void*`. fp32: they point to float arrays. bf16: to bf16_t arrays laid out
// exactly as the fp32 ParamLayout (same element offsets, 2 bytes each: the compute copy of the fp32
// masters). Gradient buffers, hidden states x/dx and workspaces are fp32 in both. In bf16 mode every
// matrix product takes the bf16 weights and its activation (or output gradient) rounded to bf16 (RNE),
// accumulating in fp32 into fp32 outputs (cpu/ops_bf16.hpp); the embedding gathers bf16 rows widened to
// fp32; norm weights and all biases are read from the bf16 copy and widened; norms, RoPE, attention (on
// the fp32 q/k/v the products produce), activations, softmax statistics, cross-entropy and every gradient
// accumulation stay fp32. bf16 results do not depend on the thread count either (ops_bf16.hpp says how).
// The workspace size functions take the precision: bf16 needs extra scratch for
// the converted operands, so size with the precision the calls will use. Gradients are *added* into a caller-owned
// buffer of the same layout, so micro-batches accumulate. Every call takes explicit workspace (sized by the
// *_workspace_floats functions) and an explicit thread count: nothing here allocates in the hot path or owns state
// between calls.
//
// Stages: 0 = embedding, 1..L = decoder layers (the layer index does not change the layout's offsets,
// so the layer functions do not take it), L+1 = head (final norm + LM head + softmax cross-entropy).
//
// Loss convention (the engine must follow it, see step_math.hpp): the head returns the *sum* of token
// losses over the micro-batch and the count of counted tokens (targets != -100); every gradient it and
// the layers produce is d(sum of losses). Division by the step's total counted tokens happens once, in
// AdamW's grad_scale. So a micro-batch's gradients do not depend on the other micro-batches.
//
// Aliasing: outputs never alias inputs (x_out != x_in, dx != dy). Buffers need no particular alignment.
// Threads: results do not depend on ComputeCtx::threads (tested bit for bit through whole training
// steps). All parallelism is on OpenMP's pool: each matrix product is cut into tiles that depend on its
// shape only, and each tile is one single-threaded library call (oneDNN's sgemm or bf16 matmul), so
// every output element is the same dot product in the same order whatever the thread count.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/model_config.hpp"
#include "kernels/param_layout.hpp"
#include "kernels/precision.hpp"

namespace mt {

using token_t = std::int32_t;
inline constexpr token_t kIgnoreIndex = -100;  // targets equal to this are not counted

// A micro-batch's rows: `batch` sequences of `seq` tokens and, with documents (data.packing = documents),
// each token's position within its document, [batch * seq] where the backend computes (null: the stream,
// position = t). A token sees only the earlier tokens of its own document; RoPE and GPT-2's learned
// positions read its position. The stages take this (a stream: `{batch, seq}`; embeddings: (batch, seq) too).
struct BatchRows {
  std::int64_t batch = 0, seq = 0;
  const std::int32_t* positions = nullptr;
};

// The load-balancing loss (ModelConfig::output_router_logits) exchanged with one MoE layer for one
// micro-batch: the forward writes the layer's statistics into host arrays of num_experts (overwritten),
// the backward reads the per-expert gradient the step computed from every layer's statistics
// (step_math.hpp: moe_balance), where the backend computes. Null members: not wanted.
struct MoeBalance {
  std::int64_t* counts = nullptr;  // forward: the layer's choices per expert
  float* prob_sums = nullptr;      // forward: sum over tokens of softmax(z)_e (ops.hpp: moe_balance_stats)
  const float* grad = nullptr;     // backward: d(objective)/d(p_e), the same for every token and layer
};

struct ComputeCtx {
  int threads = 1;                        // OpenMP threads for every kernel, sgemm included (split on OpenMP's pool)
  std::int64_t head_chunk = 0;            // tokens per LM-head chunk; 0 = head_chunk_tokens(). Changes the bits of
                                          // the head's weight gradient (summation order), so engine and reference
                                          // must use the same value; tests set it small to exercise chunking.
  Precision precision = Precision::fp32;  // what the weight pointers hold (see the top of this file)
  // Sequence tiles (long context): 0 = whole sequences; else recomputing layers run `seq_tile` tokens of
  // one sequence at a time and the head norms and chunks at most that many rows, so their workspace is
  // tile-sized but for attention's keys and values (see layer_workspace_floats). Changes the bits
  // (summation order across tiles): engine and reference must use the same value. A value >= seq is
  // the same as 0. Families without a tiled form (GPT-2) refuse 0 < seq_tile < seq.
  std::int64_t seq_tile = 0;
};

// How a layer's backward gets its activations: recompute them from the saved layer input (one extra
// forward), or use the intermediates its forward kept in a `saved` buffer (no recomputation).
enum class ActivationMode { recompute, keep };

// ---- Validation: each throws std::invalid_argument naming the problem, before any compute. ----
// Every stage call below runs these (and ModelConfig::validate) on its arguments first.
// batch > 0, seq > 0, seq <= max_position_embeddings (the rotary / position table)
void validate_batch_shape(const ModelConfig& c, std::int64_t batch, std::int64_t seq);
void validate_tokens(const ModelConfig& c, const token_t* tokens, std::size_t n);    // every id in [0, vocab_size)
void validate_targets(const ModelConfig& c, const token_t* targets, std::size_t n);  // in [0, vocab_size) or -100
// Documents' positions (BatchRows::positions, on the host): each row starts at 0 and each position is 0
// (a document starts) or the one before plus 1. Nothing to check in the stream (null positions).
void validate_positions(const BatchRows& rows);

// ---- Initialisation (Hugging Face conventions) ----
// normal(0, initializer_range) for matrices and embeddings, norm weights 1, biases 0; GPT-2's
// attn.c_proj/mlp.c_proj weights use std initializer_range / sqrt(2 * num_hidden_layers). Each stage
// draws from its own stream derived from (seed, stage), so stages can be initialised independently and
// in any order; padding between tensors is zeroed. `params` holds stage_layout(c, stage).total_floats.
// Always fp32 (the masters); a bf16 run's compute copy is cpu::to_bf16 of them.
// Within a stage each tensor is drawn in 64Ki-element pieces with their own sub-streams, so the result
// does not depend on `threads`.
void init_stage_params(const ModelConfig& c, std::int64_t stage, std::uint64_t seed, float* params, int threads = 1);

// ---- Stage 0: embedding ----
// x_out[b, t, :] = wte[tokens[b, t]] (+ wpe[t] for GPT-2). Hidden states are [batch, seq, hidden_size].
void embedding_forward(const ModelConfig& c, const void* params, const token_t* tokens, std::int64_t batch,
                       std::int64_t seq, float* x_out, const ComputeCtx& ctx);
// grads += scatter of dx into the rows of wte (and wpe for GPT-2). Deterministic: rows are summed in
// token order whatever the thread count.
void embedding_backward(const ModelConfig& c, const token_t* tokens, std::int64_t batch, std::int64_t seq,
                        const float* dx, float* grads, const ComputeCtx& ctx);
// The same with documents' positions (rows.positions on the host, validated here; null: as above).
void embedding_forward(const ModelConfig& c, const void* params, const token_t* tokens, const BatchRows& rows,
                       float* x_out, const ComputeCtx& ctx);
void embedding_backward(const ModelConfig& c, const token_t* tokens, const BatchRows& rows, const float* dx,
                        float* grads, const ComputeCtx& ctx);

// ---- Stages 1..L: decoder layers (Llama/Qwen2/Qwen3/Mistral, or GPT-2 by c.arch) ----
// Floats of the intermediates a forward keeps for a no-recompute backward.
std::size_t layer_saved_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq);
// Scratch for layer_forward and layer_backward. In recompute mode it includes room for the
// intermediates (layer_saved_floats), so the same size serves both calls. `precision` must be the one the
// calls run with (bf16 adds room for the bf16-rounded operands and widened norm weights; fp32 sizes are
// unchanged). The saved buffer (layer_saved_floats) does not depend on the precision.
// Recompute mode with 0 < seq_tile < seq runs the layer in sequence tiles: the workspace is then
// the keys, values and their gradients of the whole micro-batch (4 x batch x seq x kv_dim, Qwen3's k norm
// adds its input and statistics), the RoPE tables (seq x head_dim) and one tile's activations; keep
// mode always runs whole sequences (its saved buffer is whole-sequence anyway).
// SequenceBuffers::apart leaves the sequence-sized part out (layer_sequence_floats): the caller keeps
// it elsewhere and passes it to the layer calls (LayerBuffers::sequence).
enum class SequenceBuffers { in_workspace, apart };
std::size_t layer_workspace_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq, ActivationMode mode,
                                   Precision precision = Precision::fp32, std::int64_t seq_tile = 0,
                                   SequenceBuffers sequence = SequenceBuffers::in_workspace);
// The sequence-sized part of a tiled layer's workspace: keys, values and their gradients, Qwen3's k-norm
// input and statistics, the RoPE tables. 0 when the layer does not run tiled (seq_tile 0 or >= seq).
std::size_t layer_sequence_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq, std::int64_t seq_tile);
// A tiled layer's attention output and log-sum-exp over the whole micro-batch (batch x seq x (q_dim +
// heads)): given to layer_forward to write and layer_backward to read (LayerBuffers::attention), the
// backward does not run the attention forward again. 0 when the layer does not run tiled.
std::size_t layer_attention_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq, std::int64_t seq_tile);
// Whether a recomputing layer of this shape runs in sequence tiles (throws for a family without them).
bool layer_runs_tiled(const ModelConfig& c, std::int64_t seq, std::int64_t seq_tile);
// Whether the model's layer family has a sequence-tiled form (GPT-2 has none: its positions bound it).
bool layer_has_seq_tiles(const ModelConfig& c);

// One decoder layer's buffers for one micro-batch of `rows` (N = batch x seq tokens, d = hidden_size), the
// one argument layer_forward and layer_backward take at every level (here, stages.hpp, the Backend), the
// way llm.c's ActivationTensors lays out a model's activations: the caller fills it once and hands the
// same struct to the forward and the backward. Every buffer lives where the stage computes (host memory
// for the ComputeCtx calls, device or mapped host memory for a Backend's); fp32 unless said; no
// alignment needed. A field a call does not read may hold anything (null included).
struct LayerBuffers {
  // [N, d] the layer's input. Read by the forward, and by the backward either way: recomputing, it runs
  // the forward again from it; keeping, it makes again from it what the forward left out (its norm).
  const float* x_in = nullptr;
  float* x_out = nullptr;     // [N, d] forward: written, layer(x_in). Never aliases x_in
  const float* dy = nullptr;  // [N, d] backward: read, d(loss)/d(x_out)
  float* dx = nullptr;        // [N, d] backward: written, d(loss)/d(x_in). Never aliases dy
  float* grads = nullptr;     // the layer's stage_layout floats, backward: d(loss)/d(params) *added*
  // Keep mode: layer_saved_floats floats; the forward writes its intermediates there and the backward of
  // the same x_in and params reads them (no recomputation). Null: recompute mode, the intermediates live
  // only in the workspace, which must then be sized for ActivationMode::recompute.
  float* saved = nullptr;
  // layer_workspace_floats floats (the mode, precision and seq_tile of the calls, SequenceBuffers::apart
  // when `sequence` is set): scratch of either call, nothing in it outlives a call.
  float* workspace = nullptr;
  // Sequence tiles only (the layer runs tiled: layer_runs_tiled), ignored otherwise; null: not wanted.
  // sequence: layer_sequence_floats, the sequence-sized buffers kept out of the workspace (the engine's
  // in host RAM when nothing else fits the device budget); where they are never changes the results.
  float* sequence = nullptr;
  // attention: layer_attention_floats; the forward writes the layer's attention output and log-sum-exp,
  // the backward of the same micro-batch reads them instead of running the attention forward again. The
  // same bits either way.
  float* attention = nullptr;
  // An expert layer's load-balancing loss (MoeBalance: the forward's statistics, the backward's
  // gradient); null or a dense layer: none.
  const MoeBalance* balance = nullptr;
};

// forward: x_out = layer(x_in), keeping the intermediates in `saved` when it is set.
// backward: dx = d(loss)/d(x_in) from dy, grads += d(loss)/d(params); recomputes the forward once from
// x_in when `saved` is null, else reads what layer_forward wrote there for this same x_in and params.
// rows.positions (documents) on the host, validated here. `ctx.seq_tile` picks the sequence tiles.
void layer_forward(const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b,
                   const ComputeCtx& ctx);
void layer_backward(const ModelConfig& c, const void* params, const BatchRows& rows, const LayerBuffers& b,
                    const ComputeCtx& ctx);

// ---- Stage L+1: head = final norm, LM head, softmax cross-entropy, fused and chunked over tokens ----
// B x T x V logits are never materialised: head_chunk_tokens(c, batch, seq) rows at a time (a pure
// function of the shapes, so the engine and the reference trainer chunk identically).
std::int64_t head_chunk_tokens(const ModelConfig& c, std::int64_t batch, std::int64_t seq);
// Sized for chunks of head_chunk_tokens() (or of chunk_tokens when > 0, see ComputeCtx::head_chunk), for
// calls running at `precision` (bf16 adds room for the rounded operands and the widened norm).
// With 0 < seq_tile < seq the final norm runs per chunk too and chunks are at most seq_tile rows, so only
// the per-token losses (batch x seq floats) are sequence-sized.
std::size_t head_workspace_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq,
                                  std::int64_t chunk_tokens = 0, Precision precision = Precision::fp32,
                                  std::int64_t seq_tile = 0);

struct LossSum {
  double loss_sum = 0.0;     // sum of -log softmax(target) over counted tokens, in token order
  std::int64_t counted = 0;  // tokens whose target != -100
};

// The head's buffers for one micro-batch (N = batch x seq tokens, d = hidden_size), the one argument
// head_forward_backward takes at every level, as LayerBuffers for a layer. Where the stage computes.
struct HeadBuffers {
  const float* x_in = nullptr;       // [N, d] read: the last layer's output
  const token_t* targets = nullptr;  // [N] read: the target ids (kIgnoreIndex: not counted)
  float* dx = nullptr;               // [N, d] written: d(sum of losses)/d(x_in). Null: loss only, no gradients
  float* head_grads = nullptr;       // the head's stage_layout floats: d(sum of losses)/d(params) *added*
  // Tied embeddings (c.tie_word_embeddings, and always GPT-2): the LM head is stage 0's embedding matrix,
  // and the head adds d/d(wte) into stage 0's gradient buffer here. Untied: unused.
  float* embed_grads = nullptr;
  float* workspace = nullptr;  // head_workspace_floats (the calls' head_chunk, precision and seq_tile)
};

// Tied embeddings: `embed_params` must point at stage 0's params (untied: ignored, pass nullptr).
// rows.positions are not read: the loss is per token.
LossSum head_forward_backward(const ModelConfig& c, const void* head_params, const void* embed_params,
                              const BatchRows& rows, const HeadBuffers& b, const ComputeCtx& ctx);

// ---- Any stage by index (0 = embedding, 1..L = layers, L+1 = head) ----
// Workspace floats the stage's forward and backward need (the embedding needs none); the engine can
// size one arena slot as the maximum over stages. Pass the run's precision (ComputeCtx::precision).
std::size_t stage_workspace_floats(const ModelConfig& c, std::int64_t stage, std::int64_t batch, std::int64_t seq,
                                   ActivationMode mode, Precision precision = Precision::fp32,
                                   std::int64_t seq_tile = 0);

// The full logits [batch, seq, vocab] (tests and evaluation only: this one materialises them).
// workspace: head_workspace_floats floats.
void head_logits(const ModelConfig& c, const void* head_params, const void* embed_params, const float* x_in,
                 std::int64_t batch, std::int64_t seq, float* logits, float* workspace, const ComputeCtx& ctx);

}  // namespace mt
