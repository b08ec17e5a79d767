// The op test: every op of the seam (kernels/ops.hpp), with the shapes and precisions the stages use, run
// on one backend's op set (Backend::ops(), on buffers from its allocate_device, moved by its link) and
// compared with the plain references of kernels/cpu/reference_ops.hpp evaluated in double on the very
// inputs the op saw (bf16 runs: the weights and the rounded operands as bf16 values). One line per check.
//
//   test_backend_ops --backend cpu|cuda --precision fp32|bf16
//
// Exit 0: every check passed and every op of kOpNames had a passing case; 1: a check failed, an op threw
// (a backend without an op fails by that op's name), or an op has no case; 77: the backend cannot run
// here (no GPU: skipped, never passed).
//
// Tolerances (norm-wise relative error against the double reference), per op:
//   products (linear_*) 1e-5: sums of up to 512 fp32 products in some order (bf16: of exact bf16 products);
//   norms 1e-5, attention 2e-5 (exp, rsqrt and online-softmax rescaling in fp32);
//   RoPE 2e-6 (fp32 angles), activations 2e-6 (exp/tanh in fp32), cross-entropy 1e-5;
//   the embedding gather, moves, fills and residual adds are exact: bit-equal to the host's fp32 result;
//   the embedding scatter and loss_sum: 1e-6 / 1e-12, and bit-equal to themselves when run twice;
//   mixture of experts: the chosen experts, the dispatch (host offsets, order, slot rows), the gather and
//   its backward exact; router weights, combine and dye 1e-6; dlogits and dweight 1e-5 (sums in fp32);
//   grouped products 1e-5 as the products.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "device/backend.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/reference_ops.hpp"
#include "kernels/ops.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace {

using namespace mt;
using i64 = std::int64_t;
using Vec = std::vector<double>;
using test::randn;

// ---- device buffers through the backend: one arena, bump-allocated, moved by the link ----
class Device {
 public:
  Device(Backend& b, std::size_t bytes) : b_(b), base_(b.allocate_device(bytes)), cap_(bytes) {}
  template <class T>
  T* alloc(std::size_t n) {
    const std::size_t bytes = (std::max<std::size_t>(n, 1) * sizeof(T) + 255) / 256 * 256;
    if (used_ + bytes > cap_) throw std::runtime_error("op test: the device arena is too small for this case");
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += bytes;
    return p;
  }
  template <class T>
  T* upload(const std::vector<T>& h) {
    T* d = alloc<T>(h.size());
    if (!h.empty()) b_.copy_async(LinkDirection::host_to_device, h.data(), d, h.size() * sizeof(T), nullptr);
    b_.wait_link_idle();
    return d;
  }
  template <class T>
  std::vector<T> download(const T* d, std::size_t n) {
    std::vector<T> h(n);
    if (n) b_.copy_async(LinkDirection::device_to_host, d, h.data(), n * sizeof(T), nullptr);  // after compute (rule 2)
    b_.wait_link_idle();
    return h;
  }
  void reset() {
    b_.synchronize();
    used_ = 0;
  }

 private:
  Backend& b_;
  std::byte* base_;
  std::size_t cap_, used_ = 0;
};

struct Verdicts {
  int passed = 0, failed = 0;
  std::set<std::string> ops_passed, ops_failed;
  std::string op;  // the op the current check exercises
  void record(bool ok) {
    (ok ? passed : failed)++;
    (ok ? ops_passed : ops_failed).insert(op);
  }
  template <class A, class B>
  void close(const std::string& what, const std::vector<A>& got, const std::vector<B>& ref, double tol) {
    const double e = got.size() == ref.size() ? test::rel_err(got, ref) : INFINITY;
    const bool ok = e <= tol && std::isfinite(e);
    std::printf("%s %-22s %-58s rel_err %.2e (tol %.0e)\n", ok ? "PASS" : "FAIL", op.c_str(), what.c_str(), e, tol);
    record(ok);
  }
  template <class T>
  void bit_equal(const std::string& what, const std::vector<T>& a, const std::vector<T>& b) {
    std::size_t diff = a.size() == b.size() ? 0 : 1;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) diff += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
    std::printf("%s %-22s %-58s %zu of %zu differ in a bit\n", diff ? "FAIL" : "PASS", op.c_str(), what.c_str(), diff,
                a.size());
    record(diff == 0);
  }
  void fact(const std::string& what, bool ok) {
    std::printf("%s %-22s %s\n", ok ? "PASS" : "FAIL", op.c_str(), what.c_str());
    record(ok);
  }
};

// ---- the case context: the backend's ops, its precision, and the values an op sees ----
struct Ctx {
  Ops& ops;
  Device& dev;
  Verdicts& v;
  Precision p;
  bool bf16() const { return p == Precision::bf16; }
  // A weight as the backend holds it (fp32, or bf16 at the same element offsets).
  const void* weight(const std::vector<float>& w) {
    if (!bf16()) return dev.upload(w);
    std::vector<bf16_t> b(w.size());
    cpu::to_bf16(w.data(), b.data(), w.size(), 1, cpu::Bf16Path::portable);
    return dev.upload(b);
  }
  // What a weight's op reads, in double (bf16 values widened exactly).
  Vec seen_weight(const std::vector<float>& w) const { return bf16() ? rounded(w) : Vec(w.begin(), w.end()); }
  // What a bf16 product reads of an fp32 operand (RNE to bf16), in double.
  Vec seen_operand(const std::vector<float>& x) const { return bf16() ? rounded(x) : Vec(x.begin(), x.end()); }
  static Vec rounded(const std::vector<float>& x) {
    std::vector<bf16_t> b(x.size());
    cpu::to_bf16(x.data(), b.data(), x.size(), 1, cpu::Bf16Path::portable);
    Vec out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) out[i] = cpu::bf16_to_float(b[i]);
    return out;
  }
  std::vector<float> get(const float* d, std::size_t n) { return dev.download(d, n); }
  void operand_room() {  // room for the widest operand any case converts
    const OperandRoom room{1 << 20, 1 << 20, 4096};
    ops.use_operand_room(dev.alloc<float>(std::max<std::size_t>(operand_room_floats(p, room), 1)), room);
  }
};

std::string dims(std::initializer_list<std::pair<const char*, i64>> d) {
  std::string s;
  for (const auto& [k, v] : d) s += (s.empty() ? "" : " ") + std::string(k) + "=" + std::to_string(v);
  return s;
}

// ---- products ----
void linear_cases(Ctx& c) {
  struct Shape {
    i64 N, in, out;
    bool bias;
  };
  // odd edges; a head-dim 80 projection; one token; an LM-head chunk with an odd vocabulary
  for (const Shape s : {Shape{37, 29, 53, true}, Shape{64, 160, 96, false}, Shape{1, 7, 3, true},
                        Shape{16, 64, 1003, false}, Shape{48, 512, 128, true}}) {
    const std::string tag = dims({{"N", s.N}, {"in", s.in}, {"out", s.out}}) + (s.bias ? " bias" : "");
    auto x = randn(s.N * s.in, 1), W = randn(s.out * s.in, 2, 0.1), b = randn(s.out, 3), dy = randn(s.N * s.out, 4);
    auto dx0 = randn(s.N * s.in, 5), dW0 = randn(s.out * s.in, 6), db0 = randn(s.out, 7);
    const Vec xs = c.seen_operand(x), Ws = c.seen_weight(W), bs = c.seen_weight(b), dys = c.seen_operand(dy);
    c.operand_room();
    const void* dW = c.weight(W);
    const void* dbias = s.bias ? c.weight(b) : nullptr;
    float* dxx = c.dev.upload(x);
    float* y = c.dev.alloc<float>(s.N * s.out);
    c.v.op = "linear_forward";
    c.ops.linear_forward(dxx, dW, dbias, y, s.N, s.in, s.out);
    Vec yr(s.N * s.out);
    ref::linear(xs.data(), Ws.data(), s.bias ? bs.data() : nullptr, yr.data(), s.N, s.in, s.out);
    c.v.close(tag, c.get(y, yr.size()), yr, 1e-5);
    // backward: dx = dy W (and += dy W), dW += dy^T x, db += colsum(fp32 dy)
    for (bool add : {false, true}) {
      float* ddy = c.dev.upload(dy);
      float* ddx = c.dev.upload(dx0);
      float* dWacc = c.dev.upload(dW0);
      float* dbacc = s.bias ? c.dev.upload(db0) : nullptr;
      c.v.op = "linear_backward";
      c.ops.linear_backward(ddy, dxx, dW, ddx, add, dWacc, dbacc, s.N, s.in, s.out);
      Vec dxr = add ? Vec(dx0.begin(), dx0.end()) : Vec(dx0.size(), 0.0), dWr(dW0.begin(), dW0.end()),
          dbr(db0.begin(), db0.end()), dbz(s.out, 0.0);
      ref::linear_backward(xs.data(), Ws.data(), dys.data(), dxr.data(), dWr.data(), dbz.data(), s.N, s.in, s.out);
      const Vec dy_fp32(dy.begin(), dy.end());  // bias gradients from the fp32 dy
      for (i64 r = 0; r < s.N; ++r)
        for (i64 o = 0; o < s.out; ++o) dbr[o] += dy_fp32[r * s.out + o];
      c.v.close("dx (" + std::string(add ? "+=" : "=") + ") " + tag, c.get(ddx, dxr.size()), dxr, 1e-5);
      c.v.close("dW (+=) " + tag, c.get(dWacc, dWr.size()), dWr, 1e-5);
      if (s.bias) c.v.close("db (+=) " + tag, c.get(dbacc, dbr.size()), dbr, 1e-5);
      if (!add) {  // dx may be skipped (the first layer's input needs no gradient)
        float* dW2 = c.dev.upload(dW0);
        c.ops.linear_backward(ddy, dxx, dW, nullptr, false, dW2, nullptr, s.N, s.in, s.out);
        c.v.bit_equal("dW without dx, same bits " + tag, c.get(dW2, dW0.size()), c.get(dWacc, dW0.size()));
      }
    }
    c.dev.reset();
  }
}

