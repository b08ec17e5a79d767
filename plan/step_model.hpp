// The time side of `megatrain plan`: a model of the actor pipeline that predicts a step's time and
// splits it into compute, link, optimizer and NVMe. It walks the engine's own Schedule (the same ops in
// the same order: interleaved or sequential micro-batches, recomputation in each layer backward) with
// the engine's resources: K weight slots filled in op order by the host-to-device link up to the
// prefetch depth ahead (a slot still holding the stage's version is reused without a copy), gradient
// staging slots drained by the device-to-host link and the collector's accumulation, the optimizer
// updating stages in its order (forward order after the step with clipping, so the next step's forward
// of layer i waits only for the update of layer i; without clipping as each stage's gradients
// complete), and with train.offload_dir the NVMe tier reading moments ahead and writing behind. Each
// resource serves its work in program order; a task starts when its resource is free and its inputs
// are there. On shared cores (the CPU backend) the collector's, the optimizer's and the tier's CPU work
// (its checksums and system calls) pause compute while they run, and compute fills the time around
// them. No CAF here.
#pragma once
#include <cstdint>
#include <string>

#include "plan/engine_plan.hpp"
#include "plan/hardware.hpp"
#include "plan/resource_plan.hpp"

namespace mt::plan {

// Seconds of one micro-batch's op of each kind on the device.
struct OpTimes {
  double embed_forward = 0, layer_forward = 0, head = 0, layer_backward = 0, embed_backward = 0;
  double layer_backward_kept = 0;  // recompute mode: a kept layer's backward (EnginePlan::kept_layers)
  // Of layer_forward and layer_backward: attention's own products (from FLOPs only; 0 when measured).
  double attention_forward = 0, attention_backward = 0;
  std::string source;
};

// Block products of the flash-style attention kernels, each over the causal pairs (a query row and the
// keys at or before it): the forward's two (Q K^T, P V), and the backward's, which recompute the
// probabilities from the saved log-sum-exp: on CUDA (kernels/cuda/attention.cu) the dq kernel's
// Q K^T, dO V^T, dS K and the dk/dv kernel's Q K^T, dO V^T, P^T dO, dS^T Q (7: both kernels recompute
// the probabilities, no atomics); on the CPU (kernels/cpu/attention.cpp) Q K^T, dO V^T, P^T dO, dS K,
// dS^T Q (5). Follow those kernels when they change.
inline constexpr double kAttentionForwardProducts = 2.0;
inline constexpr double kCudaAttentionBackwardProducts = 7.0;
inline constexpr double kCpuAttentionBackwardProducts = 5.0;

// FLOPs of one layer op of one micro-batch (batch x seq tokens), as the kernels do them.
struct LayerFlops {
  double gemm_forward = 0;        // the projections and the MLP: 2 x matmul parameters x tokens
  double attention_forward = 0;   // kAttentionForwardProducts x 2 x head_dim x causal pairs x query heads
  double attention_backward = 0;  // the backward kernel's products, the same way
  double forward() const { return gemm_forward + attention_forward; }
  // A layer's backward: the GEMMs' two products per forward one, attention's backward kernel, and with
  // recomputation one forward more. Sequence tiles change none of it: the tiled backward recomputes the
  // forward once too (pass 1 the keys and values of every tile, pass 2 each tile's queries, attention,
  // output projection and MLP; less the attention forward when its output is kept:
  // AttentionOutputs::kept_mapped), and causal attention over tiles meets the same pairs.
  double backward(bool recompute, AttentionOutputs attention = AttentionOutputs::recomputed) const {
    const bool kept = attention == AttentionOutputs::kept_mapped;
    return 2.0 * gemm_forward + attention_backward + (recompute ? (kept ? gemm_forward : forward()) : 0.0);
  }
};
// causal pairs per sequence: T (T + 1) / 2 (within a sliding window fewer, averaged over the layers).
// document_pairs > 0 (data.packing = documents: data::document_pairs_per_window of the training shards):
// a sequence's pairs within its documents; a sliding-window layer counts the fewer of the two (an upper
// bound of the pairs both masks keep).
LayerFlops layer_flops(const ModelConfig& model, std::int64_t batch, std::int64_t seq,
                       double attention_backward_products = kCudaAttentionBackwardProducts,
                       double document_pairs = 0.0);

// From FLOPs (layer_flops with the CUDA kernel's products: datasheet profiles are GPUs; with data.packing =
// documents the pairs of the training shards' documents, or the stream's when their `.docs` cannot be read) at the
// profile's rate x achievable_fraction: a layer's forward and backward (recomputing the forward in recompute mode, less
// its attention with AttentionOutputs::kept_mapped), the head 6 x vocab x hidden per token. Attention runs at the same
// rate: an assumption (this engine's CUDA attention kernel does fp32 dot products on CUDA cores, not tensor cores; its
// rate on a GPU is not measured yet), which weighs most at long context, where attention is most of a layer's FLOPs.
OpTimes op_times_from_flops(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan,
                            const HardwareProfile& hw);
// This machine (the CPU backend): the engine's own stage kernels timed once at the plan's shapes and
// thread count (a layer's forward and backward in the plan's activation mode, the head, the embedding).
// Sequences longer than `max_measured_tokens` (long context: minutes an op) are timed at half that
// length and at that length instead, and each layer op's time fitted as a T + b P(T) (P: the causal
// pairs of a full-attention layer, T (T + 1) / 2; everything but attention is per token) and evaluated
// at the plan's length; the head and the embedding scale with T.
inline constexpr std::int64_t kMaxMeasuredTokens = 8192;
OpTimes measure_op_times(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan,
                         std::int64_t max_measured_tokens = kMaxMeasuredTokens);
// The fit above: times t1 at T1 and t2 at T2 tokens to the time at T (a, b clamped at 0: noise).
double extrapolate_layer_time(double t1, std::int64_t T1, double t2, std::int64_t T2, std::int64_t T);

struct StepPrediction {
  double step_s = 0.0;    // mean step time over steps 2..steps (what the engine's StepRecord.step_s averages)
  double steady_s = 0.0;  // the last step's time
  // Busy seconds per step of each resource.
  double compute_s = 0, h2d_s = 0, d2h_s = 0, accumulate_s = 0, optimizer_s = 0, nvme_s = 0;
  double codec_s = 0;     // of optimizer_s: the moment codec's encoding and decoding
  double tier_cpu_s = 0;  // CPU seconds of the NVMe tier's transfers (checksums, system calls), within nvme_s
  // Where compute waited, seconds per step: for the link, for a stage's update (the optimizer gating
  // the next step's load), for a gradient staging slot; and how long the optimizer waited for NVMe reads.
  double wait_link_s = 0, wait_optimizer_s = 0, wait_grad_slot_s = 0, wait_nvme_s = 0;
  double tokens = 0, model_flops = 0;
  bool shared_cores = false;  // the profile's: the host's work (optimizer, collector, tier) pauses compute
  double tflops() const { return step_s > 0 ? model_flops / step_s / 1e12 : 0.0; }
};

// Model FLOPs of one step as the benchmarks count them: 6 x matmul parameters x tokens + causal
// attention's computed half (6 x layers x heads x head_dim x seq per token). With experts the matmul
// parameters are the active ones (active_param_count: a token's top-k experts).
double model_flops_per_step(const ModelConfig& model, double tokens, double seq);

// Simulates `steps` steps (>= 2) of the plan on `hw` with op times `ops`.
StepPrediction predict_step(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan,
                            const HardwareProfile& hw, const OpTimes& ops, const PlanExtras& extras = {},
                            int steps = 5);

std::string describe_step(const StepPrediction& p, const OpTimes& ops);

// Whether a micro-batch's compute hides the streaming of its layers: every micro-batch streams each
// layer in (for its forward and again for its backward), and the forward, with a third of the backward's
// FLOPs, is the op the link binds first. A mixture of experts streams all its experts and computes with
// k of them, so it needs many more tokens than a dense layer of the same size.
struct TransferCover {
  double layer_bytes = 0;          // one decoder layer's streamed weights (the compute copy)
  double layer_link_s = 0;         // their transfer at the profile's link rate in
  double forward_s_per_token = 0;  // the layer forward's compute per token (the op times')
  double tokens_needed = 0;        // tokens per micro-batch at which the forward's compute equals the transfer
  double tokens_now = 0;           // this plan's (batch x seq)
};
TransferCover transfer_cover(const TrainConfig& cfg, const ModelConfig& model, const EnginePlan& plan,
                             const HardwareProfile& hw, const OpTimes& ops);
std::string describe_transfer_cover(const TransferCover& t, const ModelConfig& model);

}  // namespace mt::plan
