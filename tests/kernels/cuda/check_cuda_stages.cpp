// Every stage operation of the CUDA backend against the CPU backend (the oracle), through the Backend
// interface both implement, for every model family and feature (tests/kernels/model_configs.hpp plus
// shapes that take the fast attention paths), in fp32 and bf16, keep and recompute modes, the chunked
// head with ignored targets; then the CUDA backend against itself (bit-equal reruns) and its link.
// Needs a GPU; exit 77 without.
// Tolerances (norm-wise, relative to the CPU backend):
//   fp32: 1e-5 forward, 1e-4 backward (products and attention summed in another order, compounded
//         through a layer's dozen operations);
//   bf16: 1e-2 (both backends round the same fp32 activations to bf16, but activations differing in the
//         last fp32 bit can round to neighbouring bf16 values: 2^-8 relative on those elements);
//   embedding gather and scatter: bit-equal (one add per element in the CPU's order).
#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

#include "device/backend.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/param_layout.hpp"
#include "kernels/stage_api.hpp"
#include "tests/kernels/cuda/cuda_check_util.hpp"
#include "tests/kernels/model_configs.hpp"

using namespace mt;
using namespace mt::cuda::check;
using mt::test::randn;

namespace {

ModelConfig fast_llama() {  // head_dim 64: the d64 attention path; GQA 4:2; T not a multiple of the tiles
  ModelConfig c = test::tiny_llama();
  c.vocab_size = 300;
  c.hidden_size = 256;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 384;
  c.max_position_embeddings = 128;
  return c;
}

ModelConfig fast_gpt2() {  // head_dim 64 on GPT-2's fused q/k/v rows
  ModelConfig c = test::tiny_gpt2();
  c.vocab_size = 301;
  c.hidden_size = 128;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 512;
  c.max_position_embeddings = 128;
  return c;
}

// A stage's weights as the backend reads them: fp32 masters, or their bf16 compute copy.
std::vector<char> weights_of(const std::vector<float>& masters, Precision p) {
  std::vector<char> out(masters.size() * bytes_per_param(p));
  if (p == Precision::fp32)
    std::memcpy(out.data(), masters.data(), out.size());
  else
    cpu::to_bf16(masters.data(), reinterpret_cast<bf16_t*>(out.data()), masters.size(), 1);
  return out;
}

struct Pair {
  std::unique_ptr<Backend> cpu, gpu;
};

Pair backends(Precision p, std::int64_t head_chunk) {
  BackendOptions o;
  o.precision = p;
  o.head_chunk = head_chunk;
  o.kind = "cpu";
  Pair r;
  r.cpu = make_backend(o);
  o.kind = "cuda";
  r.gpu = make_backend(o);
  return r;
}

void check_model(Verdicts& v, const char* name, const ModelConfig& c, Precision p) {
  const std::int64_t B = 2, T = std::min<std::int64_t>(c.max_position_embeddings, 37), N = B * T, d = c.hidden_size;
  const std::int64_t chunk = 29;  // the head in several chunks, the last one partial
  Pair be = backends(p, chunk);
  const bool bf = p == Precision::bf16;
  const double tf = bf ? 1e-2 : 1e-5, tb = bf ? 1e-2 : 1e-4;
  const std::string tag = std::string(name) + " " + precision_name(p) + ": ";
  std::printf("-- %s (%s)\n", tag.c_str(), be.gpu->describe().c_str());

  std::vector<std::vector<float>> masters;
  for (std::int64_t s = 0; s < num_stages(c); ++s) {
    masters.emplace_back(stage_layout(c, s).total_floats);
    init_stage_params(c, s, 7, masters.back().data());
  }
  std::vector<token_t> tok(N), tgt(N);
  for (std::int64_t i = 0; i < N; ++i) {
    tok[i] = static_cast<token_t>((i * 31 + 5) % c.vocab_size);
    tgt[i] = i % 7 == 2 ? kIgnoreIndex : static_cast<token_t>((i * 17 + 3) % c.vocab_size);
  }
  const token_t* dtok = be.gpu->upload_tokens(tok.data(), tok.size(), 0);
  const token_t* dtgt = be.gpu->upload_tokens(tgt.data(), tgt.size(), 2);

  // ---- embedding ----
  {
    const auto w = weights_of(masters[0], p);
    DevBuf<char> dw(w);
    std::vector<float> x(N * d);
    DevBuf<float> dx(N * d);
    be.cpu->embedding_forward(c, w.data(), tok.data(), B, T, x.data());
    be.gpu->embedding_forward(c, dw.ptr, dtok, B, T, dx.ptr);
    v.bit_equal(tag + "embedding forward", dx.download(), x);
    auto dy = randn(N * d, 3);
    auto g0 = randn(masters[0].size(), 4);
    std::vector<float> g = g0;
    DevBuf<float> ddy(dy), dg(g0);
    be.cpu->embedding_backward(c, tok.data(), B, T, dy.data(), g.data());
    be.gpu->embedding_backward(c, dtok, B, T, ddy.ptr, dg.ptr);
    v.bit_equal(tag + "embedding backward (scatter-add, token order)", dg.download(), g);
  }
  // ---- a decoder layer, keep and recompute ----
  {
    const auto w = weights_of(masters[1], p);
    DevBuf<char> dw(w);
    const std::size_t saved_n = layer_saved_floats(c, B, T);
    const std::size_t ws_keep = layer_workspace_floats(c, B, T, ActivationMode::keep, p);
    const std::size_t ws_rec = layer_workspace_floats(c, B, T, ActivationMode::recompute, p);
    auto x = randn(N * d, 5), dy = randn(N * d, 6), g0 = randn(masters[1].size(), 7, 0.1);
    DevBuf<float> dx_in(x), dy_d(dy);
    // keep
    std::vector<float> y(N * d), saved(saved_n), ws(ws_keep), dxr(N * d), g = g0;
    LayerBuffers hb;  // host
    hb.x_in = x.data();
    hb.x_out = y.data();
    hb.dy = dy.data();
    hb.dx = dxr.data();
    hb.grads = g.data();
    hb.saved = saved.data();
    hb.workspace = ws.data();
    be.cpu->layer_forward(c, w.data(), {B, T}, hb);
    DevBuf<float> dyo(N * d), dsaved(std::vector<float>(saved_n, 0.0f)), dws(ws_rec), ddx(N * d), dg(g0);
    LayerBuffers db;  // device
    db.x_in = dx_in.ptr;
    db.x_out = dyo.ptr;
    db.dy = dy_d.ptr;
    db.dx = ddx.ptr;
    db.grads = dg.ptr;
    db.saved = dsaved.ptr;
    db.workspace = dws.ptr;
    be.gpu->layer_forward(c, dw.ptr, {B, T}, db);
    v.close(tag + "layer forward", dyo.download(), y, tf);
    v.close(tag + "layer forward: saved activations (same layout)", dsaved.download(), saved, tf);
    be.cpu->layer_backward(c, w.data(), {B, T}, hb);
    be.gpu->layer_backward(c, dw.ptr, {B, T}, db);
    v.close(tag + "layer backward dx (keep)", ddx.download(), dxr, tb);
    const auto g_gpu = dg.download();
    v.close(tag + "layer backward grads, added into (keep)", g_gpu, g, tb);
    // recompute: same results as keep on each backend
    std::vector<float> ws2(ws_rec), dxr2(N * d), g2 = g0;
    hb.dx = dxr2.data();
    hb.grads = g2.data();
    hb.saved = nullptr;
    hb.workspace = ws2.data();
    be.cpu->layer_backward(c, w.data(), {B, T}, hb);
    dg.upload(g0);
    db.saved = nullptr;
    be.gpu->layer_backward(c, dw.ptr, {B, T}, db);
    v.close(tag + "layer backward dx (recompute)", ddx.download(), dxr2, tb);
    const auto g_gpu2 = dg.download();
    v.close(tag + "layer backward grads (recompute)", g_gpu2, g2, tb);
    // determinism: the same backward again, bit for bit
    dg.upload(g0);
    be.gpu->layer_backward(c, dw.ptr, {B, T}, db);
    v.bit_equal(tag + "layer backward grads: two CUDA runs", dg.download(), g_gpu2);
  }
  // ---- documents (data.packing = documents): positions restart at each document ----
  {
    std::vector<std::int32_t> pos;
    for (const std::int64_t n : {std::int64_t{10}, std::int64_t{1}, T - 11, T})  // row 0: 10, 1, T-11; row 1: T
      for (std::int64_t i = 0; i < n; ++i) pos.push_back(static_cast<std::int32_t>(i));
    const BatchRows rows_cpu{B, T, pos.data()}, rows_gpu{B, T, be.gpu->upload_tokens(pos.data(), pos.size(), 4)};
    const auto we = weights_of(masters[0], p);
    DevBuf<char> dwe(we);
    std::vector<float> x(N * d);
    DevBuf<float> dx(N * d);
    be.cpu->embedding_forward(c, we.data(), tok.data(), rows_cpu, x.data());
    be.gpu->embedding_forward(c, dwe.ptr, dtok, rows_gpu, dx.ptr);
    v.bit_equal(tag + "documents: embedding forward", dx.download(), x);
    auto dy = randn(N * d, 13), g0 = randn(masters[0].size(), 14);
    std::vector<float> g = g0;
    DevBuf<float> ddy(dy), dg(g0);
    be.cpu->embedding_backward(c, tok.data(), rows_cpu, dy.data(), g.data());
    be.gpu->embedding_backward(c, dtok, rows_gpu, ddy.ptr, dg.ptr);
    v.close(tag + "documents: embedding backward", dg.download(), g, 1e-6);
    const auto w = weights_of(masters[1], p);
    DevBuf<char> dw(w);
    const std::size_t ws_n = layer_workspace_floats(c, B, T, ActivationMode::recompute, p);
    auto xi = randn(N * d, 15), g1 = randn(masters[1].size(), 16, 0.1);
    std::vector<float> y(N * d), ws(ws_n), dxr(N * d), gl = g1;
    DevBuf<float> dxi(xi), dyo(N * d), dws(ws_n), ddx(N * d), dgl(g1);
    LayerBuffers hb;  // host
    hb.x_in = xi.data();
    hb.x_out = y.data();
    hb.dy = dy.data();
    hb.dx = dxr.data();
    hb.grads = gl.data();
    hb.workspace = ws.data();
    LayerBuffers db;  // device
    db.x_in = dxi.ptr;
    db.x_out = dyo.ptr;
    db.dy = ddy.ptr;
    db.dx = ddx.ptr;
    db.grads = dgl.ptr;
    db.workspace = dws.ptr;
    be.cpu->layer_forward(c, w.data(), rows_cpu, hb);
    be.gpu->layer_forward(c, dw.ptr, rows_gpu, db);
    v.close(tag + "documents: layer forward", dyo.download(), y, tf);
    be.cpu->layer_backward(c, w.data(), rows_cpu, hb);
    be.gpu->layer_backward(c, dw.ptr, rows_gpu, db);
    v.close(tag + "documents: layer backward dx", ddx.download(), dxr, tb);
    v.close(tag + "documents: layer backward grads", dgl.download(), gl, tb);
  }
  // ---- the head ----
  {
    const std::int64_t L = c.num_hidden_layers;
    const bool tied = c.is_gpt2() || c.tie_word_embeddings;
    const auto hw = weights_of(masters[L + 1], p), ew = weights_of(masters[0], p);
    DevBuf<char> dhw(hw), dew(ew);
    const std::size_t ws_n = head_workspace_floats(c, B, T, chunk, p);
    auto x = randn(N * d, 8), gh0 = randn(masters[L + 1].size(), 9, 0.1), ge0 = randn(masters[0].size(), 10, 0.1);
    std::vector<float> dx(N * d), gh = gh0, ge = ge0, ws(ws_n);
    DevBuf<float> dxin(x), ddx(N * d), dgh(gh0), dge(ge0), dws(ws_n);
    HeadBuffers hb;  // host
    hb.x_in = x.data();
    hb.targets = tgt.data();
    hb.dx = dx.data();
    hb.head_grads = gh.data();
    hb.embed_grads = tied ? ge.data() : nullptr;
    hb.workspace = ws.data();
    HeadBuffers db;  // device
    db.x_in = dxin.ptr;
    db.targets = dtgt;
    db.dx = ddx.ptr;
    db.head_grads = dgh.ptr;
    db.embed_grads = tied ? dge.ptr : nullptr;
    db.workspace = dws.ptr;
    const LossSum lc = be.cpu->head_forward_backward(c, hw.data(), tied ? ew.data() : nullptr, {B, T}, hb);
    const LossSum lg = be.gpu->head_forward_backward(c, dhw.ptr, tied ? dew.ptr : nullptr, {B, T}, db);
    v.scalar(tag + "head loss sum", lg.loss_sum, lc.loss_sum, bf ? 1e-3 : 1e-5);
    v.fact(tag + "head counted tokens " + std::to_string(lg.counted) + " vs " + std::to_string(lc.counted),
           lg.counted == lc.counted);
    v.close(tag + "head dx", ddx.download(), dx, tb);
    v.close(tag + "head grads (norm" + std::string(tied ? ")" : ", lm_head)"), dgh.download(), gh, tb);
    if (tied) v.close(tag + "head grads into the tied embedding", dge.download(), ge, tb);
    HeadBuffers loss_only;
    loss_only.x_in = dxin.ptr;
    loss_only.targets = dtgt;
    loss_only.workspace = dws.ptr;
    const LossSum lo = be.gpu->head_forward_backward(c, dhw.ptr, tied ? dew.ptr : nullptr, {B, T}, loss_only);
    v.fact(tag + "head loss only (dx == nullptr) equals the loss with gradients", lo.loss_sum == lg.loss_sum);
  }
}

void check_link(Verdicts& v) {
  BackendOptions o;
  o.kind = "cuda";
  auto be = make_backend(o);
  const std::size_t n = std::size_t{48} << 20;  // bytes
  std::byte* dev = be->allocate_device(2 * n);
  std::vector<std::uint8_t> src(n), back(n, 0);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<std::uint8_t>(i * 2654435761u >> 13);
  be->register_host(src.data(), n);
  be->register_host(back.data(), n);
  std::atomic<int> done{0};
  // Two copies up, a device-side copy (compute stream), then down: the download must see the
  // compute stream's copy (rule 2), and every callback runs once.
  be->copy_async(LinkDirection::host_to_device, src.data(), dev, n, [&] { done++; });
  be->wait_link_idle();
  be->copy_on_device(dev + n, dev, n);
  be->copy_async(LinkDirection::device_to_host, dev + n, back.data(), n, [&] { done++; });
  be->wait_link_idle();
  v.fact("link: both callbacks ran once", done.load() == 2);
  v.fact("link: host -> device -> (device copy) -> host round trip is exact", src == back);
  const LinkStats s = be->link_stats();
  v.fact("link stats: one copy and " + std::to_string(n) + " bytes each way",
         s.of(LinkDirection::host_to_device).copies == 1 && s.of(LinkDirection::device_to_host).bytes == n);
  std::printf("link: %.2f GB/s up, %.2f GB/s down (one %zu MiB copy each, pinned)\n",
              n / s.of(LinkDirection::host_to_device).busy_seconds / 1e9,
              n / s.of(LinkDirection::device_to_host).busy_seconds / 1e9, n >> 20);
  be->unregister_host(src.data(), n);
  be->unregister_host(back.data(), n);
  bool threw = false;
  try {
    be->allocate_device(std::size_t{1} << 50);  // a petabyte: the fit check must refuse it by name
  } catch (const std::runtime_error& e) {
    threw = std::string(e.what()).find("device.max_vram_gb") != std::string::npos;
    std::printf("oversized arena: %s\n", e.what());
  }
  v.fact("an arena larger than the GPU is refused, naming device.max_vram_gb", threw);
}

}  // namespace

int main() {
  require_gpu("check_cuda_stages");
  Verdicts v;
  try {
    std::vector<test::Named> models = test::all_configs();
    models.push_back({"llama-d64", fast_llama()});
    models.push_back({"gpt2-d64", fast_gpt2()});
    for (const auto& m : models)
      for (Precision p : {Precision::fp32, Precision::bf16}) check_model(v, m.name, m.cfg, p);
    check_link(v);
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    v.failed++;
  }
  return v.finish("check_cuda_stages");
}