// The rounding of a bf16 product's operand (RNE ties, NaN quieted, infinities kept, overflow to inf),
// checked bit for bit where it happens: round_bf16, the conversion the products use, against the host's
// (integer arithmetic on both). Then, in bf16 runs, the product with in = out = 1 and W = 1: the rounded
// operand itself, bit for bit where it is a nonzero number; where it is NaN, NaN (a GPU's product returns
// its canonical NaN, 0x7FFFFFFF on NVIDIA, not the operand's payload); a zero by value. Denormals are
// left out of the product: a GEMM may flush them, which is no fault of the rounding.
void operand_rounding_case(Ctx& c) {
  std::vector<float> x = {
      1.0f, INFINITY,  -INFINITY, 3.4e38f, 1.00390625f, 1.01171875f, std::numeric_limits<float>::quiet_NaN(),
      0.1f, -65504.3f, -0.0f};
  for (const std::uint32_t bits : {0x7f800001u, 0xffc12345u, 0x00000001u, 0x807fffffu}) {  // sNaN, -qNaN, denormals
    float f;
    std::memcpy(&f, &bits, 4);
    x.push_back(f);
  }
  std::vector<bf16_t> expect(x.size());
  cpu::to_bf16(x.data(), expect.data(), x.size(), 1, cpu::Bf16Path::portable);
  c.operand_room();
  float* dx = c.dev.upload(x);
  auto* db = c.dev.alloc<bf16_t>(x.size());
  c.v.op = "round_bf16";
  c.ops.round_bf16(dx, db, x.size());
  c.v.bit_equal("ties, NaN payloads, -0, denormals, inf, overflow", c.dev.download(db, x.size()), expect);
  if (c.bf16()) {
    const std::size_t products = x.size() - 2;  // not the denormals (the last two)
    const i64 N = static_cast<i64>(products);
    float* y = c.dev.alloc<float>(products);
    c.v.op = "linear_forward";
    c.ops.linear_forward(dx, c.weight(std::vector<float>{1.0f}), nullptr, y, N, 1, 1);
    const std::vector<float> got = c.get(y, products);
    std::vector<float> want(products), got_numbers(products);
    std::size_t nan_mismatch = 0;
    for (std::size_t i = 0; i < products; ++i) {
      want[i] = cpu::bf16_to_float(expect[i]);
      const bool nan = std::isnan(want[i]);
      nan_mismatch += nan != std::isnan(got[i]);
      // NaN is checked as NaN below; a zero's sign is the sum's (one that starts from +0 turns -0 into +0)
      got_numbers[i] = nan || (want[i] == 0.0f && got[i] == 0.0f) ? want[i] : got[i];
    }
    c.v.bit_equal("x * 1 = the rounded operand where a number, zeros by value", got_numbers, want);
    c.v.fact("x * 1 is NaN exactly where the rounded operand is NaN (" + std::to_string(nan_mismatch) + " differ)",
             nan_mismatch == 0);
  }
  c.dev.reset();
}

// ---- norms ----
void norm_cases(Ctx& c) {
  struct Shape {
    i64 N, D;
    const char* what;
  };
  for (const Shape s :
       {Shape{301, 320, "hidden"}, Shape{301 * 5, 80, "per head (Qwen3 q/k norm)"}, Shape{3, 7, "tiny"}}) {
    const std::string tag = dims({{"N", s.N}, {"D", s.D}}) + " " + s.what;
    auto x = randn(s.N * s.D, 21, 2.0), w = randn(s.D, 22), b = randn(s.D, 23), dy = randn(s.N * s.D, 24);
    auto dx0 = randn(s.N * s.D, 25), dw0 = randn(s.D, 26), db0 = randn(s.D, 27);
    const Vec xs(x.begin(), x.end()), ws = c.seen_weight(w), bs = c.seen_weight(b), dys(dy.begin(), dy.end());
    const float eps = 1e-5f;
    c.operand_room();
    const void* dw = c.weight(w);
    const void* dbias = c.weight(b);
    float* dxv = c.dev.upload(x);
    float* ddy = c.dev.upload(dy);
    float* y = c.dev.alloc<float>(x.size());
    float* rstd = c.dev.alloc<float>(s.N);
    float* mean = c.dev.alloc<float>(s.N);
    // RMSNorm
    c.v.op = "rmsnorm_forward";
    c.ops.rmsnorm_forward(dxv, dw, y, rstd, s.N, s.D, eps);
    Vec yr(x.size());
    ref::rmsnorm(xs.data(), ws.data(), yr.data(), s.N, s.D, double(eps));
    c.v.close(tag, c.get(y, yr.size()), yr, 1e-5);
    for (bool add : {false, true}) {
      float* ddx = c.dev.upload(dx0);
      float* ddw = c.dev.upload(dw0);
      c.v.op = "rmsnorm_backward";
      c.ops.rmsnorm_backward(dxv, dw, rstd, ddy, ddx, ddw, s.N, s.D, add);
      Vec dxr = add ? Vec(dx0.begin(), dx0.end()) : Vec(dx0.size(), 0.0), dwr(dw0.begin(), dw0.end());
      ref::rmsnorm_backward(xs.data(), ws.data(), dys.data(), dxr.data(), dwr.data(), s.N, s.D, double(eps));
      c.v.close("dx (" + std::string(add ? "+=" : "=") + ") " + tag, c.get(ddx, dxr.size()), dxr, 1e-5);
      c.v.close("dw (+=) " + tag, c.get(ddw, dwr.size()), dwr, 1e-5);
    }
    // LayerNorm (GPT-2)
    c.v.op = "layernorm_forward";
    c.ops.layernorm_forward(dxv, dw, dbias, y, mean, rstd, s.N, s.D, eps);
    ref::layernorm(xs.data(), ws.data(), bs.data(), yr.data(), s.N, s.D, double(eps));
    c.v.close(tag, c.get(y, yr.size()), yr, 1e-5);
    for (bool add : {false, true}) {
      float* ddx = c.dev.upload(dx0);
      float* ddw = c.dev.upload(dw0);
      float* ddb = c.dev.upload(db0);
      c.v.op = "layernorm_backward";
      c.ops.layernorm_backward(dxv, dw, mean, rstd, ddy, ddx, ddw, ddb, s.N, s.D, add);
      Vec dxr = add ? Vec(dx0.begin(), dx0.end()) : Vec(dx0.size(), 0.0), dwr(dw0.begin(), dw0.end()),
          dbr(db0.begin(), db0.end());
      ref::layernorm_backward(xs.data(), ws.data(), dys.data(), dxr.data(), dwr.data(), dbr.data(), s.N, s.D,
                              double(eps));
      c.v.close("dx (" + std::string(add ? "+=" : "=") + ") " + tag, c.get(ddx, dxr.size()), dxr, 1e-5);
      c.v.close("dw (+=) " + tag, c.get(ddw, dwr.size()), dwr, 1e-5);
      c.v.close("db (+=) " + tag, c.get(ddb, dbr.size()), dbr, 1e-5);
    }
    c.dev.reset();
  }
}

// ---- rotary embeddings ----
// transformers' inv_freq and attention scaling for every rope_scaling type, in double
// (ref::rope_inv_freq: the formulas as math, independent of the fp32 order the tables are computed in).
Vec inv_freq(const RopeParams& p, i64 T, i64 hd, double& scale) {
  std::vector<double> inv;
  scale = ref::rope_inv_freq<double>(p, T, hd, inv);
  return Vec(inv.begin(), inv.end());
}

