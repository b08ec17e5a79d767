// The GPU benchmark (tools/bench/run gpu, run by tools/gpu-check): on the CUDA backend, measured in one run,
//   - the cuBLASLt bf16 GEMM rate (8192^3, and the Llama MLP shape): the ceiling for MFU;
//   - pinned-copy probes (cudaMemcpyAsync from cudaMallocHost memory) per direction: the link ceiling;
//   - the backend's own copies (copy_async from cudaHostRegister'ed ranges) against that probe;
//   - a training step of Llama-shaped ~1B and ~3B models (bf16 compute, keep mode, 4 x 2048 tokens) with
//     every weight resident on the device, and streamed: two weight slots and two gradient slots filled and
//     drained over the link while compute runs (the engine's schedule, driven here through the Backend
//     interface without the actors or the optimizer), giving achieved TFLOPS, MFU, the overlap ratio
//     (step / max(compute, transfer)) and streamed over resident.
// Arguments: [--models 1b,3b] [--steps N] [--tokens B,T]. Readable lines first, then the JSON lines.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "device/backend.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/param_layout.hpp"
#include "kernels/stage_api.hpp"
#include "tools/bench/bench_report.hpp"

using namespace mt;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---------------- ceilings ----------------
double gemm_tflops(bool bf16, bool tf32, std::int64_t m, std::int64_t n, std::int64_t k) {
  cuda::Gemm gemm(tf32);
  const std::size_t el = bf16 ? 2 : 4;
  void *A = nullptr, *B = nullptr;
  float* C = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&A, m * k * el));
  MT_CUDA_CHECK(cudaMalloc(&B, k * n * el));
  MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&C), m * n * 4));
  MT_CUDA_CHECK(cudaMemset(A, 0x3c, m * k * el));  // small finite values either way
  MT_CUDA_CHECK(cudaMemset(B, 0x3c, k * n * el));
  cudaStream_t st;
  MT_CUDA_CHECK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  MT_CUDA_CHECK(cudaEventCreate(&e0));
  MT_CUDA_CHECK(cudaEventCreate(&e1));
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    MT_CUDA_CHECK(cudaEventRecord(e0, st));
    for (int i = 0; i < 5; ++i) gemm.matmul(true, false, m, n, k, A, k, B, k, 0.0f, C, m, bf16, st);
    MT_CUDA_CHECK(cudaEventRecord(e1, st));
    MT_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep > 0) best = std::min(best, ms * 1e-3 / 5);
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaStreamDestroy(st), cudaFree(A), cudaFree(B), cudaFree(C);
  return 2.0 * m * n * k / best / 1e12;
}

struct LinkRates {
  double h2d = 0, d2h = 0;  // GB/s
};

LinkRates pinned_probe(std::size_t bytes) {
  void *host = nullptr, *dev = nullptr;
  MT_CUDA_CHECK(cudaMallocHost(&host, bytes));
  MT_CUDA_CHECK(cudaMalloc(&dev, bytes));
  std::memset(host, 1, bytes);
  cudaStream_t st;
  MT_CUDA_CHECK(cudaStreamCreate(&st));
  LinkRates r;
  for (int dir = 0; dir < 2; ++dir) {
    double best = 1e30;
    for (int rep = 0; rep < 4; ++rep) {
      const auto t0 = Clock::now();
      if (dir == 0)
        MT_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, st));
      else
        MT_CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, st));
      MT_CUDA_CHECK(cudaStreamSynchronize(st));
      if (rep > 0) best = std::min(best, since(t0));
    }
    (dir == 0 ? r.h2d : r.d2h) = bytes / best / 1e9;
  }
  cudaStreamDestroy(st), cudaFreeHost(host), cudaFree(dev);
  return r;
}

// A completion the host can wait on (what the actors' messages are in the engine).
struct Flag {
  std::mutex mu;
  std::condition_variable cv;
  bool set = true;
  void arm() {
    std::lock_guard<std::mutex> l(mu);
    set = false;
  }
  void fire() {
    {
      std::lock_guard<std::mutex> l(mu);
      set = true;
    }
    cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return set; });
  }
};

