#include "config/train_config.hpp"

#include <algorithm>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "config/host_ram.hpp"
#include "config/keys.hpp"

namespace mt {

const char* lr_schedule_name(LrSchedule s) {
  switch (s) {
    case LrSchedule::constant:
      return "constant";
    case LrSchedule::linear:
      return "linear";
    case LrSchedule::cosine:
      return "cosine";
  }
  return "?";
}

const char* keep_intermediates_name(KeepIntermediates k) {
  switch (k) {
    case KeepIntermediates::boundary:
      return "boundary";
    case KeepIntermediates::boundary_host:
      return "boundary_host";
    case KeepIntermediates::all:
      return "all";
    case KeepIntermediates::boundary_mapped:
      return "boundary_mapped";
    case KeepIntermediates::all_mapped:
      return "all_mapped";
    case KeepIntermediates::automatic:
      return "auto";
  }
  return "?";
}

const char* gradient_buffer_name(GradientBuffer b) {
  switch (b) {
    case GradientBuffer::model:
      return "model";
    case GradientBuffer::stage:
      return "stage";
    case GradientBuffer::automatic:
      return "auto";
  }
  return "?";
}

const char* master_weights_name(MasterWeights w) {
  switch (w) {
    case MasterWeights::fp32:
      return "fp32";
    case MasterWeights::split:
      return "split";
    case MasterWeights::automatic:
      return "auto";
  }
  return "?";
}

const char* optimizer_compression_name(OptimizerCompression c) {
  switch (c) {
    case OptimizerCompression::none:
      return "none";
    case OptimizerCompression::lossless:
      return "lossless";
    case OptimizerCompression::int8:
      return "int8";
  }
  return "?";
}

const char* micro_batch_order_name(MicroBatchOrder o) {
  switch (o) {
    case MicroBatchOrder::interleaved:
      return "interleaved";
    case MicroBatchOrder::sequential:
      return "sequential";
    case MicroBatchOrder::layer_major:
      return "layer_major";
  }
  return "?";
}

namespace {

// Finds `value` (the key's member of `config`) among the names of Enum's values; ConfigError naming
// the key and listing the choices otherwise.
template <class Enum, std::size_t N>
Enum parse_choice(const TrainConfig& config, const std::string& value, const Enum (&choices)[N],
                  const char* (*name)(Enum)) {
  std::string list;
  for (Enum e : choices) {
    if (value == name(e)) return e;
    list += (list.empty() ? "" : ", ") + std::string(name(e));
  }
  throw ConfigError(key_of(config, value), "'" + value + "' is not one of: " + list);
}

}  // namespace

LrSchedule TrainConfig::lr_schedule() const {
  return parse_choice(*this, train.lr_scheduler_type, kLrSchedules, lr_schedule_name);
}

double TrainConfig::host_ram_bytes() const {
  if (plan.host_ram_gb > 0) return plan.host_ram_gb * 1073741824.0;
  return plan.host_ram_read_bytes > 0 ? plan.host_ram_read_bytes : mem_available_bytes();
}

void TrainConfig::pin_host_ram() {
  if (plan.host_ram_gb <= 0 && plan.host_ram_read_bytes <= 0) plan.host_ram_read_bytes = mem_available_bytes();
}

KeepIntermediates TrainConfig::keep_intermediates() const {
  return parse_choice(*this, device.keep_intermediates, kKeepIntermediates, keep_intermediates_name);
}

OptimizerCompression TrainConfig::optimizer_compression() const {
  return parse_choice(*this, train.optimizer_compression, kOptimizerCompressions, optimizer_compression_name);
}

MasterWeights TrainConfig::master_weights() const {
  return parse_choice(*this, train.master_weights, kMasterWeights, master_weights_name);
}

bool TrainConfig::split_masters() const {
  const MasterWeights w = master_weights();
  if (w == MasterWeights::fp32) return false;
  if (w == MasterWeights::split) return true;
  return train.bf16 && train.offload_dir.empty() && !train.offload_params &&
         optimizer_compression() == OptimizerCompression::none;
}

GradientBuffer TrainConfig::gradient_buffer() const {
  return parse_choice(*this, train.gradient_buffer, kGradientBuffers, gradient_buffer_name);
}

std::string TrainConfig::rank_grad_transport() const {
#if MEGATRAIN_HAVE_NCCL
  if (device.backend == "cuda" && cluster.gpu_transport != "mpi") return "nccl";
#endif
  return "mpi";
}

std::string TrainConfig::stage_gradients_unsupported() const {
  // Several micro-batches run layer-major (a stage's gradient is complete when its backward ends);
  // several devices would sum across them into accumulators kept all step. Several ranks sum each
  // stage's rounds into its owner's stage accumulators, which needs the state sharded: unsharded, every
  // rank would keep every stage's summed gradient all step (what the accumulators already cost).
  if (device.gpus != 1) return key_of(*this, device.gpus) + " = " + std::to_string(device.gpus) + " (needs one device)";
  if (cluster.ranks > 1 && !cluster.shard_state)
    return std::to_string(cluster.ranks) + " ranks need " + key_of(*this, cluster.shard_state) +
           " = true (the owner of each stage sums its rounds; unsharded, every rank would hold every stage's sum)";
  return "";
}

bool TrainConfig::stage_gradients() const {
  const GradientBuffer b = gradient_buffer();
  if (b == GradientBuffer::model) return false;
  if (b == GradientBuffer::stage) return true;
  return train.max_grad_norm <= 0.0 && train.gradient_accumulation_steps == 1 && stage_gradients_unsupported().empty();
}

MicroBatchOrder TrainConfig::micro_batch_order() const {
  const MicroBatchOrder o = parse_choice(*this, device.schedule, kMicroBatchOrders, micro_batch_order_name);
  return stage_gradients() && train.gradient_accumulation_steps > 1 ? MicroBatchOrder::layer_major : o;
}

std::size_t TrainConfig::device_budget_bytes() const {
  return static_cast<std::size_t>(std::llround(device.max_vram_gb * 1024.0 * 1024.0 * 1024.0));
}

std::string TrainConfig::device_budget_name() const {
  // The shortest text that reads back to the same budget: MiB budgets are exact binary fractions of a
  // GiB ("0.0009765625" is 1 MiB), which the stream's 6 digits would round.
  char text[40];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, device.max_vram_gb);
    if (std::strtod(text, nullptr) == device.max_vram_gb) break;
  }
  return key_of(*this, device.max_vram_gb) + "=" + text;
}