void rope_cases(Ctx& c) {
  struct Case {
    i64 B, T, heads, hd, stride_extra;
    RopeParams p;
    const char* what;
  };
  RopeParams llama3;
  llama3.kind = RopeKind::llama3;
  llama3.theta = 500000.0f, llama3.factor = 8.0, llama3.low_freq_factor = 1.0;
  llama3.high_freq_factor = 4.0, llama3.original_max_position = 8192;
  RopeParams qwen;
  qwen.theta = 1000000.0f;
  RopeParams linear;
  linear.kind = RopeKind::linear, linear.factor = 4.0;
  RopeParams dynamic;  // original length 32: grown base at T = 70, plain at T = 19
  dynamic.kind = RopeKind::dynamic, dynamic.factor = 2.0, dynamic.original_max_position = 32;
  RopeParams yarn;  // as rope_params_of gives for factor 4 at max_position_embeddings 64: all three regimes
  yarn.kind = RopeKind::yarn, yarn.theta = 10000.0f, yarn.factor = 4.0, yarn.original_max_position = 64;
  yarn.attention_scaling = 0.1 * std::log(4.0) + 1.0;
  RopeParams gpt_oss;  // gpt-oss's shape: factor 32 over 4096, beta 32 / 1, no truncation
  gpt_oss.kind = RopeKind::yarn, gpt_oss.theta = 150000.0f, gpt_oss.factor = 32.0;
  gpt_oss.original_max_position = 4096, gpt_oss.truncate = false;
  gpt_oss.attention_scaling = 0.1 * std::log(32.0) + 1.0;
  for (const Case& k :
       {Case{2, 37, 4, 64, 0, RopeParams{}, "Llama-2"}, Case{1, 70, 8, 128, 0, llama3, "Llama-3 scaled"},
        Case{2, 19, 3, 80, 16, qwen, "head_dim 80, strided rows"}, Case{2, 23, 2, 64, 0, linear, "linear x4"},
        Case{1, 70, 2, 64, 0, dynamic, "dynamic, T above the original 32"},
        Case{2, 19, 2, 64, 0, dynamic, "dynamic, T below the original 32"},
        Case{2, 29, 2, 64, 8, yarn, "yarn x4 (truncated range)"},
        Case{1, 40, 2, 64, 0, gpt_oss, "yarn x32, gpt-oss shape (truncate false)"}}) {
    const std::string tag = dims({{"T", k.T}, {"heads", k.heads}, {"hd", k.hd}}) + " " + k.what;
    const i64 half = k.hd / 2, rows = k.B * k.T, stride = k.heads * k.hd + k.stride_extra;
    float* cos_room = c.dev.alloc<float>(k.T * half);
    float* sin_room = c.dev.alloc<float>(k.T * half);
    c.v.op = "rope_tables";
    const RopeTables t = c.ops.rope_tables(k.p, k.T, k.hd, cos_room, sin_room);
    double scale = 1;
    const Vec inv = inv_freq(k.p, k.T, k.hd, scale);
    Vec cr(k.T * half), sr(k.T * half);
    for (i64 pos = 0; pos < k.T; ++pos)
      for (i64 i = 0; i < half; ++i) {
        const double angle = double(pos) * double(static_cast<float>(inv[i]));  // inv_freq is fp32 in transformers
        cr[pos * half + i] = std::cos(angle) * scale;
        sr[pos * half + i] = std::sin(angle) * scale;
      }
    c.v.close("cos " + tag, c.get(t.cos, cr.size()), cr, 2e-6);
    c.v.close("sin " + tag, c.get(t.sin, sr.size()), sr, 2e-6);
    const auto tc = c.get(t.cos, cr.size()), ts = c.get(t.sin, sr.size());
    const Vec tcd(tc.begin(), tc.end()), tsd(ts.begin(), ts.end());
    auto x = randn(rows * stride, 31);
    for (bool inverse : {false, true}) {
      float* dxv = c.dev.upload(x);
      c.v.op = "rope_apply";
      c.ops.rope_apply(dxv, rows, k.T, k.heads, k.hd, stride, t, inverse);
      Vec xr(x.begin(), x.end());
      ref::rope(xr.data(), rows, k.T, k.heads, k.hd, stride, tcd.data(), tsd.data(), inverse);
      c.v.close(std::string(inverse ? "inverse " : "") + tag + " (padding untouched too)", c.get(dxv, xr.size()), xr,
                2e-6);
    }
    c.dev.reset();
  }
}

// ---- attention ----
void attention_cases(Ctx& c) {
  struct Case {
    i64 B, T, Hq, Hkv, hd;
    bool fused_qkv;  // GPT-2: q, k, v are column blocks of one [T, 3d] buffer
    const char* what;
  };
  for (const Case& k :
       {Case{2, 37, 4, 4, 64, true, "GPT-2 (fused qkv)"}, Case{1, 70, 14, 2, 64, false, "GQA 7:1 (Qwen2)"},
        Case{2, 33, 8, 2, 128, false, "GQA 4:1, hd 128 (Llama-3)"}, Case{1, 45, 6, 3, 80, false, "hd 80"},
        Case{1, 5, 2, 1, 96, false, "T 5, hd 96"}}) {
    const std::string tag = dims({{"B", k.B}, {"T", k.T}, {"Hq", k.Hq}, {"Hkv", k.Hkv}, {"hd", k.hd}}) + " " + k.what;
    const i64 N = k.B * k.T, qd = k.Hq * k.hd, kd = k.Hkv * k.hd;
    AttnShape s;
    s.batch = k.B, s.seq = k.T, s.q_heads = k.Hq, s.kv_heads = k.Hkv, s.head_dim = k.hd;
    s.q_stride = k.fused_qkv ? 3 * qd : qd;
    s.kv_stride = k.fused_qkv ? 3 * qd : kd;
    s.o_stride = qd;
    const i64 qn = N * s.q_stride, kn = N * s.kv_stride;
    auto q = randn(qn, 41), kk = randn(k.fused_qkv ? 0 : kn, 42), vv = randn(k.fused_qkv ? 0 : kn, 43);
    auto dout = randn(N * qd, 44);
    float* dq_in = c.dev.upload(q);
    const float* qp = dq_in;
    const float* kp = k.fused_qkv ? dq_in + qd : c.dev.upload(kk);
    const float* vp = k.fused_qkv ? dq_in + 2 * qd : c.dev.upload(vv);
    const std::vector<float>& kh = k.fused_qkv ? q : kk;
    const std::vector<float>& vh = k.fused_qkv ? q : vv;
    const i64 koff = k.fused_qkv ? qd : 0, voff = k.fused_qkv ? 2 * qd : 0;
    const Vec qs(q.begin(), q.end()), ks(kh.begin() + koff, kh.end()), vs(vh.begin() + voff, vh.end());
    float* out = c.dev.alloc<float>(N * qd);
    float* lse = c.dev.alloc<float>(k.B * k.Hq * k.T);
    c.v.op = "attention_forward";
    c.ops.attention_forward(qp, kp, vp, nullptr, out, lse, s);
    Vec outr(N * qd);
    ref::attention(qs.data(), ks.data(), vs.data(), outr.data(), k.B, k.T, k.Hq, k.Hkv, k.hd, s.q_stride, s.kv_stride,
                   qd);
    c.v.close("out " + tag, c.get(out, outr.size()), outr, 2e-5);
    Vec lser(k.B * k.Hq * k.T);  // log-sum-exp of the scaled scores, per (b, h, t)
    for (i64 b = 0; b < k.B; ++b)
      for (i64 h = 0; h < k.Hq; ++h)
        for (i64 t = 0; t < k.T; ++t) {
          const i64 g = h / (k.Hq / k.Hkv);
          double mx = -INFINITY, sum = 0;
          Vec sc(t + 1);
          for (i64 j = 0; j <= t; ++j) {
            double dot = 0;
            for (i64 i = 0; i < k.hd; ++i)
              dot += qs[(b * k.T + t) * s.q_stride + h * k.hd + i] * ks[(b * k.T + j) * s.kv_stride + g * k.hd + i];
            sc[j] = dot / std::sqrt(double(k.hd));
            mx = std::max(mx, sc[j]);
          }
          for (i64 j = 0; j <= t; ++j) sum += std::exp(sc[j] - mx);
          lser[(b * k.Hq + h) * k.T + t] = mx + std::log(sum);
        }
    c.v.close("lse " + tag, c.get(lse, lser.size()), lser, 2e-6);
    // backward from the op's own out and lse, as the stages call it
    float* ddout = c.dev.upload(dout);
    float* dq = c.dev.alloc<float>(qn);
    float* dk = k.fused_qkv ? dq + qd : c.dev.alloc<float>(kn);
    float* dv = k.fused_qkv ? dq + 2 * qd : c.dev.alloc<float>(kn);
    c.v.op = "attention_backward";
    c.ops.attention_backward(qp, kp, vp, nullptr, out, lse, ddout, dq, dk, dv, nullptr, s);
    Vec dqr(qn, 0.0), dkr(std::max<i64>(kn - koff, 0), 0.0), dvr(std::max<i64>(kn - voff, 0), 0.0);
    const Vec douts(dout.begin(), dout.end());
    ref::attention_backward(qs.data(), ks.data(), vs.data(), douts.data(), dqr.data(), dkr.data(), dvr.data(), k.B, k.T,
                            k.Hq, k.Hkv, k.hd, s.q_stride, s.kv_stride, qd);
    // Compare each gradient on its own columns only (fused: the three blocks of one buffer).
    auto columns = [&](const auto& all, i64 off, i64 width, i64 stride) {
      Vec r;
      for (i64 t = 0; t < N; ++t)
        for (i64 i = 0; i < width; ++i) r.push_back(all[t * stride + off + i]);
      return r;
    };
    const auto dqh = c.get(dq, qn);
    c.v.close("dq " + tag, columns(dqh, 0, qd, s.q_stride), columns(dqr, 0, qd, s.q_stride), 2e-5);
    const auto dkh = k.fused_qkv ? dqh : c.get(dk, kn);
    const auto dvh = k.fused_qkv ? dqh : c.get(dv, kn);
    c.v.close("dk " + tag, columns(dkh, koff, kd, s.kv_stride), columns(dkr, 0, kd, s.kv_stride), 2e-5);
    c.v.close("dv " + tag, columns(dvh, voff, kd, s.kv_stride), columns(dvr, 0, kd, s.kv_stride), 2e-5);
    c.dev.reset();
  }
}