LinkRates backend_copies(Backend& be, std::byte* dev, std::size_t chunk, int count) {
  std::vector<std::byte> host(chunk);
  std::memset(host.data(), 1, chunk);
  be.register_host(host.data(), chunk);
  LinkRates r;
  for (int dir = 0; dir < 2; ++dir) {
    const auto t0 = Clock::now();
    for (int i = 0; i < count; ++i) {
      if (dir == 0)
        be.copy_async(LinkDirection::host_to_device, host.data(), dev + (i % 2) * chunk, chunk, {});
      else
        be.copy_async(LinkDirection::device_to_host, dev + (i % 2) * chunk, host.data(), chunk, {});
    }
    be.wait_link_idle();
    (dir == 0 ? r.h2d : r.d2h) = static_cast<double>(chunk) * count / since(t0) / 1e9;
  }
  be.unregister_host(host.data(), chunk);
  return r;
}

// ---------------- the model step ----------------
ModelConfig llama_1b() {  // Llama-3.2-1B's shape, untied head
  ModelConfig c;
  c.arch = Arch::llama;
  c.vocab_size = 128256, c.hidden_size = 2048, c.num_hidden_layers = 16, c.num_attention_heads = 32;
  c.num_key_value_heads = 8, c.head_dim = 64, c.intermediate_size = 8192, c.max_position_embeddings = 8192;
  c.rope_theta = 500000.0f;
  return c;
}
ModelConfig llama_3b() {  // Llama-3.2-3B's shape, untied head
  ModelConfig c = llama_1b();
  c.hidden_size = 3072, c.num_hidden_layers = 28, c.num_attention_heads = 24, c.head_dim = 128;
  return c;
}

std::size_t up256(std::size_t b) { return (b + 255) / 256 * 256; }

struct StepResult {
  double resident_s = 0, streamed_s = 0, transfer_s = 0, h2d_bytes = 0, d2h_bytes = 0;
};