std::int64_t TrainConfig::prefetch_depth() const {
  return device.prefetch_depth > 0 ? device.prefetch_depth : std::max<std::int64_t>(1, device.weight_slots - 1);
}

std::string TrainConfig::train_jsonl_path() const {
  return log.train_jsonl.empty() ? train.output_dir + "/train.jsonl" : log.train_jsonl;
}

std::string TrainConfig::events_jsonl_path() const {
  return log.events_jsonl.empty() ? train.output_dir + "/events.jsonl" : log.events_jsonl;
}

namespace {
// "0, 5,3" -> {0, 3, 5}: layer indices, sorted, without repeats (their range is ModelConfig's check).
std::vector<std::int64_t> parse_layer_list(const std::string& text, const std::string& key) {
  std::vector<std::int64_t> out;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    std::string item = text.substr(at, comma - at);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 0)
      throw ConfigError(key, "'" + text + "' is not a comma-separated list of layer indices (>= 0)");
    out.push_back(v);
    at = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}
}  // namespace

ModelConfig TrainConfig::model_config_from_keys() const {
  ModelConfig m;
  try {
    m.arch = parse_arch(model.arch);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(key_of(*this, model.arch), e.what());
  }
  m.vocab_size = model.vocab_size;
  m.hidden_size = model.hidden_size;
  m.num_hidden_layers = model.layers;
  m.num_attention_heads = model.heads;
  m.num_key_value_heads = model.kv_heads > 0 ? model.kv_heads : model.heads;
  m.head_dim = model.head_dim > 0 ? model.head_dim : (model.heads > 0 ? model.hidden_size / model.heads : 0);
  m.intermediate_size = model.intermediate_size;
  m.max_position_embeddings = model.max_position_embeddings;
  m.rope_theta = static_cast<float>(model.rope_theta);
  m.norm_eps = static_cast<float>(model.norm_eps);
  m.tie_word_embeddings = model.tie_word_embeddings || m.arch == Arch::gpt2;  // GPT-2's LM head is always wte
  m.initializer_range = static_cast<float>(model.initializer_range);
  if (m.arch == Arch::qwen2) m.attention_bias = true;
  if (m.arch == Arch::qwen3) m.qk_norm = true;
  if (m.arch == Arch::qwen3_moe) m.qk_norm = true;
  const bool qwen_moe = m.arch == Arch::qwen3_moe;
  if (m.arch == Arch::mixtral || qwen_moe || m.arch == Arch::gpt_oss) {
    m.num_experts = model.num_experts > 0 ? model.num_experts : 8;
    m.num_experts_per_tok = model.num_experts_per_tok;
    m.moe_intermediate_size = model.moe_intermediate_size > 0 ? model.moe_intermediate_size : model.intermediate_size;
    m.norm_topk_prob = qwen_moe ? model.norm_topk_prob : m.arch == Arch::mixtral;
  } else if (model.num_experts > 0) {
    throw ConfigError(key_of(*this, model.num_experts), "experts need " + key_of(*this, model.arch) +
                                                            "=mixtral, qwen3_moe or gpt_oss (got " + model.arch + ")");
  }
  if (model.output_router_logits && !m.is_moe())
    throw ConfigError(key_of(*this, model.output_router_logits),
                      "the load-balancing loss needs experts (" + key_of(*this, model.num_experts) + ")");
  if (model.router_aux_loss_coef != 0.0 && !m.is_moe())
    throw ConfigError(key_of(*this, model.router_aux_loss_coef), "is for models with experts");
  m.output_router_logits = model.output_router_logits;
  m.router_aux_loss_coef = model.router_aux_loss_coef > 0.0 ? model.router_aux_loss_coef
                           : m.arch == Arch::gpt_oss        ? 0.9
                                                            : 0.001;
  if (!m.is_moe()) m.router_aux_loss_coef = 0.0;
  if (m.arch == Arch::gpt_oss) {  // GptOssConfig's own: biases, a 128-token window on the even layers, limit 7
    m.attention_bias = true;
    m.sliding_window = model.sliding_window > 0 ? model.sliding_window : 128;
    for (std::int64_t l = 0; l < m.num_hidden_layers; l += 2) m.sliding_layers.push_back(l);
  }
  auto qwen_moe_only = [&](bool set, const std::string& key) {
    if (set && !qwen_moe)
      throw ConfigError(key, "is Qwen3-MoE's: it needs " + key_of(*this, model.arch) + "=qwen3_moe");
  };
  qwen_moe_only(model.moe_intermediate_size > 0, key_of(*this, model.moe_intermediate_size));
  qwen_moe_only(model.norm_topk_prob, key_of(*this, model.norm_topk_prob));
  qwen_moe_only(model.decoder_sparse_step != 1, key_of(*this, model.decoder_sparse_step));
  qwen_moe_only(!model.mlp_only_layers.empty(), key_of(*this, model.mlp_only_layers));
  if (model.sliding_window != 0 && m.arch != Arch::gpt_oss) {
    if (m.arch != Arch::mistral && m.arch != Arch::mixtral)
      throw ConfigError(key_of(*this, model.sliding_window),
                        "needs " + key_of(*this, model.arch) + "=gpt_oss, mistral or mixtral (got " + model.arch + ")");
    if (model.sliding_window < model.max_position_embeddings) {  // Mistral and Mixtral: every layer
      m.sliding_window = model.sliding_window;
      for (std::int64_t l = 0; l < m.num_hidden_layers; ++l) m.sliding_layers.push_back(l);
    }
  }
  m.decoder_sparse_step = model.decoder_sparse_step;
  m.mlp_only_layers = parse_layer_list(model.mlp_only_layers, key_of(*this, model.mlp_only_layers));
  if (model.heads > 0 && model.head_dim == 0 && model.hidden_size % model.heads != 0)
    throw ConfigError(key_of(*this, model.heads),
                      std::to_string(model.heads) + " does not divide " + key_of(*this, model.hidden_size) + "=" +
                          std::to_string(model.hidden_size) + " (or set " + key_of(*this, model.head_dim) + ")");
  try {
    m.validate();
  } catch (const std::invalid_argument& e) {
    throw ConfigError("model", e.what());
  }
  return m;
}