// Sequence tiles (AttnShape::q_start, add_kv_grads), as the tiled layers call them: the queries of one
// sequence's tile against its keys so far, and a whole sequence run as tiles in reverse order whose dk,
// dv accumulate, each against the untiled reference. Neither q_start is a multiple of any block size.
void attention_tile_cases(Ctx& c) {
  const i64 Hq = 4, Hkv = 2, hd = 64, qd = Hq * hd, kd = Hkv * hd;
  auto base = [&](i64 B, i64 seq, i64 q_start) {
    AttnShape s;
    s.batch = B, s.seq = seq, s.q_heads = Hq, s.kv_heads = Hkv, s.head_dim = hd;
    s.q_stride = qd, s.kv_stride = kd, s.o_stride = qd, s.q_start = q_start;
    return s;
  };
  {  // one tile: B 2, positions 100..136 against keys 0..136
    const i64 B = 2, T = 137, q0 = 100, Q = T - q0;
    const std::string tag = "B 2, keys 137, queries 100.. (one tile)";
    auto q = randn(B * Q * qd, 61), kk = randn(B * T * kd, 62), vv = randn(B * T * kd, 63),
         dout = randn(B * Q * qd, 64);
    const Vec qs(q.begin(), q.end()), ks(kk.begin(), kk.end()), vs(vv.begin(), vv.end()), ds(dout.begin(), dout.end());
    const AttnShape s = base(B, T, q0);
    float *qp = c.dev.upload(q), *kp = c.dev.upload(kk), *vp = c.dev.upload(vv), *dop = c.dev.upload(dout);
    float* out = c.dev.alloc<float>(B * Q * qd);
    float* lse = c.dev.alloc<float>(B * Hq * Q);
    c.v.op = "attention_forward";
    c.ops.attention_forward(qp, kp, vp, nullptr, out, lse, s);
    Vec outr(B * Q * qd);
    ref::attention(qs.data(), ks.data(), vs.data(), outr.data(), B, T, Hq, Hkv, hd, qd, kd, qd, q0);
    c.v.close("out " + tag, c.get(out, outr.size()), outr, 2e-5);
    float* dq = c.dev.alloc<float>(B * Q * qd);
    float* dk = c.dev.upload(randn(B * T * kd, 65));  // overwritten: add_kv_grads is false
    float* dv = c.dev.upload(randn(B * T * kd, 66));
    c.v.op = "attention_backward";
    c.ops.attention_backward(qp, kp, vp, nullptr, out, lse, dop, dq, dk, dv, nullptr, s);
    Vec dqr(B * Q * qd, 0.0), dkr(B * T * kd, 0.0), dvr(B * T * kd, 0.0);
    ref::attention_backward(qs.data(), ks.data(), vs.data(), ds.data(), dqr.data(), dkr.data(), dvr.data(), B, T, Hq,
                            Hkv, hd, qd, kd, qd, q0);
    c.v.close("dq " + tag, c.get(dq, dqr.size()), dqr, 2e-5);
    c.v.close("dk " + tag, c.get(dk, dkr.size()), dkr, 2e-5);
    c.v.close("dv " + tag, c.get(dv, dvr.size()), dvr, 2e-5);
    c.dev.reset();
  }
  {  // a sequence of 150 as tiles [100, 150), [37, 100), [0, 37), backward in that order, dk/dv accumulating
    const i64 T = 150;
    const i64 cuts[] = {0, 37, 100, 150};
    const std::string tag = "keys 150 as tiles 0/37/100, dk dv accumulated";
    auto q = randn(T * qd, 71), kk = randn(T * kd, 72), vv = randn(T * kd, 73), dout = randn(T * qd, 74);
    const Vec qs(q.begin(), q.end()), ks(kk.begin(), kk.end()), vs(vv.begin(), vv.end()), ds(dout.begin(), dout.end());
    float *qp = c.dev.upload(q), *kp = c.dev.upload(kk), *vp = c.dev.upload(vv), *dop = c.dev.upload(dout);
    float* out = c.dev.alloc<float>(T * qd);
    float* lse = c.dev.alloc<float>(Hq * T);  // per tile: [h][tile rows], at the tile's own offset
    float* dq = c.dev.alloc<float>(T * qd);
    float* dk = c.dev.alloc<float>(T * kd);
    float* dv = c.dev.alloc<float>(T * kd);
    for (int t = 2; t >= 0; --t) {
      const i64 a = cuts[t], e = cuts[t + 1];
      AttnShape s = base(1, e, a);
      s.add_kv_grads = t != 2;  // the first tile run (the last one) overwrites
      c.v.op = "attention_forward";
      c.ops.attention_forward(qp + a * qd, kp, vp, nullptr, out + a * qd, lse + Hq * a, s);
      c.v.op = "attention_backward";
      c.ops.attention_backward(qp + a * qd, kp, vp, nullptr, out + a * qd, lse + Hq * a, dop + a * qd, dq + a * qd, dk,
                               dv, nullptr, s);
    }
    Vec outr(T * qd), dqr(T * qd, 0.0), dkr(T * kd, 0.0), dvr(T * kd, 0.0);
    ref::attention(qs.data(), ks.data(), vs.data(), outr.data(), 1, T, Hq, Hkv, hd, qd, kd, qd);
    ref::attention_backward(qs.data(), ks.data(), vs.data(), ds.data(), dqr.data(), dkr.data(), dvr.data(), 1, T, Hq,
                            Hkv, hd, qd, kd, qd);
    c.v.op = "attention_forward";
    c.v.close("out " + tag, c.get(out, outr.size()), outr, 2e-5);
    c.v.op = "attention_backward";
    c.v.close("dq " + tag, c.get(dq, dqr.size()), dqr, 2e-5);
    c.v.close("dk " + tag, c.get(dk, dkr.size()), dkr, 2e-5);
    c.v.close("dv " + tag, c.get(dv, dvr.size()), dvr, 2e-5);
    c.dev.reset();
  }
}

// gpt-oss's attention: sliding windows and per-head sinks, whole (B 2, a window inside one key block and
// one across blocks) and as the tiled layers call it (tiles in reverse order, dk, dv and d(sinks)
// accumulating). The sinks are weights, in the run's precision.
void attention_window_sink_cases(Ctx& c) {
  const i64 Hq = 4, Hkv = 2, hd = 64, qd = Hq * hd, kd = Hkv * hd;
  const auto sink_h = randn(Hq, 80, 2.0);
  const Vec sinks = c.seen_weight(sink_h);
  for (const i64 window : {5, 45, 130}) {
    const i64 B = 2, T = 150;
    const std::string tag = "B 2, T 150, window " + std::to_string(window) + ", sinks";
    auto q = randn(B * T * qd, 81), kk = randn(B * T * kd, 82), vv = randn(B * T * kd, 83),
         dout = randn(B * T * qd, 84);
    const Vec qs(q.begin(), q.end()), ks(kk.begin(), kk.end()), vs(vv.begin(), vv.end()), ds(dout.begin(), dout.end());
    AttnShape s;
    s.batch = B, s.seq = T, s.q_heads = Hq, s.kv_heads = Hkv, s.head_dim = hd;
    s.q_stride = qd, s.kv_stride = kd, s.o_stride = qd, s.window = window;
    float *qp = c.dev.upload(q), *kp = c.dev.upload(kk), *vp = c.dev.upload(vv), *dop = c.dev.upload(dout);
    const void* sp = c.weight(sink_h);
    float* out = c.dev.alloc<float>(B * T * qd);
    float* lse = c.dev.alloc<float>(B * Hq * T);
    c.v.op = "attention_forward";
    c.ops.attention_forward(qp, kp, vp, sp, out, lse, s);
    Vec outr(B * T * qd);
    ref::attention(qs.data(), ks.data(), vs.data(), outr.data(), B, T, Hq, Hkv, hd, qd, kd, qd, 0, window,
                   sinks.data());
    c.v.close("out " + tag, c.get(out, outr.size()), outr, 2e-5);
    float* dq = c.dev.alloc<float>(B * T * qd);
    float* dk = c.dev.alloc<float>(B * T * kd);
    float* dv = c.dev.alloc<float>(B * T * kd);
    float* dsink = c.dev.upload(std::vector<float>(Hq, 0.25f));  // added into
    c.v.op = "attention_backward";
    c.ops.attention_backward(qp, kp, vp, sp, out, lse, dop, dq, dk, dv, dsink, s);
    Vec dqr(B * T * qd, 0.0), dkr(B * T * kd, 0.0), dvr(B * T * kd, 0.0), dsr(Hq, 0.25);
    ref::attention_backward(qs.data(), ks.data(), vs.data(), ds.data(), dqr.data(), dkr.data(), dvr.data(), B, T, Hq,
                            Hkv, hd, qd, kd, qd, 0, window, sinks.data(), dsr.data());
    c.v.close("dq " + tag, c.get(dq, dqr.size()), dqr, 2e-5);
    c.v.close("dk " + tag, c.get(dk, dkr.size()), dkr, 2e-5);
    c.v.close("dv " + tag, c.get(dv, dvr.size()), dvr, 2e-5);
    c.v.close("dsinks " + tag, c.get(dsink, Hq), dsr, 2e-5);
    c.dev.reset();
  }
  {  // one sequence of 150 as tiles [100, 150), [37, 100), [0, 37), window 45, sinks
    const i64 T = 150, window = 45;
    const i64 cuts[] = {0, 37, 100, 150};
    const std::string tag = "keys 150 as tiles 0/37/100, window 45, sinks, gradients accumulated";
    auto q = randn(T * qd, 91), kk = randn(T * kd, 92), vv = randn(T * kd, 93), dout = randn(T * qd, 94);
    const Vec qs(q.begin(), q.end()), ks(kk.begin(), kk.end()), vs(vv.begin(), vv.end()), ds(dout.begin(), dout.end());
    float *qp = c.dev.upload(q), *kp = c.dev.upload(kk), *vp = c.dev.upload(vv), *dop = c.dev.upload(dout);
    const void* sp = c.weight(sink_h);
    float* out = c.dev.alloc<float>(T * qd);
    float* lse = c.dev.alloc<float>(Hq * T);
    float* dq = c.dev.alloc<float>(T * qd);
    float* dk = c.dev.alloc<float>(T * kd);
    float* dv = c.dev.alloc<float>(T * kd);
    float* dsink = c.dev.upload(std::vector<float>(Hq, 0.0f));
    for (int t = 2; t >= 0; --t) {
      const i64 a = cuts[t], e = cuts[t + 1];
      AttnShape s;
      s.batch = 1, s.seq = e, s.q_heads = Hq, s.kv_heads = Hkv, s.head_dim = hd;
      s.q_stride = qd, s.kv_stride = kd, s.o_stride = qd, s.q_start = a, s.window = window;
      s.add_kv_grads = t != 2;
      c.v.op = "attention_forward";
      c.ops.attention_forward(qp + a * qd, kp, vp, sp, out + a * qd, lse + Hq * a, s);
      c.v.op = "attention_backward";
      c.ops.attention_backward(qp + a * qd, kp, vp, sp, out + a * qd, lse + Hq * a, dop + a * qd, dq + a * qd, dk, dv,
                               dsink, s);
    }
    Vec outr(T * qd), dqr(T * qd, 0.0), dkr(T * kd, 0.0), dvr(T * kd, 0.0), dsr(Hq, 0.0);
    ref::attention(qs.data(), ks.data(), vs.data(), outr.data(), 1, T, Hq, Hkv, hd, qd, kd, qd, 0, window,
                   sinks.data());
    ref::attention_backward(qs.data(), ks.data(), vs.data(), ds.data(), dqr.data(), dkr.data(), dvr.data(), 1, T, Hq,
                            Hkv, hd, qd, kd, qd, 0, window, sinks.data(), dsr.data());
    c.v.op = "attention_forward";
    c.v.close("out " + tag, c.get(out, outr.size()), outr, 2e-5);
    c.v.op = "attention_backward";
    c.v.close("dq " + tag, c.get(dq, dqr.size()), dqr, 2e-5);
    c.v.close("dk " + tag, c.get(dk, dkr.size()), dkr, 2e-5);
    c.v.close("dv " + tag, c.get(dv, dvr.size()), dvr, 2e-5);
    c.v.close("dsinks " + tag, c.get(dsink, Hq), dsr, 2e-5);
    c.dev.reset();
  }
}

