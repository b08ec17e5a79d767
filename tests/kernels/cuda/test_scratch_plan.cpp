// The CUDA ops' scratch plan (kernels/cuda/scratch_plan.hpp) against what the ops take: every stage of
// several model families (dense, biases, q/k norms, mixtures of experts, gpt-oss, GPT-2), fp32 and bf16,
// whole sequences and sequence tiles, run over the CPU ops through recording ops that note, per call,
// what CudaOps would ask its scratch for (the same functions); the plan must cover every take. Also the
// plan's size where the old fixed reserve fell short.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/cpu_ops.hpp"
#include "kernels/cuda/scratch_plan.hpp"
#include "kernels/stage_api.hpp"
#include "kernels/stages.hpp"
#include "tests/kernels/kernel_test_util.hpp"
#include "tests/kernels/model_configs.hpp"

using namespace mt;
using std::vector;

namespace {

// The CPU ops, with every scratch take CudaOps would make recorded (the grouped products stay Ops'
// default over linear_*, as on CUDA).
class RecordingOps final : public Ops {
 public:
  explicit RecordingOps(Precision p) : cpu_(p, 2) {}
  const char* backend() const override { return "recording"; }
  Precision precision() const override { return cpu_.precision(); }
  cuda::ScratchPlan taken;

  void use_operand_room(float* base, const OperandRoom& room) override { cpu_.use_operand_room(base, room); }
  void linear_forward(const float* x, const void* W, const void* b, float* y, std::int64_t N, std::int64_t in,
                      std::int64_t out) override {
    if (bf16()) take(cuda::bf16_operand, cuda::bf16_operand_bytes(N * in));
    cpu_.linear_forward(x, W, b, y, N, in, out);
  }
  void linear_backward(const float* dy, const float* x, const void* W, float* dx, bool add, float* dW_acc,
                       float* db_acc, std::int64_t N, std::int64_t in, std::int64_t out) override {
    if (bf16()) {
      take(cuda::bf16_gradient, cuda::bf16_operand_bytes(N * out));
      take(cuda::bf16_operand, cuda::bf16_operand_bytes(N * in));
    }
    if (db_acc) take(cuda::colsum_partial, cuda::colsum_bytes(N, out));
    cpu_.linear_backward(dy, x, W, dx, add, dW_acc, db_acc, N, in, out);
  }
  void round_bf16(const float* x, bf16_t* y, std::size_t n) override { cpu_.round_bf16(x, y, n); }
  void rmsnorm_forward(const float* x, const void* w, float* y, float* rstd, std::int64_t N, std::int64_t D,
                       float eps) override {
    cpu_.rmsnorm_forward(x, w, y, rstd, N, D, eps);
  }
  void rmsnorm_backward(const float* x, const void* w, const float* rstd, const float* dy, float* dx, float* dw_acc,
                        std::int64_t N, std::int64_t D, bool add) override {
    if (dw_acc) take(cuda::colsum_partial, cuda::colsum_bytes(N, D));
    cpu_.rmsnorm_backward(x, w, rstd, dy, dx, dw_acc, N, D, add);
  }
  void layernorm_forward(const float* x, const void* w, const void* b, float* y, float* mean, float* rstd,
                         std::int64_t N, std::int64_t D, float eps) override {
    cpu_.layernorm_forward(x, w, b, y, mean, rstd, N, D, eps);
  }
  void layernorm_backward(const float* x, const void* w, const float* mean, const float* rstd, const float* dy,
                          float* dx, float* dw_acc, float* db_acc, std::int64_t N, std::int64_t D, bool add) override {
    take(cuda::colsum_partial, cuda::colsum_bytes(N, D));
    cpu_.layernorm_backward(x, w, mean, rstd, dy, dx, dw_acc, db_acc, N, D, add);
  }
  RopeTables rope_tables(const RopeParams& p, std::int64_t seq, std::int64_t head_dim, float* cos_room,
                         float* sin_room) override {
    return cpu_.rope_tables(p, seq, head_dim, cos_room, sin_room);
  }
  void rope_apply(float* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                  std::int64_t row_stride, const RopeTables& t, bool inverse) override {
    cpu_.rope_apply(x, rows, seq, heads, head_dim, row_stride, t, inverse);
  }
  void attention_forward(const float* q, const float* k, const float* v, const void* sinks, float* out, float* lse,
                         const AttnShape& s) override {
    cpu_.attention_forward(q, k, v, sinks, out, lse, s);
  }
  void attention_backward(const float* q, const float* k, const float* v, const void* sinks, const float* out,
                          const float* lse, const float* dout, float* dq, float* dk, float* dv, float* dsinks_acc,
                          const AttnShape& s) override {
    take(cuda::attention_rowdot, cuda::rowdot_bytes(s));
    cpu_.attention_backward(q, k, v, sinks, out, lse, dout, dq, dk, dv, dsinks_acc, s);
  }
  void swiglu_forward(const float* g, const float* u, float* h, std::size_t n) override {
    cpu_.swiglu_forward(g, u, h, n);
  }
  void swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, std::size_t n) override {
    cpu_.swiglu_backward(g, u, dh, dg, du, n);
  }
  void clamped_swiglu_forward(const float* g, const float* u, float* h, std::size_t n, float alpha,
                              float limit) override {
    cpu_.clamped_swiglu_forward(g, u, h, n, alpha, limit);
  }
  void clamped_swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, std::size_t n,
                               float alpha, float limit) override {
    cpu_.clamped_swiglu_backward(g, u, dh, dg, du, n, alpha, limit);
  }
  void gelu_forward(const float* x, float* y, std::size_t n) override { cpu_.gelu_forward(x, y, n); }
  void gelu_backward(const float* x, const float* dy, float* dx, std::size_t n) override {
    cpu_.gelu_backward(x, dy, dx, n);
  }
  void add_into(float* y, const float* x, std::size_t n) override { cpu_.add_into(y, x, n); }
  void copy(float* dst, const float* src, std::size_t n) override { cpu_.copy(dst, src, n); }
  void fill_zero(float* dst, std::size_t n) override { cpu_.fill_zero(dst, n); }
  void embedding_forward(const void* wte, const void* wpe, const token_t* tokens, std::int64_t N, std::int64_t seq,
                         std::int64_t d, float* x_out, const std::int32_t* positions) override {
    cpu_.embedding_forward(wte, wpe, tokens, N, seq, d, x_out, positions);
  }
  void embedding_backward(const token_t* tokens, const float* dx, std::int64_t N, std::int64_t seq, std::int64_t d,
                          float* dwte_acc, float* dwpe_acc, const std::int32_t* positions) override {
    cpu_.embedding_backward(tokens, dx, N, seq, d, dwte_acc, dwpe_acc, positions);
  }
  void cross_entropy_rows(float* logits, const token_t* targets, float* row_loss, std::int64_t rows, std::int64_t V,
                          bool want_grad) override {
    cpu_.cross_entropy_rows(logits, targets, row_loss, rows, V, want_grad);
  }
  LossSum loss_sum(const float* row_loss, const token_t* targets, std::int64_t N) override {
    return cpu_.loss_sum(row_loss, targets, N);
  }
  void moe_route(const float* logits, const RouteShape& s, std::int32_t* expert, float* weight) override {
    cpu_.moe_route(logits, s, expert, weight);
  }
  void moe_route_backward(const float* logits, const std::int32_t* expert, const float* weight, const float* dweight,
                          float* dlogits, const RouteShape& s) override {
    cpu_.moe_route_backward(logits, expert, weight, dweight, dlogits, s);
  }
  void moe_dispatch(const std::int32_t* expert, const RouteShape& s, std::int32_t* order, std::int32_t* slot_pos,
                    std::int64_t* offsets_host) override {
    take(cuda::moe_offsets, cuda::dispatch_scratch_bytes(s.choices(), s.experts));
    cpu_.moe_dispatch(expert, s, order, slot_pos, offsets_host);
  }
  void moe_gather(const float* x, const std::int32_t* order, const RouteShape& s, std::int64_t d, float* xe) override {
    cpu_.moe_gather(x, order, s, d, xe);
  }
  void moe_gather_backward(const float* dxe, const std::int32_t* slot_pos, const RouteShape& s, std::int64_t d,
                           float* dx, bool add) override {
    cpu_.moe_gather_backward(dxe, slot_pos, s, d, dx, add);
  }
  void moe_combine(const float* ye, const std::int32_t* slot_pos, const float* weight, const RouteShape& s,
                   std::int64_t d, float* y) override {
    cpu_.moe_combine(ye, slot_pos, weight, s, d, y);
  }
  void moe_combine_backward(const float* dy, const float* ye, const std::int32_t* slot_pos, const float* weight,
                            const RouteShape& s, std::int64_t d, float* dye, float* dweight) override {
    cpu_.moe_combine_backward(dy, ye, slot_pos, weight, s, d, dye, dweight);
  }
  void moe_balance_stats(const float* logits, const std::int32_t* expert, const float* weight, const RouteShape& s,
                         float* prob_sums_host) override {
    take(cuda::moe_balance, cuda::balance_bytes(s));
    cpu_.moe_balance_stats(logits, expert, weight, s, prob_sums_host);
  }
  void moe_balance_backward(const float* logits, const std::int32_t* expert, const float* weight, const float* grad,
                            const RouteShape& s, float* dlogits, float* dweight) override {
    cpu_.moe_balance_backward(logits, expert, weight, grad, s, dlogits, dweight);
  }

 private:
  bool bf16() const { return cpu_.precision() == Precision::bf16; }
  void take(cuda::ScratchSlot s, std::size_t bytes) { taken.cover(s, bytes); }
  cpu::CpuOps cpu_;
};