ModelConfig TrainConfig::with_training_switches(ModelConfig m) const {
  if (model.output_router_logits) {
    if (!m.is_moe())
      throw ConfigError(key_of(*this, model.output_router_logits),
                        "the load-balancing loss needs a model with experts");
    m.output_router_logits = true;
  }
  if (model.router_aux_loss_coef > 0.0) {
    if (!m.is_moe()) throw ConfigError(key_of(*this, model.router_aux_loss_coef), "is for models with experts");
    m.router_aux_loss_coef = model.router_aux_loss_coef;
  }
  return m;
}

void TrainConfig::check_vocab(const ModelConfig& m, std::int64_t tokenizer_vocab, std::int64_t max_token_id) {
  const TrainConfig names;  // key_of finds a key by its member's address in some config
  const std::string vocab_size = key_of(names, names.model.vocab_size);
  if (tokenizer_vocab > m.vocab_size)
    throw ConfigError(vocab_size, "the model's vocabulary (" + std::to_string(m.vocab_size) +
                                      ") is smaller than the tokenizer's (" + std::to_string(tokenizer_vocab) + ", " +
                                      key_of(names, names.data.tokenizer_file) + ")");
  if (max_token_id >= m.vocab_size)
    throw ConfigError(vocab_size, "the data (" + key_of(names, names.data.train_files) + ") holds token id " +
                                      std::to_string(max_token_id) + ", outside the model's vocabulary of " +
                                      std::to_string(m.vocab_size));
}

}  // namespace mt