// ---- documents (data.packing = documents): positions restart at each document ----
// positions[b * T + t] from each row's document lengths (summing to T): 0 at a document's first token.
std::vector<std::int32_t> doc_positions(const std::vector<std::vector<i64>>& rows) {
  std::vector<std::int32_t> p;
  for (const auto& lengths : rows)
    for (const i64 n : lengths)
      for (i64 i = 0; i < n; ++i) p.push_back(static_cast<std::int32_t>(i));
  return p;
}

// Attention with documents (AttnShape::positions), against the fp64 reference given the same positions:
// several documents a row (boundaries inside and on key blocks, a one-token document), alone and with a
// sliding window and sinks, whole and as sequence tiles in reverse order with dk, dv, d(sinks) accumulating.
void attention_document_cases(Ctx& c) {
  const i64 Hq = 4, Hkv = 2, hd = 64, qd = Hq * hd, kd = Hkv * hd, B = 2, T = 300;
  // row 0: the window starts inside a document cut before it (its piece starts at 0 like any other);
  // row 1: a boundary on a key block (128), a one-token document, a long last one.
  const auto pos = doc_positions({{40, 1, 150, 109}, {128, 1, 71, 100}});
  const Vec pos_d(pos.begin(), pos.end());
  const auto sink_h = randn(Hq, 80, 2.0);
  const Vec sinks = c.seen_weight(sink_h);
  auto q = randn(B * T * qd, 101), kk = randn(B * T * kd, 102), vv = randn(B * T * kd, 103),
       dout = randn(B * T * qd, 104);
  const Vec qs(q.begin(), q.end()), ks(kk.begin(), kk.end()), vs(vv.begin(), vv.end()), ds(dout.begin(), dout.end());
  struct Case {
    i64 window;
    bool sinks;
  };
  for (const Case k : {Case{0, false}, Case{45, true}, Case{100, false}}) {
    const std::string tag =
        "B 2, T 300, documents" + (k.window ? ", window " + std::to_string(k.window) : "") + (k.sinks ? ", sinks" : "");
    AttnShape s;
    s.batch = B, s.seq = T, s.q_heads = Hq, s.kv_heads = Hkv, s.head_dim = hd;
    s.q_stride = qd, s.kv_stride = kd, s.o_stride = qd, s.window = k.window;
    s.positions = c.dev.upload(pos);
    float *qp = c.dev.upload(q), *kp = c.dev.upload(kk), *vp = c.dev.upload(vv), *dop = c.dev.upload(dout);
    const void* sp = k.sinks ? c.weight(sink_h) : nullptr;
    const double* sr = k.sinks ? sinks.data() : nullptr;
    float* out = c.dev.alloc<float>(B * T * qd);
    float* lse = c.dev.alloc<float>(B * Hq * T);
    c.v.op = "attention_forward";
    c.ops.attention_forward(qp, kp, vp, sp, out, lse, s);
    Vec outr(B * T * qd);
    ref::attention(qs.data(), ks.data(), vs.data(), outr.data(), B, T, Hq, Hkv, hd, qd, kd, qd, 0, k.window, sr,
                   pos.data());
    c.v.close("out " + tag, c.get(out, outr.size()), outr, 2e-5);
    float* dq = c.dev.alloc<float>(B * T * qd);
    float* dk = c.dev.alloc<float>(B * T * kd);
    float* dv = c.dev.alloc<float>(B * T * kd);
    float* dsink = k.sinks ? c.dev.upload(std::vector<float>(Hq, 0.25f)) : nullptr;
    c.v.op = "attention_backward";
    c.ops.attention_backward(qp, kp, vp, sp, out, lse, dop, dq, dk, dv, dsink, s);
    Vec dqr(B * T * qd, 0.0), dkr(B * T * kd, 0.0), dvr(B * T * kd, 0.0), dsr(Hq, 0.25);
    ref::attention_backward(qs.data(), ks.data(), vs.data(), ds.data(), dqr.data(), dkr.data(), dvr.data(), B, T, Hq,
                            Hkv, hd, qd, kd, qd, 0, k.window, sr, k.sinks ? dsr.data() : nullptr, pos.data());
    c.v.close("dq " + tag, c.get(dq, dqr.size()), dqr, 2e-5);
    c.v.close("dk " + tag, c.get(dk, dkr.size()), dkr, 2e-5);
    c.v.close("dv " + tag, c.get(dv, dvr.size()), dvr, 2e-5);
    if (k.sinks) c.v.close("dsinks " + tag, c.get(dsink, Hq), dsr, 2e-5);
    c.dev.reset();
  }
  {  // row 1 as tiles [200, 300), [37, 200), [0, 37), window 45, sinks: q_start inside documents
    const i64 cuts[] = {0, 37, 200, 300};
    const std::string tag = "T 300 documents as tiles 0/37/200, window 45, sinks, accumulated";
    const std::vector<std::int32_t> pos1(pos.begin() + T, pos.end());
    const i64 o = T;  // row 1's first token
    const Vec q1(qs.begin() + o * qd, qs.end()), k1(ks.begin() + o * kd, ks.end()), v1(vs.begin() + o * kd, vs.end()),
        d1(ds.begin() + o * qd, ds.end());
    float* qp = c.dev.upload(std::vector<float>(q.begin() + o * qd, q.end()));
    float* kp = c.dev.upload(std::vector<float>(kk.begin() + o * kd, kk.end()));
    float* vp = c.dev.upload(std::vector<float>(vv.begin() + o * kd, vv.end()));
    float* dop = c.dev.upload(std::vector<float>(dout.begin() + o * qd, dout.end()));
    const std::int32_t* pp = c.dev.upload(pos1);
    const void* sp = c.weight(sink_h);
    float* out = c.dev.alloc<float>(T * qd);
    float* lse = c.dev.alloc<float>(Hq * T);
    float* dq = c.dev.alloc<float>(T * qd);
    float* dk = c.dev.alloc<float>(T * kd);
    float* dv = c.dev.alloc<float>(T * kd);
    float* dsink = c.dev.upload(std::vector<float>(Hq, 0.0f));
    for (int t = 2; t >= 0; --t) {
      const i64 a = cuts[t], e = cuts[t + 1];
      AttnShape s;
      s.batch = 1, s.seq = e, s.q_heads = Hq, s.kv_heads = Hkv, s.head_dim = hd;
      s.q_stride = qd, s.kv_stride = kd, s.o_stride = qd, s.q_start = a, s.window = 45, s.positions = pp;
      s.add_kv_grads = t != 2;
      c.v.op = "attention_forward";
      c.ops.attention_forward(qp + a * qd, kp, vp, sp, out + a * qd, lse + Hq * a, s);
      c.v.op = "attention_backward";
      c.ops.attention_backward(qp + a * qd, kp, vp, sp, out + a * qd, lse + Hq * a, dop + a * qd, dq + a * qd, dk, dv,
                               dsink, s);
    }
    Vec outr(T * qd), dqr(T * qd, 0.0), dkr(T * kd, 0.0), dvr(T * kd, 0.0), dsr(Hq, 0.0);
    ref::attention(q1.data(), k1.data(), v1.data(), outr.data(), 1, T, Hq, Hkv, hd, qd, kd, qd, 0, 45, sinks.data(),
                   pos1.data());
    ref::attention_backward(q1.data(), k1.data(), v1.data(), d1.data(), dqr.data(), dkr.data(), dvr.data(), 1, T, Hq,
                            Hkv, hd, qd, kd, qd, 0, 45, sinks.data(), dsr.data(), pos1.data());
    c.v.op = "attention_forward";
    c.v.close("out " + tag, c.get(out, outr.size()), outr, 2e-5);
    c.v.op = "attention_backward";
    c.v.close("dq " + tag, c.get(dq, dqr.size()), dqr, 2e-5);
    c.v.close("dk " + tag, c.get(dk, dkr.size()), dkr, 2e-5);
    c.v.close("dv " + tag, c.get(dv, dvr.size()), dvr, 2e-5);
    c.v.close("dsinks " + tag, c.get(dsink, Hq), dsr, 2e-5);
    c.dev.reset();
  }
}