vector<float> stage_params(const ParamLayout& l, unsigned seed, Precision p, vector<bf16_t>& b16) {
  const auto d = test::random_stage_params(l, seed);
  vector<float> f(d.begin(), d.end());
  if (p == Precision::bf16) {
    b16.resize(f.size());
    cpu::to_bf16(f.data(), b16.data(), f.size(), 1);
  }
  return f;
}

// Every layer's forward and backward (with the load-balancing statistics), then the head.
cuda::ScratchPlan run_stages(const ModelConfig& c, std::int64_t B, std::int64_t T, std::int64_t tile, Precision p) {
  RecordingOps ops(p);
  const std::int64_t N = B * T, d = c.hidden_size;
  vector<float> x = test::randn<float>(N * d, 5), y(N * d), dx(N * d), dy = test::randn<float>(N * d, 6);
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const ModelConfig li = c.layer_config(i);
    vector<bf16_t> w16;
    const vector<float> w = stage_params(layer_layout(c, i), 11 + static_cast<unsigned>(i), p, w16);
    const void* weights = p == Precision::bf16 ? static_cast<const void*>(w16.data()) : w.data();
    vector<float> ws(layer_workspace_floats(li, B, T, ActivationMode::recompute, p, tile)), g(w.size());
    vector<std::int64_t> counts(static_cast<std::size_t>(li.num_experts + 1));
    vector<float> prob(static_cast<std::size_t>(li.num_experts + 1)), grad(prob.size(), 0.01f);
    MoeBalance balance{counts.data(), prob.data(), grad.data()};
    LayerBuffers bufs;
    bufs.x_in = x.data();
    bufs.x_out = y.data();
    bufs.dy = dy.data();
    bufs.dx = dx.data();
    bufs.grads = g.data();
    bufs.workspace = ws.data();
    bufs.balance = li.is_moe() ? &balance : nullptr;
    layer_forward(ops, li, weights, {B, T}, bufs, tile);
    layer_backward(ops, li, weights, {B, T}, bufs, tile);
  }
  vector<bf16_t> h16, e16;
  const vector<float> hw = stage_params(head_layout(c), 3, p, h16);
  const vector<float> ew = stage_params(embedding_layout(c), 4, p, e16);
  const auto pick = [&](const vector<float>& f, const vector<bf16_t>& b) {
    return p == Precision::bf16 ? static_cast<const void*>(b.data()) : static_cast<const void*>(f.data());
  };
  vector<token_t> targets(static_cast<std::size_t>(N));
  for (std::int64_t r = 0; r < N; ++r) targets[r] = static_cast<token_t>((r * 7) % c.vocab_size);
  vector<float> hg(hw.size()), eg(ew.size()), ws(head_workspace_floats(c, B, T, 0, p, tile));
  HeadBuffers hb;
  hb.x_in = x.data();
  hb.targets = targets.data();
  hb.dx = dx.data();
  hb.head_grads = hg.data();
  hb.embed_grads = c.tie_word_embeddings ? eg.data() : nullptr;
  hb.workspace = ws.data();
  head_forward_backward(ops, c, pick(hw, h16), c.tie_word_embeddings ? pick(ew, e16) : nullptr, {B, T}, hb, 0, tile);
  return ops.taken;
}

}  // namespace