StepResult model_step(const ModelConfig& c, std::int64_t B, std::int64_t T, int steps) {
  BackendOptions o;
  o.kind = "cuda";
  o.precision = Precision::bf16;
  o.head_chunk = 2048;  // fewer, larger LM-head products (2048 x vocab logits: 1 GiB)
  auto be = make_backend(o);
  const std::int64_t L = c.num_hidden_layers, N = B * T, d = c.hidden_size;
  const std::size_t bpp = 2;
  const std::size_t e_f = stage_layout(c, 0).total_floats, l_f = stage_layout(c, 1).total_floats,
                    h_f = stage_layout(c, L + 1).total_floats;
  const std::size_t saved_f = layer_saved_floats(c, B, T);
  const std::size_t ws_f = std::max(layer_workspace_floats(c, B, T, ActivationMode::keep, o.precision),
                                    head_workspace_floats(c, B, T, o.head_chunk, o.precision));
  // One arena, carved: activations (saved per layer, boundaries, dx x 2, workspace), resident weights and
  // grads of every stage, and the streamed slots.
  std::vector<std::size_t> sizes = {
      up256(saved_f * 4 * L), up256(N * d * 4 * (L + 1)), up256(N * d * 4 * 2), up256(ws_f * 4),    up256(e_f * bpp),
      up256(l_f * bpp * L),   up256(h_f * bpp),           up256(e_f * 4),       up256(l_f * 4 * L), up256(h_f * 4),
      up256(l_f * bpp * 2),   up256(l_f * 4 * 2)};
  std::size_t total = 0;
  for (auto s : sizes) total += s;
  std::printf("  arena %.1f GiB (saved activations %.1f GiB)\n", total / 1073741824.0, sizes[0] / 1073741824.0);
  std::byte* arena = be->allocate_device(total);
  std::vector<std::byte*> part;
  for (std::size_t i = 0, off = 0; i < sizes.size(); off += sizes[i], ++i) part.push_back(arena + off);
  float* saved = reinterpret_cast<float*>(part[0]);
  float* acts = reinterpret_cast<float*>(part[1]);
  float* dxs = reinterpret_cast<float*>(part[2]);
  float* ws = reinterpret_cast<float*>(part[3]);
  std::byte *w_emb = part[4], *w_layers = part[5], *w_head = part[6];
  float *g_emb = reinterpret_cast<float*>(part[7]), *g_layers = reinterpret_cast<float*>(part[8]),
        *g_head = reinterpret_cast<float*>(part[9]);
  std::byte* w_slots = part[10];
  float* g_slots = reinterpret_cast<float*>(part[11]);

  // Host stages (bf16 compute copies, as the optimizer writes them), pinned; weights of one layer repeated.
  std::vector<std::vector<bf16_t>> host_w(3);
  const std::size_t stage_f[3] = {e_f, l_f, h_f};
  const std::int64_t stage_id[3] = {0, 1, L + 1};
  for (int s = 0; s < 3; ++s) {
    std::vector<float> m(stage_f[s]);
    init_stage_params(c, stage_id[s], 1, m.data(), static_cast<int>(std::thread::hardware_concurrency()));
    host_w[s].resize(stage_f[s]);
    cpu::to_bf16(m.data(), host_w[s].data(), m.size(), static_cast<int>(std::thread::hardware_concurrency()));
    be->register_host(host_w[s].data(), stage_f[s] * bpp);
  }
  // Host gradient buffers: one per gradient slot, one for the head and then the embedding.
  std::vector<float> host_g[3];
  for (auto& g : host_g) g.resize(std::max({e_f, l_f, h_f}));
  for (auto& g : host_g) be->register_host(g.data(), g.size() * 4);
  // Resident copies of every stage's weights.
  be->copy_async(LinkDirection::host_to_device, host_w[0].data(), w_emb, e_f * bpp, {});
  be->copy_async(LinkDirection::host_to_device, host_w[2].data(), w_head, h_f * bpp, {});
  for (std::int64_t l = 0; l < L; ++l)
    be->copy_async(LinkDirection::host_to_device, host_w[1].data(), w_layers + l * l_f * bpp, l_f * bpp, {});
  be->wait_link_idle();
  std::vector<token_t> tok(N), tgt(N);
  for (std::int64_t i = 0; i < N; ++i)
    tok[i] = static_cast<token_t>((i * 7919) % c.vocab_size),
    tgt[i] = static_cast<token_t>((i * 104729) % c.vocab_size);
  const token_t* dtok = be->upload_tokens(tok.data(), N, 0);
  const token_t* dtgt = be->upload_tokens(tgt.data(), N, 2);
  auto act = [&](std::int64_t i) { return acts + i * N * d; };
  auto sv = [&](std::int64_t l) { return saved + static_cast<std::size_t>(l) * saved_f; };
  HeadBuffers head_bufs;  // untied
  head_bufs.x_in = act(L);
  head_bufs.targets = dtgt;
  head_bufs.dx = dxs;
  head_bufs.head_grads = g_head;
  head_bufs.workspace = ws;
  // Layer l's buffers; the backward's dy and dx are the two halves of dxs, `cur` the one holding dy.
  auto layer_bufs = [&](std::int64_t l, int cur, float* grads) {
    LayerBuffers b;
    b.x_in = act(l);
    b.x_out = act(l + 1);
    b.dy = dxs + cur * N * d;
    b.dx = dxs + (cur ^ 1) * N * d;
    b.grads = grads;
    b.saved = sv(l);
    b.workspace = ws;
    return b;
  };

  auto resident_step = [&] {
    be->embedding_forward(c, w_emb, dtok, B, T, act(0));
    for (std::int64_t l = 0; l < L; ++l)
      be->layer_forward(c, w_layers + l * l_f * bpp, {B, T}, layer_bufs(l, 0, nullptr));
    be->head_forward_backward(c, w_head, nullptr, {B, T}, head_bufs);
    int cur = 0;
    for (std::int64_t l = L - 1; l >= 0; --l, cur ^= 1)
      be->layer_backward(c, w_layers + l * l_f * bpp, {B, T}, layer_bufs(l, cur, g_layers + l * l_f));
    be->embedding_backward(c, dtok, B, T, dxs + cur * N * d, g_emb);
    be->synchronize();
  };

  Flag w_ready[2], g_done[2], emb_ready, head_ready, emb_g_done, head_g_done;
  auto load = [&](Flag& f, const void* src, void* dst, std::size_t bytes) {
    f.arm();
    be->copy_async(LinkDirection::host_to_device, src, dst, bytes, [&f] { f.fire(); });
  };
  auto drain = [&](Flag& f, const void* src, void* dst, std::size_t bytes) {
    f.arm();
    be->copy_async(LinkDirection::device_to_host, src, dst, bytes, [&f] { f.fire(); });
  };
  auto slot_w = [&](int k) { return w_slots + k * l_f * bpp; };
  auto streamed_step = [&] {
    load(emb_ready, host_w[0].data(), w_emb, e_f * bpp);
    for (int k = 0; k < 2 && k < L; ++k) load(w_ready[k], host_w[1].data(), slot_w(k), l_f * bpp);
    load(head_ready, host_w[2].data(), w_head, h_f * bpp);
    emb_ready.wait();
    be->embedding_forward(c, w_emb, dtok, B, T, act(0));
    for (std::int64_t l = 0; l < L; ++l) {
      const int k = static_cast<int>(l % 2);
      w_ready[k].wait();
      be->layer_forward(c, slot_w(k), {B, T}, layer_bufs(l, 0, nullptr));
      if (l + 2 < L) load(w_ready[k], host_w[1].data(), slot_w(k), l_f * bpp);
    }
    head_ready.wait();
    be->fill_zero(g_head, h_f * 4);
    be->head_forward_backward(c, w_head, nullptr, {B, T}, head_bufs);
    drain(head_g_done, g_head, host_g[2].data(), h_f * 4);
    // Backward: the last two layers' weights are still in their slots; then reload in reverse.
    int cur = 0;
    for (std::int64_t l = L - 1; l >= 0; --l, cur ^= 1) {
      const int k = static_cast<int>(l % 2);
      w_ready[k].wait();
      g_done[k].wait();  // the previous drain of this gradient slot finished
      float* gs = g_slots + k * l_f;
      be->fill_zero(gs, l_f * 4);
      be->layer_backward(c, slot_w(k), {B, T}, layer_bufs(l, cur, gs));
      drain(g_done[k], gs, host_g[k].data(), l_f * 4);
      if (l - 2 >= 0) load(w_ready[k], host_w[1].data(), slot_w(k), l_f * bpp);  // slot k's next layer
    }
    be->fill_zero(g_emb, e_f * 4);
    be->embedding_backward(c, dtok, B, T, dxs + cur * N * d, g_emb);
    head_g_done.wait();
    drain(emb_g_done, g_emb, host_g[2].data(), e_f * 4);
    be->wait_link_idle();
  };

  StepResult r;
  resident_step();  // warm-up: cuBLASLt plans, tables, scratch
  r.resident_s = 1e30;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = Clock::now();
    resident_step();
    r.resident_s = std::min(r.resident_s, since(t0));
  }
  streamed_step();
  r.streamed_s = 1e30;
  for (int s = 0; s < steps; ++s) {
    const LinkStats before = be->link_stats();
    const auto t0 = Clock::now();
    streamed_step();
    const double t = since(t0);
    const LinkStats after = be->link_stats();
    if (t < r.streamed_s) {
      r.streamed_s = t;
      const auto& u0 = before.of(LinkDirection::host_to_device);
      const auto& u1 = after.of(LinkDirection::host_to_device);
      const auto& d0 = before.of(LinkDirection::device_to_host);
      const auto& d1 = after.of(LinkDirection::device_to_host);
      r.transfer_s = std::max(u1.busy_seconds - u0.busy_seconds, d1.busy_seconds - d0.busy_seconds);
      r.h2d_bytes = static_cast<double>(u1.bytes - u0.bytes);
      r.d2h_bytes = static_cast<double>(d1.bytes - d0.bytes);
    }
  }
  for (int s = 0; s < 3; ++s) be->unregister_host(host_w[s].data(), stage_f[s] * bpp);
  for (auto& g : host_g) be->unregister_host(g.data(), g.size() * 4);
  return r;
}