// RoPE and GPT-2's learned positions read the documents' positions (RopeTables::positions; the
// embedding's positions argument): each row at its own table row, the scatter adding into it.
void position_document_cases(Ctx& c, Backend& backend) {
  const i64 B = 2, T = 29, heads = 3, hd = 64, half = hd / 2, stride = heads * hd + 5, rows = B * T;
  const auto pos = doc_positions({{7, 1, 21}, {29}});
  const std::int32_t* pp = c.dev.upload(pos);
  float* cos_room = c.dev.alloc<float>(T * half);
  float* sin_room = c.dev.alloc<float>(T * half);
  c.v.op = "rope_tables";
  RopeTables t = c.ops.rope_tables(RopeParams{}, T, hd, cos_room, sin_room);
  const auto tc = c.get(t.cos, T * half), ts = c.get(t.sin, T * half);
  const Vec tcd(tc.begin(), tc.end()), tsd(ts.begin(), ts.end());
  t.positions = pp;
  auto x = randn(rows * stride, 111);
  for (bool inverse : {false, true}) {
    float* dxv = c.dev.upload(x);
    c.v.op = "rope_apply";
    c.ops.rope_apply(dxv, rows, T, heads, hd, stride, t, inverse);
    Vec xr(x.begin(), x.end());
    ref::rope(xr.data(), rows, T, heads, hd, stride, tcd.data(), tsd.data(), inverse, pos.data());
    c.v.close(std::string(inverse ? "inverse " : "") + "documents 7/1/21 and 29, rows at their positions",
              c.get(dxv, xr.size()), xr, 2e-6);
  }
  const i64 d = 72, V = 50;
  auto wte = randn(V * d, 112), wpe = randn(T * d, 113), dx = randn(rows * d, 114), g0 = randn(V * d, 115),
       p0 = randn(T * d, 116);
  std::vector<token_t> ids(rows);
  for (i64 r = 0; r < rows; ++r) ids[r] = static_cast<token_t>((r * 7 + r / 5) % 11);
  const token_t* tokens = backend.upload_tokens(ids.data(), ids.size(), 0);
  const void* dwte = c.weight(wte);
  const void* dwpe = c.weight(wpe);
  float* y = c.dev.alloc<float>(rows * d);
  c.v.op = "embedding_forward";
  c.ops.embedding_forward(dwte, dwpe, tokens, rows, T, d, y, pp);
  const Vec wts = c.seen_weight(wte), wps = c.seen_weight(wpe);
  std::vector<float> yr(rows * d);
  for (i64 r = 0; r < rows; ++r)
    for (i64 j = 0; j < d; ++j)
      yr[r * d + j] = static_cast<float>(wts[ids[r] * d + j]) + static_cast<float>(wps[pos[r] * d + j]);
  c.v.bit_equal("wte + wpe at the documents' positions", c.get(y, yr.size()), yr);
  float* gte = c.dev.upload(g0);
  float* gpe = c.dev.upload(p0);
  c.v.op = "embedding_backward";
  c.ops.embedding_backward(tokens, c.dev.upload(dx), rows, T, d, gte, gpe, pp);
  Vec pr(p0.begin(), p0.end());
  for (i64 r = 0; r < rows; ++r)
    for (i64 j = 0; j < d; ++j) pr[pos[r] * d + j] += dx[r * d + j];
  c.v.close("wpe's scatter-add at the documents' positions", c.get(gpe, p0.size()), pr, 1e-6);
  c.dev.reset();
}

// ---- activations, moves and sums ----
void elementwise_cases(Ctx& c) {
  const std::size_t n = 100003;  // not a multiple of any vector width or block
  auto a = randn(n, 51, 3.0), b = randn(n, 52), d = randn(n, 53), z0 = randn(n, 54);
  const Vec as(a.begin(), a.end()), bs(b.begin(), b.end()), ds(d.begin(), d.end());
  float* da = c.dev.upload(a);
  float* db = c.dev.upload(b);
  float* dd = c.dev.upload(d);
  float* o1 = c.dev.alloc<float>(n);
  float* o2 = c.dev.alloc<float>(n);
  const std::string tag = "n=" + std::to_string(n);
  Vec h(n), g1(n, 0.0), g2(n, 0.0);
  c.v.op = "swiglu_forward";
  c.ops.swiglu_forward(da, db, o1, n);
  ref::swiglu(as.data(), bs.data(), h.data(), i64(n));
  c.v.close(tag, c.get(o1, n), h, 2e-6);
  c.v.op = "swiglu_backward";
  c.ops.swiglu_backward(da, db, dd, o1, o2, n);
  ref::swiglu_backward(as.data(), bs.data(), ds.data(), g1.data(), g2.data(), i64(n));
  c.v.close("dg " + tag, c.get(o1, n), g1, 2e-6);
  c.v.close("du " + tag, c.get(o2, n), g2, 2e-6);
  // gpt-oss's clamped form at limit 1.5 (a has std 3, b 1: both clamps taken on both sides)
  const float alpha = 1.702f, limit = 1.5f;
  c.v.op = "clamped_swiglu_forward";
  c.ops.clamped_swiglu_forward(da, db, o1, n, alpha, limit);
  ref::clamped_swiglu(as.data(), bs.data(), h.data(), i64(n), double(alpha), double(limit));
  c.v.close(tag, c.get(o1, n), h, 2e-6);
  c.v.op = "clamped_swiglu_backward";
  std::fill(g1.begin(), g1.end(), 0.0);
  std::fill(g2.begin(), g2.end(), 0.0);
  c.ops.clamped_swiglu_backward(da, db, dd, o1, o2, n, alpha, limit);
  ref::clamped_swiglu_backward(as.data(), bs.data(), ds.data(), g1.data(), g2.data(), i64(n), double(alpha),
                               double(limit));
  c.v.close("dg " + tag, c.get(o1, n), g1, 2e-6);
  c.v.close("du " + tag, c.get(o2, n), g2, 2e-6);
  c.v.op = "gelu_forward";
  c.ops.gelu_forward(da, o1, n);
  for (std::size_t i = 0; i < n; ++i) h[i] = ref::gelu(as[i]);
  c.v.close(tag, c.get(o1, n), h, 2e-6);
  c.v.op = "gelu_backward";
  c.ops.gelu_backward(da, dd, o1, n);
  std::fill(g1.begin(), g1.end(), 0.0);
  ref::gelu_backward(as.data(), ds.data(), g1.data(), i64(n));
  c.v.close(tag, c.get(o1, n), g1, 2e-6);
  // exact ones: the host's fp32 result, bit for bit
  std::vector<float> sum = b;
  for (std::size_t i = 0; i < n; ++i) sum[i] += a[i];
  c.v.op = "add_into";
  c.ops.add_into(db, da, n);
  c.v.bit_equal("y += x " + tag, c.get(db, n), sum);
  c.v.op = "copy";
  c.ops.copy(o1, dd, n);
  c.v.bit_equal(tag, c.get(o1, n), d);
  float* dz = c.dev.upload(z0);
  c.v.op = "fill_zero";
  c.ops.fill_zero(dz, n - 3);
  std::vector<float> zr = z0;
  std::fill(zr.begin(), zr.end() - 3, 0.0f);
  c.v.bit_equal("+0 over n - 3, the last 3 kept", c.get(dz, n), zr);
  c.dev.reset();
}

