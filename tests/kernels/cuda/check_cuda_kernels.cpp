// Each CUDA kernel against its CPU reference on the same random inputs (needs a GPU; exit 77 without).
// Tolerances, norm-wise relative to the CPU result:
//   - elementwise kernels, norms, RoPE, the embedding: 1e-6 (one rounding per operation; only the
//     reduction order of a row's sum and libm's exp/tanh differ);
//   - fp32 products (no TF32) and attention: 1e-5 (sums of up to a few thousand products in another order);
//   - bf16 products: 1e-5 against the CPU's bf16 products (identical bf16 operands, fp32 accumulation in
//     another order);
//   - deterministic column sums and the embedding scatter: bit-equal to themselves across two runs.
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/ops_bf16.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/ops.hpp"
#include "kernels/cuda/plan.hpp"
#include "tests/kernels/cuda/cuda_check_util.hpp"

using namespace mt;
using namespace mt::cuda::check;
using mt::test::randn;

namespace {

constexpr double kElem = 1e-6, kProduct = 1e-5;

void check_gemm(Verdicts& v, cudaStream_t st) {
  for (bool tf32 : {false}) {
    cuda::Gemm gemm(tf32);
    struct Shape {
      std::int64_t N, in, out;
    };
    for (const Shape s : {Shape{37, 29, 53}, Shape{256, 512, 384}, Shape{1, 7, 3}}) {
      const std::string tag =
          "N=" + std::to_string(s.N) + " in=" + std::to_string(s.in) + " out=" + std::to_string(s.out);
      auto x = randn(s.N * s.in, 1), W = randn(s.out * s.in, 2), dy = randn(s.N * s.out, 3);
      auto dx0 = randn(s.N * s.in, 4), dW0 = randn(s.out * s.in, 5);
      // fp32
      std::vector<float> y(s.N * s.out), dx = dx0, dW = dW0;
      cpu::linear_forward(x.data(), W.data(), nullptr, y.data(), s.N, s.in, s.out, 1);
      cpu::linear_backward_input(dy.data(), W.data(), dx.data(), s.N, s.in, s.out, true, 1);
      cpu::linear_backward_weight(dy.data(), x.data(), dW.data(), nullptr, s.N, s.in, s.out, 1);
      DevBuf<float> dxx(x), dWW(W), ddy(dy), dyy(s.N * s.out), ddx(dx0), ddW(dW0);
      gemm.linear_forward(dxx.ptr, dWW.ptr, dyy.ptr, s.N, s.in, s.out, false, st);
      gemm.linear_backward_input(ddy.ptr, dWW.ptr, ddx.ptr, s.N, s.in, s.out, true, false, st);
      gemm.linear_backward_weight(ddy.ptr, dxx.ptr, ddW.ptr, s.N, s.in, s.out, false, st);
      v.close("gemm fp32 forward " + tag, dyy.download(), y, kProduct);
      v.close("gemm fp32 backward input (+=) " + tag, ddx.download(), dx, kProduct);
      v.close("gemm fp32 backward weight (+=) " + tag, ddW.download(), dW, kProduct);
      // bf16 operands, fp32 accumulation
      std::vector<bf16_t> xb(x.size()), Wb(W.size()), gb(dy.size());
      cpu::to_bf16(x.data(), xb.data(), x.size(), 1);
      cpu::to_bf16(W.data(), Wb.data(), W.size(), 1);
      cpu::to_bf16(dy.data(), gb.data(), dy.size(), 1);
      std::vector<float> yb(s.N * s.out), dxb = dx0, dWb = dW0;
      cpu::linear_forward_bf16(xb.data(), Wb.data(), nullptr, yb.data(), s.N, s.in, s.out, 1);
      cpu::linear_backward_input_bf16(gb.data(), Wb.data(), dxb.data(), s.N, s.in, s.out, true, 1);
      cpu::linear_backward_weight_bf16(gb.data(), xb.data(), dWb.data(), s.N, s.in, s.out, 1);
      DevBuf<bf16_t> dxb_d(xb), dWb_d(Wb), dgb_d(gb);
      ddx.upload(dx0);
      ddW.upload(dW0);
      gemm.linear_forward(dxb_d.ptr, dWb_d.ptr, dyy.ptr, s.N, s.in, s.out, true, st);
      gemm.linear_backward_input(dgb_d.ptr, dWb_d.ptr, ddx.ptr, s.N, s.in, s.out, true, true, st);
      gemm.linear_backward_weight(dgb_d.ptr, dxb_d.ptr, ddW.ptr, s.N, s.in, s.out, true, st);
      v.close("gemm bf16 forward " + tag, dyy.download(), yb, kProduct);
      v.close("gemm bf16 backward input (+=) " + tag, ddx.download(), dxb, kProduct);
      v.close("gemm bf16 backward weight (+=) " + tag, ddW.download(), dWb, kProduct);
    }
  }
}

void check_elementwise(Verdicts& v, cudaStream_t st) {
  const std::size_t n = 100003;
  auto a = randn(n, 11, 3.0), b = randn(n, 12), c = randn(n, 13);
  a[5] = NAN;
  a[6] = INFINITY;
  a[7] = 1e-40f;  // a denormal: kept, not flushed
  std::vector<bf16_t> ab(n);
  cpu::to_bf16(a.data(), ab.data(), n, 1, cpu::Bf16Path::portable);
  DevBuf<float> da(a), db(b), dc(c), o1(n), o2(n);
  DevBuf<bf16_t> dab(n);
  cuda::to_bf16(da.ptr, dab.ptr, n, st);
  v.bit_equal("to_bf16 (RNE, NaN, inf, denormal) vs cpu::to_bf16", dab.download(), ab);
  a[5] = 0.5f, a[6] = -1.0f, a[7] = 0.0f;
  da.upload(a);
  std::vector<float> h(n), dg(n), du(n);
  cpu::swiglu_forward(a.data(), b.data(), h.data(), n, 1);
  cuda::swiglu_forward(da.ptr, db.ptr, o1.ptr, n, st);
  v.close("swiglu forward", o1.download(), h, kElem);
  cpu::swiglu_backward(a.data(), b.data(), c.data(), dg.data(), du.data(), n, 1);
  cuda::swiglu_backward(da.ptr, db.ptr, dc.ptr, o1.ptr, o2.ptr, n, st);
  v.close("swiglu backward dg", o1.download(), dg, kElem);
  v.close("swiglu backward du", o2.download(), du, kElem);
  cpu::gelu_forward(a.data(), h.data(), n, 1);
  cuda::gelu_forward(da.ptr, o1.ptr, n, st);
  v.close("gelu forward", o1.download(), h, kElem);
  cpu::gelu_backward(a.data(), c.data(), dg.data(), n, 1);
  cuda::gelu_backward(da.ptr, dc.ptr, o1.ptr, n, st);
  v.close("gelu backward", o1.download(), dg, kElem);
  std::vector<float> sum = b;
  for (std::size_t i = 0; i < n; ++i) sum[i] += a[i];
  cuda::add_into(db.ptr, da.ptr, n, st);
  v.bit_equal("residual add", db.download(), sum);
}

void check_norms(Verdicts& v, cudaStream_t st) {
  const std::int64_t N = 301, D = 320;
  auto x = randn(N * D, 21, 2.0), w = randn(D, 22), bias = randn(D, 23), dy = randn(N * D, 24);
  auto dx0 = randn(N * D, 25), dw0 = randn(D, 26), db0 = randn(D, 27);
  const cuda::ColsumPlan plan = cuda::colsum_plan(N);
  DevBuf<float> dxv(x), dwv(w), dbv(bias), ddy(dy), y(N * D), rstd(N), mean(N), ddx(dx0), ddw(dw0), ddb(db0),
      partial(cuda::colsum_scratch_floats(N, D));
  std::printf("column sums: %lld splits of %lld rows\n", static_cast<long long>(plan.splits),
              static_cast<long long>(plan.rows_per_split));
  {
    std::vector<float> yr(N * D), rr(N), dx = dx0, dw = dw0;
    cpu::rmsnorm_forward(x.data(), w.data(), yr.data(), rr.data(), N, D, 1e-5f, 1);
    cuda::rmsnorm_forward(dxv.ptr, dwv.ptr, false, y.ptr, rstd.ptr, N, D, 1e-5f, st);
    v.close("rmsnorm forward y", y.download(), yr, kElem);
    v.close("rmsnorm forward rstd", rstd.download(), rr, kElem);
    cpu::rmsnorm_backward(x.data(), w.data(), rr.data(), dy.data(), dx.data(), dw.data(), N, D, true, 1);
    cuda::rmsnorm_backward(dxv.ptr, dwv.ptr, false, rstd.ptr, ddy.ptr, ddx.ptr, ddw.ptr, N, D, true, partial.ptr, st);
    v.close("rmsnorm backward dx (+=)", ddx.download(), dx, kElem);
    v.close("rmsnorm backward dw (+=)", ddw.download(), dw, kElem);
    // bf16 weights widened on load
    std::vector<bf16_t> wb(D);
    cpu::to_bf16(w.data(), wb.data(), D, 1);
    std::vector<float> ww(D);
    cpu::from_bf16(wb.data(), ww.data(), D, 1);
    DevBuf<bf16_t> dwb(wb);
    cpu::rmsnorm_forward(x.data(), ww.data(), yr.data(), rr.data(), N, D, 1e-5f, 1);
    cuda::rmsnorm_forward(dxv.ptr, dwb.ptr, true, y.ptr, rstd.ptr, N, D, 1e-5f, st);
    v.close("rmsnorm forward, bf16 weight", y.download(), yr, kElem);
  }
  {
    std::vector<float> yr(N * D), mr(N), rr(N), dx = dx0, dw = dw0, db = db0;
    ddx.upload(dx0), ddw.upload(dw0);
    cpu::layernorm_forward(x.data(), w.data(), bias.data(), yr.data(), mr.data(), rr.data(), N, D, 1e-5f, 1);
    cuda::layernorm_forward(dxv.ptr, dwv.ptr, dbv.ptr, false, y.ptr, mean.ptr, rstd.ptr, N, D, 1e-5f, st);
    v.close("layernorm forward y", y.download(), yr, kElem);
    v.close("layernorm forward mean", mean.download(), mr, kElem);
    v.close("layernorm forward rstd", rstd.download(), rr, kElem);
    cpu::layernorm_backward(x.data(), w.data(), mr.data(), rr.data(), dy.data(), dx.data(), dw.data(), db.data(), N, D,
                            false, 1);
    cuda::layernorm_backward(dxv.ptr, dwv.ptr, false, mean.ptr, rstd.ptr, ddy.ptr, ddx.ptr, ddw.ptr, ddb.ptr, N, D,
                             false, partial.ptr, st);
    v.close("layernorm backward dx (=)", ddx.download(), dx, kElem);
    v.close("layernorm backward dw (+=)", ddw.download(), dw, kElem);
    v.close("layernorm backward db (+=)", ddb.download(), db, kElem);
    // colsum determinism: the same sums twice from the same start
    ddb.upload(db0);
    cuda::colsum_add(ddy.ptr, ddb.ptr, N, D, partial.ptr, st);
    const auto first = ddb.download();
    ddb.upload(db0);
    cuda::colsum_add(ddy.ptr, ddb.ptr, N, D, partial.ptr, st);
    v.bit_equal("column sums: two runs", ddb.download(), first);
    std::vector<float> cs = db0;
    cpu::colsum_add(dy.data(), cs.data(), N, D, 1);
    v.close("column sums vs cpu::colsum_add", first, cs, kElem);
  }
}

void check_rope(Verdicts& v, cudaStream_t st) {
  const std::int64_t B = 2, T = 45, H = 3, hd = 64, stride = H * hd + 8;  // a padded row stride
  cpu::RopeParams p;
  p.theta = 500000.0f;
  p.scaling_factor = 8.0f;
  p.original_max_position = 16;
  std::vector<float> cs(T * hd / 2), sn(T * hd / 2);
  cpu::rope_table(p, T, hd, cs.data(), sn.data());
  auto x = randn(B * T * stride, 31);
  DevBuf<float> dx(x), dc(cs), ds(sn);
  for (bool inverse : {false, true}) {
    std::vector<float> r = x;
    dx.upload(x);
    cpu::rope_apply(r.data(), B * T, T, H, hd, stride, cs.data(), sn.data(), inverse, 1);
    cuda::rope_apply(dx.ptr, B * T, T, H, hd, stride, dc.ptr, ds.ptr, inverse, st);
    v.close(std::string("rope (llama3 scaling) ") + (inverse ? "inverse" : "forward"), dx.download(), r, kElem);
  }
}

void check_embedding_and_loss(Verdicts& v, cudaStream_t st) {
  const std::int64_t V = 1000, B = 3, T = 50, N = B * T;
  std::vector<std::int32_t> tok(N), tgt(N);
  for (std::int64_t i = 0; i < N; ++i)
    tok[i] = static_cast<std::int32_t>((i * 7919) % 50),
    tgt[i] = (i % 11 == 3) ? -100 : static_cast<std::int32_t>((i * 104729) % V);
  auto logits = randn(N * V, 41, 3.0);
  std::vector<float> g = logits, loss(N);
  cpu::cross_entropy_rows(g.data(), tgt.data(), loss.data(), N, V, true, 1);
  DevBuf<float> dl(logits), dloss(N);
  DevBuf<std::int32_t> dt(tgt);
  cuda::cross_entropy_rows(dl.ptr, dt.ptr, dloss.ptr, N, V, true, st);
  v.close("cross-entropy row losses", dloss.download(), loss, kElem);
  v.close("cross-entropy gradient (softmax - onehot, 0 for ignored rows)", dl.download(), g, kElem);
  DevBuf<double> out(2);
  cuda::loss_sum(dloss.ptr, dt.ptr, N, out.ptr, st);
  const auto o = out.download();
  double ref = 0;
  std::int64_t counted = 0;
  for (std::int64_t r = 0; r < N; ++r)
    if (tgt[r] != -100) ref += loss[r], ++counted;
  v.scalar("loss sum on the device", o[0], ref, 1e-6);
  v.fact("counted tokens on the device (" + std::to_string(o[1]) + " vs " + std::to_string(counted) + ")",
         static_cast<std::int64_t>(o[1]) == counted);
}

void check_attention(Verdicts& v, cudaStream_t st) {
  for (std::int64_t hd : {64, 80, 96, 128, 48, 8}) {
    const std::int64_t B = 2, T = 77, Hq = 4, Hkv = 2;
    cpu::AttnShape a;
    a.batch = B, a.seq = T, a.q_heads = Hq, a.kv_heads = Hkv, a.head_dim = hd;
    a.q_stride = Hq * hd, a.kv_stride = Hkv * hd, a.o_stride = Hq * hd;
    cuda::AttnDims g{B, T, Hq, Hkv, hd, a.q_stride, a.kv_stride, a.o_stride};
    const std::string tag = "head_dim " + std::to_string(hd) + " (" +
                            cuda::attention_path_name(cuda::attention_path(hd)) + "), GQA 4:2, T=77";
    auto q = randn(B * T * a.q_stride, 51), k = randn(B * T * a.kv_stride, 52), vv = randn(B * T * a.kv_stride, 53);
    auto dout = randn(B * T * a.o_stride, 54);
    std::vector<float> out(B * T * a.o_stride), lse(B * Hq * T), dq(q.size()), dk(k.size()), dv(vv.size());
    cpu::attention_forward(q.data(), k.data(), vv.data(), out.data(), lse.data(), a, 1);
    cpu::attention_backward(q.data(), k.data(), vv.data(), out.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                            dv.data(), a, 1);
    DevBuf<float> Q(q), K(k), Vd(vv), O(out.size()), L(lse.size()), dO(dout), dQ(q.size()), dK(k.size()), dV(vv.size()),
        rowdot(B * Hq * T);
    cuda::attention_forward(Q.ptr, K.ptr, Vd.ptr, O.ptr, L.ptr, g, st);
    v.close("attention forward out, " + tag, O.download(), out, kProduct);
    v.close("attention forward lse, " + tag, L.download(), lse, kProduct);
    cuda::attention_backward(Q.ptr, K.ptr, Vd.ptr, O.ptr, L.ptr, dO.ptr, dQ.ptr, dK.ptr, dV.ptr, rowdot.ptr, g, st);
    v.close("attention backward dq, " + tag, dQ.download(), dq, kProduct);
    v.close("attention backward dk, " + tag, dK.download(), dk, kProduct);
    v.close("attention backward dv, " + tag, dV.download(), dv, kProduct);
    const auto dk1 = dK.download();
    cuda::attention_backward(Q.ptr, K.ptr, Vd.ptr, O.ptr, L.ptr, dO.ptr, dQ.ptr, dK.ptr, dV.ptr, rowdot.ptr, g, st);
    v.bit_equal("attention backward dk: two runs, " + tag, dK.download(), dk1);
  }
}

}  // namespace

int main() {
  require_gpu("check_cuda_kernels");
  Verdicts v;
  try {
    cudaStream_t st = nullptr;
    MT_CUDA_CHECK(cudaStreamCreate(&st));
    check_gemm(v, st);
    check_elementwise(v, st);
    check_norms(v, st);
    check_rope(v, st);
    check_embedding_and_loss(v, st);
    check_attention(v, st);
    MT_CUDA_CHECK(cudaStreamDestroy(st));
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    v.failed++;
  }
  return v.finish("check_cuda_kernels");
}