double model_flops(const ModelConfig& c, std::int64_t B, std::int64_t T) {
  const double d = c.hidden_size, qd = c.q_dim(), kd = c.kv_dim(), ff = c.intermediate_size;
  const double per_layer = d * (qd + 2 * kd) + qd * d + 3 * d * ff;
  const double matmul_params = c.num_hidden_layers * per_layer + static_cast<double>(c.vocab_size) * d;
  const double tokens = static_cast<double>(B * T);
  return 6.0 * matmul_params * tokens + 12.0 * c.num_hidden_layers * d * T * tokens;
}

}  // namespace

int main(int argc, char** argv) {
  std::string models = "1b,3b";
  int steps = 2;
  std::int64_t B = 4, T = 2048;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--models")
      models = argv[i + 1];
    else if (a == "--steps")
      steps = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--tokens")
      std::sscanf(argv[i + 1], "%ld,%ld", &B, &T);
    else {
      std::fprintf(stderr, "bench_gpu: unknown argument %s (use --models 1b,3b --steps N --tokens B,T)\n", argv[i]);
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "bench_gpu: no usable GPU on this machine\n");
    return 1;
  }
  try {
    cudaDeviceProp prop{};
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    int drv = 0, rt = 0;
    MT_CUDA_CHECK(cudaDriverGetVersion(&drv));
    MT_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
    std::printf("GPU 0: %s, sm_%d%d, %d SMs, %.1f GiB; driver API %d, runtime %d\n", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, drv, rt);
    bench::Report report("gpu");
    const double bf16_peak =
        std::max(gemm_tflops(true, false, 8192, 8192, 8192), gemm_tflops(true, false, 8192, 8192, 2048));
    const double tf32 = gemm_tflops(false, true, 8192, 8192, 8192);
    const double fp32 = gemm_tflops(false, false, 4096, 4096, 4096);
    std::printf("cuBLASLt GEMM: bf16 %.1f TFLOP/s (the MFU ceiling), tf32 %.1f, fp32 %.1f\n", bf16_peak, tf32, fp32);
    report.add({"gemm_bf16_tflops", bf16_peak, "TFLOP/s", 0.0});
    report.add({"gemm_tf32_tflops", tf32, "TFLOP/s", 0.0});
    const LinkRates probe = pinned_probe(std::size_t{1} << 30);
    std::printf("pinned-copy probe (1 GiB cudaMemcpyAsync): %.1f GB/s host->device, %.1f GB/s device->host\n",
                probe.h2d, probe.d2h);
    {
      BackendOptions o;
      o.kind = "cuda";
      auto be = make_backend(o);
      const std::size_t chunk = std::size_t{64} << 20;
      std::byte* dev = be->allocate_device(2 * chunk);
      const LinkRates link = backend_copies(*be, dev, chunk, 32);
      std::printf(
          "backend copies (32 x 64 MiB, registered host): %.1f GB/s up (%.2f of the probe), %.1f GB/s down (%.2f)\n",
          link.h2d, link.h2d / probe.h2d, link.d2h, link.d2h / probe.d2h);
      report.add({"link_h2d_gbps", link.h2d, "GB/s", probe.h2d, 0.9});
      report.add({"link_d2h_gbps", link.d2h, "GB/s", probe.d2h, 0.9});
    }
    std::stringstream list(models);
    for (std::string m; std::getline(list, m, ',');) {
      const ModelConfig c = m == "3b" ? llama_3b() : llama_1b();
      std::printf(
          "model %s: Llama d=%ld, %ld layers, %ld heads (%ld kv) x %ld, ff %ld, vocab %ld; %ld x %ld tokens, bf16\n",
          m.c_str(), static_cast<long>(c.hidden_size), static_cast<long>(c.num_hidden_layers),
          static_cast<long>(c.num_attention_heads), static_cast<long>(c.num_key_value_heads),
          static_cast<long>(c.head_dim), static_cast<long>(c.intermediate_size), static_cast<long>(c.vocab_size),
          static_cast<long>(B), static_cast<long>(T));
      const StepResult r = model_step(c, B, T, steps);
      const double flops = model_flops(c, B, T);
      const double tf_res = flops / r.resident_s / 1e12, tf_str = flops / r.streamed_s / 1e12;
      const double overlap = r.streamed_s / std::max(r.resident_s, r.transfer_s);
      std::printf("  resident step %.3f s (%.1f TFLOP/s, MFU %.2f); streamed step %.3f s (%.1f TFLOP/s, MFU %.2f)\n",
                  r.resident_s, tf_res, tf_res / bf16_peak, r.streamed_s, tf_str, tf_str / bf16_peak);
      std::printf(
          "  link per streamed step: %.2f GB up, %.2f GB down, busy %.3f s; overlap ratio %.2f; streamed/resident "
          "%.2f\n",
          r.h2d_bytes / 1e9, r.d2h_bytes / 1e9, r.transfer_s, overlap, r.resident_s / r.streamed_s);
      report.add({"step_tflops_" + m + "_resident", tf_res, "TFLOP/s", bf16_peak});
      report.add({"step_tflops_" + m + "_streamed", tf_str, "TFLOP/s", bf16_peak});
      report.add({"overlap_ratio_" + m, overlap, "x", 0.0, 0.0, "lower"});
      report.add({"streamed_over_resident_" + m, r.resident_s / r.streamed_s, "x", 0.0, 0.9});
    }
    report.print();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
