// Stage 0: token (and, for GPT-2, learned position) embeddings, forward and backward, over the ops.
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/layer_impl.hpp"
#include "kernels/layout_cache.hpp"
#include "kernels/stages.hpp"

namespace mt {

namespace {

struct EmbeddingOffsets {
  std::size_t wte = 0;
  std::ptrdiff_t wpe = -1;  // GPT-2's learned positions
};

const EmbeddingOffsets& offsets(const ModelConfig& c) {
  return detail::per_shape<EmbeddingOffsets>(c, [&] {
    const ParamLayout& l = detail::cached_embedding_layout(c);
    EmbeddingOffsets o;
    o.wte = l.tensors[0].offset;
    if (c.is_gpt2()) o.wpe = static_cast<std::ptrdiff_t>(l.at("wpe.weight").offset);
    return o;
  });
}

}  // namespace

// Only GPT-2's learned positions read the documents' positions (the Llama family's RoPE is in the layers).
void embedding_forward(Ops& ops, const ModelConfig& c, const void* params, const token_t* tokens, const BatchRows& rows,
                       float* x_out) {
  const std::int64_t batch = rows.batch, seq = rows.seq;
  validate_batch_shape(c, batch, seq);
  const EmbeddingOffsets& o = offsets(c);
  const Precision p = ops.precision();
  const void* wpe = o.wpe >= 0 ? detail::elem_offset(params, static_cast<std::size_t>(o.wpe), p) : nullptr;
  ops.embedding_forward(detail::elem_offset(params, o.wte, p), wpe, tokens, batch * seq, seq, c.hidden_size, x_out,
                        wpe ? rows.positions : nullptr);
}

void embedding_backward(Ops& ops, const ModelConfig& c, const token_t* tokens, const BatchRows& rows, const float* dx,
                        float* grads) {
  const std::int64_t batch = rows.batch, seq = rows.seq;
  validate_batch_shape(c, batch, seq);
  const EmbeddingOffsets& o = offsets(c);
  ops.embedding_backward(tokens, dx, batch * seq, seq, c.hidden_size, grads + o.wte,
                         o.wpe >= 0 ? grads + o.wpe : nullptr, o.wpe >= 0 ? rows.positions : nullptr);
}

void embedding_forward(const ModelConfig& c, const void* params, const token_t* tokens, std::int64_t batch,
                       std::int64_t seq, float* x_out, const ComputeCtx& ctx) {
  embedding_forward(c, params, tokens, BatchRows{batch, seq}, x_out, ctx);
}

void embedding_backward(const ModelConfig& c, const token_t* tokens, std::int64_t batch, std::int64_t seq,
                        const float* dx, float* grads, const ComputeCtx& ctx) {
  embedding_backward(c, tokens, BatchRows{batch, seq}, dx, grads, ctx);
}

void embedding_forward(const ModelConfig& c, const void* params, const token_t* tokens, const BatchRows& rows,
                       float* x_out, const ComputeCtx& ctx) {
  validate_batch_shape(c, rows.batch, rows.seq);
  validate_tokens(c, tokens, static_cast<std::size_t>(rows.batch * rows.seq));
  validate_positions(rows);
  cpu::CpuOps ops(ctx.precision, ctx.threads);
  embedding_forward(ops, c, params, tokens, rows, x_out);
}

void embedding_backward(const ModelConfig& c, const token_t* tokens, const BatchRows& rows, const float* dx,
                        float* grads, const ComputeCtx& ctx) {
  validate_batch_shape(c, rows.batch, rows.seq);
  validate_tokens(c, tokens, static_cast<std::size_t>(rows.batch * rows.seq));
  validate_positions(rows);
  cpu::CpuOps ops(ctx.precision, ctx.threads);
  embedding_backward(ops, c, tokens, rows, dx, grads);
}

}  // namespace mt