// ---- mixture of experts: routing, dispatch, gather / combine, grouped products ----
void moe_cases(Ctx& c) {
  struct Shape {
    RouteShape r;
    const char* what;
  };
  for (const Shape sh : {Shape{{37, 8, 2, RouterKind::softmax_topk, true}, "Mixtral top-2 of 8"},
                         Shape{{20, 6, 3, RouterKind::softmax_topk, false}, "top-3 of 6, not renormalised (Qwen3-MoE)"},
                         Shape{{19, 16, 4, RouterKind::topk_softmax, true}, "gpt-oss: top-4 of 16, softmax over the 4"},
                         Shape{{3, 8, 1, RouterKind::softmax_topk, true}, "top-1 of 8 over 3 tokens: idle experts"}}) {
    const RouteShape& r = sh.r;
    const i64 N = r.tokens, E = r.experts, k = r.top_k, P = r.choices(), d = 24, ff = 40;
    const std::string tag = dims({{"N", N}, {"E", E}, {"k", k}}) + " " + sh.what;
    auto logits = randn(N * E, 61, 2.0), dweight = randn(P, 62);
    const Vec ls(logits.begin(), logits.end()), dws(dweight.begin(), dweight.end());
    // route
    float* dl = c.dev.upload(logits);
    auto* dexp = c.dev.alloc<std::int32_t>(P);
    float* dwt = c.dev.alloc<float>(P);
    c.v.op = "moe_route";
    c.ops.moe_route(dl, r, dexp, dwt);
    std::vector<std::int32_t> er(P);
    Vec wr(P);
    ref::moe_route(ls.data(), r, er.data(), wr.data());
    const std::vector<std::int32_t> experts = c.dev.download(dexp, P);
    const std::vector<float> weight = c.get(dwt, P);
    c.v.bit_equal("chosen experts " + tag, experts, er);
    c.v.close("weights " + tag, weight, wr, 1e-6);
    // route backward (at the backend's own choices and weights)
    float* ddw = c.dev.upload(dweight);
    float* ddl = c.dev.alloc<float>(N * E);
    c.v.op = "moe_route_backward";
    c.ops.moe_route_backward(dl, dexp, dwt, ddw, ddl, r);
    Vec dlr(N * E);
    ref::moe_route_backward(ls.data(), experts.data(), dws.data(), dlr.data(), r);
    if (k == 1 && r.renormalize) {  // one renormalised weight is always 1: its gradient is exactly 0
      const std::vector<float> got = c.get(ddl, N * E);
      c.v.fact("dlogits all +-0 (the one weight is always 1) " + tag,
               std::all_of(got.begin(), got.end(), [](float v) { return v == 0.0f; }));
    } else {
      c.v.close("dlogits " + tag, c.get(ddl, N * E), dlr, 1e-5);
    }
    // the load-balancing loss's statistics and gradient, at the backend's choices and weights: z = the
    // logits, or gpt-oss's scores (the weights scattered into zeros); p = softmax(z) per token
    {
      Vec z(N * E, 0.0), p(N * E);
      for (i64 n = 0; n < N; ++n)
        for (i64 e = 0; e < E; ++e)
          if (r.kind == RouterKind::softmax_topk) z[n * E + e] = ls[n * E + e];
      if (r.kind == RouterKind::topk_softmax)
        for (i64 q = 0; q < P; ++q) z[(q / k) * E + experts[q]] = weight[q];
      Vec sums(E, 0.0);
      for (i64 n = 0; n < N; ++n) {
        double mx = z[n * E], zs = 0;
        for (i64 e = 1; e < E; ++e) mx = std::max(mx, z[n * E + e]);
        for (i64 e = 0; e < E; ++e) zs += std::exp(z[n * E + e] - mx);
        for (i64 e = 0; e < E; ++e) sums[e] += (p[n * E + e] = std::exp(z[n * E + e] - mx) / zs);
      }
      std::vector<float> got(E, -1.0f);
      c.v.op = "moe_balance_stats";
      c.ops.moe_balance_stats(dl, dexp, dwt, r, got.data());
      c.v.close("probability sums " + tag, got, sums, 1e-5);
      auto g = randn(E, 63);
      const Vec gs(g.begin(), g.end());
      float* dg = c.dev.upload(g);
      auto base_l = randn(N * E, 64), base_w = randn(P, 65);  // added into
      float* bl = c.dev.upload(base_l);
      float* bw = c.dev.upload(base_w);
      Vec want_l(base_l.begin(), base_l.end()), want_w(base_w.begin(), base_w.end());
      for (i64 n = 0; n < N; ++n) {
        double t = 0;
        for (i64 e = 0; e < E; ++e) t += p[n * E + e] * gs[e];
        if (r.kind == RouterKind::softmax_topk)
          for (i64 e = 0; e < E; ++e) want_l[n * E + e] += p[n * E + e] * (gs[e] - t);
        else
          for (i64 j = 0; j < k; ++j) {
            const i64 e = experts[n * k + j];
            want_w[n * k + j] += p[n * E + e] * (gs[e] - t);
          }
      }
      c.v.op = "moe_balance_backward";
      const bool by_logits = r.kind == RouterKind::softmax_topk;
      c.ops.moe_balance_backward(dl, dexp, dwt, dg, r, by_logits ? bl : nullptr, by_logits ? nullptr : bw);
      if (by_logits)
        c.v.close("dlogits added " + tag, c.get(bl, N * E), want_l, 1e-5);
      else
        c.v.close("dweight added " + tag, c.get(bw, P), want_w, 1e-5);
    }
    // dispatch: a stable counting sort of the slots by expert
    std::vector<std::int64_t> off_ref(E + 1, 0), offsets(E + 1, -1);
    for (i64 q = 0; q < P; ++q) ++off_ref[experts[q] + 1];
    for (i64 e = 0; e < E; ++e) off_ref[e + 1] += off_ref[e];
    std::vector<std::int32_t> order_ref(P), pos_ref(P);
    std::vector<std::int64_t> next(off_ref.begin(), off_ref.end() - 1);
    for (i64 q = 0; q < P; ++q) {
      const i64 p = next[experts[q]]++;
      order_ref[p] = static_cast<std::int32_t>(q);
      pos_ref[q] = static_cast<std::int32_t>(p);
    }
    auto* dorder = c.dev.alloc<std::int32_t>(P);
    auto* dpos = c.dev.alloc<std::int32_t>(P);
    c.v.op = "moe_dispatch";
    c.ops.moe_dispatch(dexp, r, dorder, dpos, offsets.data());
    c.v.bit_equal("offsets on the host " + tag, offsets, off_ref);
    c.v.bit_equal("order " + tag, c.dev.download(dorder, P), order_ref);
    c.v.bit_equal("slot rows " + tag, c.dev.download(dpos, P), pos_ref);
    // gather and its backward: exact (copies; sums of k rows in j order)
    auto x = randn(N * d, 63), dxe = randn(P * d, 64), dx0 = randn(N * d, 65);
    float* dxx = c.dev.upload(x);
    float* dxe_d = c.dev.alloc<float>(P * d);
    c.v.op = "moe_gather";
    c.ops.moe_gather(dxx, dorder, r, d, dxe_d);
    std::vector<float> xe_ref(P * d);
    for (i64 p = 0; p < P; ++p)
      for (i64 i = 0; i < d; ++i) xe_ref[p * d + i] = x[(order_ref[p] / k) * d + i];
    c.v.bit_equal("rows by expert " + tag, c.get(dxe_d, P * d), xe_ref);
    float* dgrad = c.dev.upload(dxe);
    for (bool add : {false, true}) {
      float* ddx = c.dev.upload(dx0);
      c.v.op = "moe_gather_backward";
      c.ops.moe_gather_backward(dgrad, dpos, r, d, ddx, add);
      std::vector<float> want = dx0;
      for (i64 n = 0; n < N; ++n)
        for (i64 j = 0; j < k; ++j)
          for (i64 i = 0; i < d; ++i) {
            const float g = dxe[pos_ref[n * k + j] * d + i];
            float& w = want[n * d + i];
            w = (j == 0 && !add) ? g : w + g;
          }
      c.v.bit_equal(std::string("dx (") + (add ? "+=" : "=") + ") " + tag, c.get(ddx, N * d), want);
    }
    // combine and its backward
    auto ye = randn(P * d, 66), dy = randn(N * d, 67);
    float* dye_in = c.dev.upload(ye);
    float* dy_d = c.dev.upload(dy);
    float* y = c.dev.alloc<float>(N * d);
    c.v.op = "moe_combine";
    c.ops.moe_combine(dye_in, dpos, dwt, r, d, y);
    Vec yr(N * d, 0.0), dyer(P * d, 0.0), dwr(P, 0.0);
    for (i64 n = 0; n < N; ++n)
      for (i64 j = 0; j < k; ++j)
        for (i64 i = 0; i < d; ++i) {
          const i64 p = pos_ref[n * k + j];
          yr[n * d + i] += double(weight[n * k + j]) * ye[p * d + i];
          dyer[p * d + i] = double(weight[n * k + j]) * dy[n * d + i];
          dwr[n * k + j] += double(dy[n * d + i]) * ye[p * d + i];
        }
    c.v.close("y " + tag, c.get(y, N * d), yr, 1e-6);
    float* ddye = c.dev.alloc<float>(P * d);
    float* ddwt = c.dev.alloc<float>(P);
    c.v.op = "moe_combine_backward";
    c.ops.moe_combine_backward(dy_d, dye_in, dpos, dwt, r, d, ddye, ddwt);
    c.v.close("dye " + tag, c.get(ddye, P * d), dyer, 1e-6);
    c.v.close("dweight " + tag, c.get(ddwt, P), dwr, 1e-5);
    // grouped products over the experts' rows: strided experts (padding between them), a bias each
    const i64 ws = ff * d + 16, bstride = ff + 3;
    auto W = randn(E * ws, 68, 0.1), b = randn(E * bstride, 69), gy = randn(P * ff, 70);
    auto dW0 = randn(E * ws, 71), db0 = randn(E * bstride, 72), gx0 = randn(P * d, 73);
    c.operand_room();
    const void* dW = c.weight(W);
    const void* dbias = c.weight(b);
    float* out = c.dev.alloc<float>(P * ff);
    c.v.op = "grouped_linear_forward";
    c.ops.grouped_linear_forward(dxe_d, dW, ws, dbias, bstride, out, offsets.data(), E, d, ff);
    const Vec xes = c.seen_operand(xe_ref), Ws = c.seen_weight(W), bs = c.seen_weight(b), gys = c.seen_operand(gy);
    Vec outr(P * ff, 0.0), gxr(gx0.begin(), gx0.end()), dWr(dW0.begin(), dW0.end()), dbr(db0.begin(), db0.end());
    for (i64 e = 0; e < E; ++e) {
      const i64 r0 = off_ref[e], rows = off_ref[e + 1] - r0;
      if (rows == 0) continue;
      ref::linear(xes.data() + r0 * d, Ws.data() + e * ws, bs.data() + e * bstride, outr.data() + r0 * ff, rows, d, ff);
      for (i64 q = 0; q < rows * d; ++q) gxr[r0 * d + q] = 0.0;  // dx overwritten (add = false)
      Vec dbz(ff, 0.0);
      ref::linear_backward(xes.data() + r0 * d, Ws.data() + e * ws, gys.data() + r0 * ff, gxr.data() + r0 * d,
                           dWr.data() + e * ws, dbz.data(), rows, d, ff);
      for (i64 q = 0; q < rows; ++q)
        for (i64 o = 0; o < ff; ++o) dbr[e * bstride + o] += gy[(r0 + q) * ff + o];  // bias from the fp32 dy
    }
    c.v.close("y by expert " + tag, c.get(out, P * ff), outr, 1e-5);
    float* dgy = c.dev.upload(gy);
    float* dgx = c.dev.upload(gx0);
    float* dWacc = c.dev.upload(dW0);
    float* dbacc = c.dev.upload(db0);
    c.v.op = "grouped_linear_backward";
    c.ops.grouped_linear_backward(dgy, dxe_d, dW, ws, dgx, false, dWacc, dbacc, bstride, offsets.data(), E, d, ff);
    c.v.close("dx by expert " + tag, c.get(dgx, P * d), gxr, 1e-5);
    c.v.close("dW (+=), idle experts untouched " + tag, c.get(dWacc, E * ws), dWr, 1e-5);
    c.v.close("db (+=) " + tag, c.get(dbacc, E * bstride), dbr, 1e-5);
    c.dev.reset();
  }
}