TEST_CASE("the CUDA ops' scratch plan covers what every stage's ops take", "[cuda][plan][scratch]") {
  const std::int64_t B = 2, T = 24;
  auto configs = test::all_configs();
  configs.push_back({"qwen3-moe-mixed", test::tiny_qwen3_moe_mixed()});  // dense layers among expert ones
  configs.push_back({"gpt-oss-alternating", test::tiny_gpt_oss_alternating()});
  for (const auto& [name, c] : configs)
    for (const Precision p : {Precision::fp32, Precision::bf16})
      for (const std::int64_t tile : {std::int64_t{0}, std::int64_t{8}}) {
        if (tile > 0 && c.is_gpt2()) continue;  // GPT-2 layers have no tiled form
        const cuda::ScratchPlan taken = run_stages(c, B, T, tile, p);
        const cuda::ScratchPlan plan = cuda::cuda_scratch_plan(c, B, T, tile, 0, p);
        for (int s = 0; s < cuda::kSlots; ++s) {
          INFO(name << " " << precision_name(p) << " tile " << tile << ": " << cuda::scratch_slot_name(s));
          CHECK(taken.bytes[s] <= plan.bytes[s]);
          if (taken.bytes[s] == 0) CHECK(plan.bytes[s] == 0);  // nothing planned for what no op takes
        }
        INFO(name << " " << precision_name(p) << " tile " << tile);
        if (p == Precision::bf16 && !c.is_moe()) {  // dense: the bf16 operands exactly
          CHECK(plan.bytes[cuda::bf16_operand] == taken.bytes[cuda::bf16_operand]);
          CHECK(plan.bytes[cuda::bf16_gradient] == taken.bytes[cuda::bf16_gradient]);
        }
      }
}

