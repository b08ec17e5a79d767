// Stage L+1: final norm, LM head and softmax cross-entropy, fused and chunked over tokens, written once
// over the ops. Per chunk: logits = n W^T, cross_entropy_rows turns them into d(loss)/d(logits) in
// place, then dn = dlogits W and dW += dlogits^T n. Only one chunk of logits exists at a time. In
// sequence tiles (long context) the final norm and its backward run per chunk too, so nothing but the
// per-token losses is sequence-sized.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/layer_impl.hpp"
#include "kernels/layout_cache.hpp"
#include "kernels/stages.hpp"
#include "kernels/workspace.hpp"

namespace mt {

namespace {

struct HeadWs {
  float *xn, *mean, *rstd, *dxn, *logits, *row_loss;
  float* operand_room;  // bf16: the rounded normed input (all rows), one chunk's rounded dlogits, the norm
};

// `normed` rows: N (the norm over all rows first), or one chunk (sequence tiles: the norm per chunk).
OperandRoom head_operand_room(const ModelConfig& c, std::int64_t normed, std::int64_t chunk) {
  return {normed * c.hidden_size, chunk * c.vocab_size, c.hidden_size};
}

HeadWs carve(const ModelConfig& c, std::int64_t N, std::int64_t normed, std::int64_t chunk, Precision p, float* base,
             std::size_t* used = nullptr) {
  detail::Carver cv(base);
  HeadWs w{};
  w.xn = cv.take(normed * c.hidden_size);
  w.mean = cv.take(normed);
  w.rstd = cv.take(normed);
  w.dxn = cv.take(normed * c.hidden_size);
  w.logits = cv.take(chunk * c.vocab_size);
  w.row_loss = cv.take(N);
  w.operand_room = base ? base + cv.used() : nullptr;
  if (used) *used = cv.used() + operand_room_floats(p, head_operand_room(c, normed, chunk));
  return w;
}

struct HeadWeights {
  const void *norm_w, *norm_b, *lm;  // the run's precision; lm: [vocab, hidden]
  float *g_norm_w, *g_norm_b, *g_lm;
};

HeadWeights bind(const ModelConfig& c, const void* head_params, const void* embed_params, float* head_grads,
                 float* embed_grads, Precision p) {
  const bool tied = c.is_gpt2() || c.tie_word_embeddings;
  if (!head_params) throw std::invalid_argument("head: head_params must be non-null");
  if (tied && !embed_params)
    throw std::invalid_argument("head: tied embeddings need embed_params (stage 0's parameters)");
  struct Offsets {
    std::size_t norm_w = 0, norm_b = 0, lm = 0;
  };
  const Offsets& off = detail::per_shape<Offsets>(c, [&] {  // looked up once per model shape
    const ParamLayout& hl = detail::cached_head_layout(c);
    Offsets r;
    r.norm_w = hl.at(c.is_gpt2() ? "ln_f.weight" : "model.norm.weight").offset;
    if (c.is_gpt2()) r.norm_b = hl.at("ln_f.bias").offset;
    r.lm = tied ? detail::cached_embedding_layout(c).tensors[0].offset : hl.at("lm_head.weight").offset;
    return r;
  });
  HeadWeights w{};
  w.norm_w = detail::elem_offset(head_params, off.norm_w, p);
  w.g_norm_w = head_grads ? head_grads + off.norm_w : nullptr;
  if (c.is_gpt2()) {
    w.norm_b = detail::elem_offset(head_params, off.norm_b, p);
    w.g_norm_b = head_grads ? head_grads + off.norm_b : nullptr;
  }
  w.lm = detail::elem_offset(tied ? embed_params : head_params, off.lm, p);  // wte / embed_tokens when tied
  float* lm_grads = tied ? embed_grads : head_grads;
  w.g_lm = lm_grads ? lm_grads + off.lm : nullptr;
  return w;
}

void final_norm(Ops& ops, const ModelConfig& c, const HeadWeights& w, const float* x, const HeadWs& ws,
                std::int64_t N) {
  const std::int64_t d = c.hidden_size;
  if (c.is_gpt2())
    ops.layernorm_forward(x, w.norm_w, w.norm_b, ws.xn, ws.mean, ws.rstd, N, d, c.norm_eps);
  else
    ops.rmsnorm_forward(x, w.norm_w, ws.xn, ws.rstd, N, d, c.norm_eps);
}

// dx (rows of x) = the final norm's backward of ws.dxn; its weight gradients add.
void final_norm_backward(Ops& ops, const ModelConfig& c, const HeadWeights& w, const float* x, const HeadWs& ws,
                         float* dx, std::int64_t N) {
  const std::int64_t d = c.hidden_size;
  if (c.is_gpt2())
    ops.layernorm_backward(x, w.norm_w, ws.mean, ws.rstd, ws.dxn, dx, w.g_norm_w, w.g_norm_b, N, d, false);
  else
    ops.rmsnorm_backward(x, w.norm_w, ws.rstd, ws.dxn, dx, w.g_norm_w, N, d, false);
}

bool head_tiled(std::int64_t seq, std::int64_t seq_tile) {
  if (seq_tile < 0) throw std::invalid_argument("head: seq_tile must be >= 0, got " + std::to_string(seq_tile));
  return seq_tile > 0 && seq_tile < seq;
}

std::int64_t effective_chunk(const ModelConfig& c, std::int64_t batch, std::int64_t seq, std::int64_t requested,
                             std::int64_t seq_tile) {
  const std::int64_t chunk = requested > 0 ? std::min(requested, batch * seq) : head_chunk_tokens(c, batch, seq);
  return head_tiled(seq, seq_tile) ? std::min(chunk, seq_tile) : chunk;
}

// Rows the final norm runs over at once: all of them, or (sequence tiles) one chunk.
std::int64_t normed_rows(std::int64_t batch, std::int64_t seq, std::int64_t chunk, std::int64_t seq_tile) {
  return head_tiled(seq, seq_tile) ? chunk : batch * seq;
}

}  // namespace

std::int64_t head_chunk_tokens(const ModelConfig& c, std::int64_t batch, std::int64_t seq) {
  // About 16M floats (64 MiB) of logits per chunk, in multiples of 16 tokens.
  const std::int64_t N = batch * seq;
  std::int64_t chunk = ((std::int64_t{1} << 24) / std::max<std::int64_t>(1, c.vocab_size)) / 16 * 16;
  return std::max<std::int64_t>(1, std::min(N, std::max<std::int64_t>(16, chunk)));
}

std::size_t head_workspace_floats(const ModelConfig& c, std::int64_t batch, std::int64_t seq, std::int64_t chunk_tokens,
                                  Precision precision, std::int64_t seq_tile) {
  c.validate();
  validate_batch_shape(c, batch, seq);
  std::size_t n = 0;
  const std::int64_t chunk = effective_chunk(c, batch, seq, chunk_tokens, seq_tile);
  carve(c, batch * seq, normed_rows(batch, seq, chunk, seq_tile), chunk, precision, nullptr, &n);
  return n;
}

LossSum head_forward_backward(Ops& ops, const ModelConfig& c, const void* head_params, const void* embed_params,
                              const BatchRows& rows, const HeadBuffers& b, std::int64_t head_chunk,
                              std::int64_t seq_tile) {
  const std::int64_t batch = rows.batch, seq = rows.seq;
  const float* x_in = b.x_in;
  const token_t* targets = b.targets;
  float* dx = b.dx;
  c.validate();
  validate_batch_shape(c, batch, seq);
  const std::int64_t N = batch * seq, d = c.hidden_size, V = c.vocab_size;
  const bool grad = dx != nullptr;
  const bool tied = c.is_gpt2() || c.tie_word_embeddings;
  if (grad && (!b.head_grads || (tied && !b.embed_grads)))
    throw std::invalid_argument("head: backward needs head_grads (and embed_grads when embeddings are tied)");
  if (!x_in || !targets || !b.workspace)
    throw std::invalid_argument("head: x_in, targets and workspace must be non-null");
  const HeadWeights w = bind(c, head_params, embed_params, b.head_grads, b.embed_grads, ops.precision());
  const std::int64_t chunk = effective_chunk(c, batch, seq, head_chunk, seq_tile);
  const bool tiled = head_tiled(seq, seq_tile);
  const HeadWs ws = carve(c, N, normed_rows(batch, seq, chunk, seq_tile), chunk, ops.precision(), b.workspace);
  ops.use_operand_room(ws.operand_room, head_operand_room(c, normed_rows(batch, seq, chunk, seq_tile), chunk));

  if (tiled) {  // sequence tiles: norm, logits, loss and the backward of each chunk before the next
    for (std::int64_t r0 = 0; r0 < N; r0 += chunk) {
      const std::int64_t n = std::min(chunk, N - r0);
      final_norm(ops, c, w, x_in + r0 * d, ws, n);
      ops.linear_forward(ws.xn, w.lm, nullptr, ws.logits, n, d, V);
      ops.cross_entropy_rows(ws.logits, targets + r0, ws.row_loss + r0, n, V, grad);
      if (!grad) continue;
      ops.linear_backward(ws.logits, ws.xn, w.lm, ws.dxn, false, w.g_lm, nullptr, n, d, V);
      final_norm_backward(ops, c, w, x_in + r0 * d, ws, dx + r0 * d, n);
    }
    return ops.loss_sum(ws.row_loss, targets, N);
  }
  final_norm(ops, c, w, x_in, ws, N);
  for (std::int64_t r0 = 0; r0 < N; r0 += chunk) {
    const std::int64_t n = std::min(chunk, N - r0);
    const float* xn = ws.xn + r0 * d;
    ops.linear_forward(xn, w.lm, nullptr, ws.logits, n, d, V);
    ops.cross_entropy_rows(ws.logits, targets + r0, ws.row_loss + r0, n, V, grad);
    if (grad) ops.linear_backward(ws.logits, xn, w.lm, ws.dxn + r0 * d, false, w.g_lm, nullptr, n, d, V);
  }
  if (grad) final_norm_backward(ops, c, w, x_in, ws, dx, N);
  return ops.loss_sum(ws.row_loss, targets, N);  // last: on a device it waits for the work above
}

void head_logits(Ops& ops, const ModelConfig& c, const void* head_params, const void* embed_params, const float* x_in,
                 std::int64_t batch, std::int64_t seq, float* logits, float* workspace, std::int64_t head_chunk) {
  c.validate();
  validate_batch_shape(c, batch, seq);
  const std::int64_t N = batch * seq;
  const std::int64_t chunk = effective_chunk(c, batch, seq, head_chunk, 0);
  const HeadWeights w = bind(c, head_params, embed_params, nullptr, nullptr, ops.precision());
  const HeadWs ws = carve(c, N, N, chunk, ops.precision(), workspace);
  ops.use_operand_room(ws.operand_room, head_operand_room(c, N, chunk));
  final_norm(ops, c, w, x_in, ws, N);
  ops.linear_forward(ws.xn, w.lm, nullptr, logits, N, c.hidden_size, c.vocab_size);
}

LossSum head_forward_backward(const ModelConfig& c, const void* head_params, const void* embed_params,
                              const BatchRows& rows, const HeadBuffers& b, const ComputeCtx& ctx) {
  c.validate();
  validate_batch_shape(c, rows.batch, rows.seq);
  if (b.targets) validate_targets(c, b.targets, static_cast<std::size_t>(rows.batch * rows.seq));
  cpu::CpuOps ops(ctx.precision, ctx.threads);
  return head_forward_backward(ops, c, head_params, embed_params, rows, b, ctx.head_chunk, ctx.seq_tile);
}

void head_logits(const ModelConfig& c, const void* head_params, const void* embed_params, const float* x_in,
                 std::int64_t batch, std::int64_t seq, float* logits, float* workspace, const ComputeCtx& ctx) {
  cpu::CpuOps ops(ctx.precision, ctx.threads);
  head_logits(ops, c, head_params, embed_params, x_in, batch, seq, logits, workspace, ctx.head_chunk);
}

}  // namespace mt
