// Runtime validation of shapes and token ids: clear errors naming the problem, before any compute.
#include <stdexcept>
#include <string>

#include "kernels/stage_api.hpp"

namespace mt {

void validate_batch_shape(const ModelConfig& c, std::int64_t batch, std::int64_t seq) {
  if (batch <= 0) throw std::invalid_argument("batch size must be > 0, got " + std::to_string(batch));
  if (seq <= 0) throw std::invalid_argument("sequence length must be > 0, got " + std::to_string(seq));
  if (seq > c.max_position_embeddings && !c.positions_extend_past_max())
    throw std::invalid_argument("sequence length " + std::to_string(seq) + " exceeds max_position_embeddings " +
                                std::to_string(c.max_position_embeddings) +
                                (c.is_gpt2() ? " (the position embedding table)" : " (the rotary table)"));
}

void validate_tokens(const ModelConfig& c, const token_t* tokens, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      throw std::invalid_argument("token id " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                                  " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
}

void validate_targets(const ModelConfig& c, const token_t* targets, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (targets[i] != kIgnoreIndex && (targets[i] < 0 || targets[i] >= c.vocab_size))
      throw std::invalid_argument("target id " + std::to_string(targets[i]) + " at position " + std::to_string(i) +
                                  " is neither -100 (ignored) nor inside the vocabulary [0, " +
                                  std::to_string(c.vocab_size) + ")");
}

void validate_positions(const BatchRows& rows) {
  const std::int32_t* positions = rows.positions;
  const std::int64_t batch = rows.batch, seq = rows.seq;
  if (positions == nullptr) return;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < seq; ++t) {
      const std::int32_t p = positions[b * seq + t];
      const bool ok = p == 0 || (t > 0 && p == positions[b * seq + t - 1] + 1);
      if (!ok)
        throw std::invalid_argument("document position " + std::to_string(p) + " at row " + std::to_string(b) +
                                    ", token " + std::to_string(t) +
                                    " is neither 0 (a document starts) nor the previous token's plus 1");
    }
}

}  // namespace mt