TEST_CASE("the scratch plan of a large layer, where a fixed reserve falls short", "[cuda][plan][scratch]") {
  // A 70B-class Llama layer in bf16 at 4 x 8192 tokens untiled: the bf16 operand copies alone are
  // 32768 x 28672 x 2 bytes, beyond the former fixed 1.5 GiB.
  ModelConfig c = test::tiny_llama();
  c.hidden_size = 8192, c.intermediate_size = 28672, c.num_attention_heads = 64, c.num_key_value_heads = 8;
  c.head_dim = 128, c.vocab_size = 128256, c.num_hidden_layers = 1;
  const cuda::ScratchPlan bf16 = cuda::cuda_scratch_plan(c, 4, 8192, 0, 0, Precision::bf16);
  CHECK(bf16.bytes[cuda::bf16_operand] == std::size_t{4} * 8192 * 28672 * 2);
  CHECK(bf16.total() > (std::size_t{1536} << 20));
  const cuda::ScratchPlan fp32 = cuda::cuda_scratch_plan(c, 4, 8192, 0, 0, Precision::fp32);
  CHECK(fp32.bytes[cuda::bf16_operand] == 0);
  CHECK(fp32.bytes[cuda::attention_rowdot] == std::size_t{4} * 64 * 8192 * 4);
  CHECK(fp32.bytes[cuda::colsum_partial] <= std::size_t{128} * 2 * 28672 * 4);
}