// ---- embedding ----
void embedding_cases(Ctx& c, Backend& backend) {
  for (const bool positions : {false, true}) {
    const i64 B = 3, T = 29, d = 72, V = 50;
    const i64 N = B * T;
    const std::string tag = dims({{"B", B}, {"T", T}, {"d", d}, {"V", V}}) + (positions ? " + wpe (GPT-2)" : "");
    auto wte = randn(V * d, 61), wpe = randn(T * d, 62), dx = randn(N * d, 63), g0 = randn(V * d, 64),
         p0 = randn(T * d, 65);
    std::vector<token_t> ids(N);
    for (i64 r = 0; r < N; ++r) ids[r] = static_cast<token_t>((r * 7 + r / 5) % 11);  // many repeats: order matters
    ids[3] = V - 1;
    const token_t* tokens = backend.upload_tokens(ids.data(), ids.size(), 0);
    const void* dwte = c.weight(wte);
    const void* dwpe = positions ? c.weight(wpe) : nullptr;
    float* y = c.dev.alloc<float>(N * d);
    c.v.op = "embedding_forward";
    c.ops.embedding_forward(dwte, dwpe, tokens, N, T, d, y);
    const Vec wts = c.seen_weight(wte), wps = c.seen_weight(wpe);
    std::vector<float> yr(N * d);
    for (i64 r = 0; r < N; ++r)
      for (i64 j = 0; j < d; ++j)
        yr[r * d + j] = positions ? static_cast<float>(wts[ids[r] * d + j]) + static_cast<float>(wps[(r % T) * d + j])
                                  : static_cast<float>(wts[ids[r] * d + j]);
    c.v.bit_equal(tag, c.get(y, yr.size()), yr);
    float* ddx = c.dev.upload(dx);
    std::vector<std::vector<float>> runs;
    for (int run = 0; run < 2; ++run) {
      float* gte = c.dev.upload(g0);
      float* gpe = positions ? c.dev.upload(p0) : nullptr;
      c.v.op = "embedding_backward";
      c.ops.embedding_backward(tokens, ddx, N, T, d, gte, gpe);
      auto got = c.get(gte, g0.size());
      if (positions) {
        const auto gp = c.get(gpe, p0.size());
        got.insert(got.end(), gp.begin(), gp.end());
      }
      runs.push_back(got);
    }
    Vec gr(g0.begin(), g0.end()), pr(p0.begin(), p0.end());
    for (i64 r = 0; r < N; ++r)
      for (i64 j = 0; j < d; ++j) {
        gr[ids[r] * d + j] += dx[r * d + j];
        if (positions) pr[(r % T) * d + j] += dx[r * d + j];
      }
    if (positions) gr.insert(gr.end(), pr.begin(), pr.end());
    c.v.close("scatter-add " + tag, runs[0], gr, 1e-6);
    c.v.bit_equal("scatter-add twice, same bits " + tag, runs[0], runs[1]);
    c.dev.reset();
  }
}

// ---- the loss ----
void loss_cases(Ctx& c, Backend& backend) {
  for (const bool grad : {true, false}) {
    const i64 rows = 37, V = 1003;
    const std::string tag = dims({{"rows", rows}, {"V", V}}) + (grad ? " with gradient" : " loss only");
    auto logits = randn(rows * V, 71, 4.0);
    std::vector<token_t> targets(rows);
    for (i64 r = 0; r < rows; ++r) targets[r] = static_cast<token_t>((r * 131) % V);
    targets[4] = targets[20] = kIgnoreIndex;
    const token_t* dt = backend.upload_tokens(targets.data(), targets.size(), 1);
    float* dl = c.dev.upload(logits);
    float* row_loss = c.dev.alloc<float>(rows);
    c.v.op = "cross_entropy_rows";
    c.ops.cross_entropy_rows(dl, dt, row_loss, rows, V, grad);
    const Vec ls(logits.begin(), logits.end());
    Vec lr(rows, 0.0), dr(rows * V, 0.0);
    for (i64 r = 0; r < rows; ++r) {
      if (targets[r] == kIgnoreIndex) continue;
      Vec one(ls.begin() + r * V, ls.begin() + (r + 1) * V), dlog(V);
      lr[r] = ref::cross_entropy(one.data(), &targets[r], dlog.data(), 1, V);
      std::copy(dlog.begin(), dlog.end(), dr.begin() + r * V);
    }
    const auto rl = c.get(row_loss, rows);
    c.v.close("row losses " + tag, rl, lr, 1e-5);
    if (grad)
      c.v.close("d(loss)/d(logits) in place " + tag, c.get(dl, dr.size()), dr, 1e-5);
    else
      c.v.bit_equal("logits untouched " + tag, c.get(dl, logits.size()), logits);
    c.v.op = "loss_sum";
    const LossSum sum = c.ops.loss_sum(row_loss, dt, rows);
    double expect = 0;
    i64 counted = 0;
    for (i64 r = 0; r < rows; ++r)
      if (targets[r] != kIgnoreIndex) expect += rl[r], ++counted;
    c.v.close("sum over counted rows, in row order " + tag, std::vector<double>{sum.loss_sum}, Vec{expect}, 1e-12);
    c.v.fact("counted = " + std::to_string(sum.counted) + " (expected " + std::to_string(counted) + ")",
             sum.counted == counted);
    c.dev.reset();
  }
}

// An op set without ops: each call names the missing op (what a backend lacking one reports).
struct NoOps final : Ops {
  const char* backend() const override { return "bare"; }
  Precision precision() const override { return Precision::fp32; }
};

void unsupported_case(Verdicts& v) {
  NoOps bare;
  v.op = "(seam)";
  try {
    bare.rope_apply(nullptr, 0, 1, 1, 2, 2, RopeTables{}, false);
    v.fact("an op set without rope_apply throws", false);
  } catch (const UnsupportedOp& e) {
    v.fact(std::string("a missing op is named: \"") + e.what() + "\"",
           e.op() == "rope_apply" && std::string(e.what()).find("bare") != std::string::npos);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string kind = "cpu", precision = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--backend")
      kind = argv[i + 1];
    else if (a == "--precision")
      precision = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: test_backend_ops --backend cpu|cuda --precision fp32|bf16\n");
      return 2;
    }
  }
  if (precision != "fp32" && precision != "bf16") {
    std::fprintf(stderr, "test_backend_ops: --precision must be fp32 or bf16, not '%s'\n", precision.c_str());
    return 2;
  }
  BackendOptions o;
  o.kind = kind;
  o.precision = precision == "bf16" ? Precision::bf16 : Precision::fp32;
  o.compute_threads = 2;
  std::unique_ptr<Backend> backend;
  try {
    backend = make_backend(o);
  } catch (const BackendUnavailable& e) {
    std::printf("test_backend_ops: %s: skipped\n", e.what());
    return 77;
  }
  std::printf("test_backend_ops: %s, %s ops\n", backend->describe().c_str(), precision.c_str());
  Device dev(*backend, std::size_t{256} << 20);
  Verdicts v;
  Ctx c{backend->ops(), dev, v, o.precision};
  const std::vector<std::pair<const char*, std::function<void()>>> groups = {
      {"products", [&] { linear_cases(c); }},
      {"operand rounding", [&] { operand_rounding_case(c); }},
      {"norms", [&] { norm_cases(c); }},
      {"rope", [&] { rope_cases(c); }},
      {"attention", [&] { attention_cases(c); }},
      {"attention tiles", [&] { attention_tile_cases(c); }},
      {"attention windows and sinks", [&] { attention_window_sink_cases(c); }},
      {"attention with documents", [&] { attention_document_cases(c); }},
      {"positions of documents", [&] { position_document_cases(c, *backend); }},
      {"elementwise", [&] { elementwise_cases(c); }},
      {"embedding", [&] { embedding_cases(c, *backend); }},
      {"mixture of experts", [&] { moe_cases(c); }},
      {"loss", [&] { loss_cases(c, *backend); }},
      {"seam", [&] { unsupported_case(v); }},
  };
  for (const auto& [name, run] : groups) {
    try {
      run();
    } catch (const UnsupportedOp& e) {
      v.fact(std::string("threw: ") + e.what(), false);
      dev.reset();
    } catch (const std::exception& e) {
      v.fact(std::string(name) + " threw: " + e.what(), false);
      dev.reset();
    }
  }
  for (const char* op : kOpNames) {
    const bool ok = v.ops_passed.count(op) && !v.ops_failed.count(op);
    if (!ok) {
      v.op = op;
      v.fact(v.ops_failed.count(op) ? "failed a check above" : "has no passing case in the table", false);
    }
  }
  std::printf("test_backend_ops (%s, %s): %d passed, %d failed\n", kind.c_str(), precision.c_str(), v.passed, v.failed);
  return v.failed == 0 && v.passed > 0 ? 0 : 1;
}
