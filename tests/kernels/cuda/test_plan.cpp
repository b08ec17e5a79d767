// The CUDA backend's host-side arithmetic (kernels/cuda/plan.hpp), tested without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/fault_context.hpp"
#include "kernels/cuda/lru_cache.hpp"
#include "kernels/cuda/moe_plan.hpp"
#include "kernels/cuda/plan.hpp"

using namespace mt::cuda;

TEST_CASE("the arena fit check refuses what does not fit, naming the keys", "[cuda][plan]") {
  const std::size_t GiB = std::size_t{1} << 30;
  CHECK_NOTHROW(check_arena_fits(100 * GiB, 140 * GiB, 141 * GiB, 0));
  CHECK_NOTHROW(check_arena_fits(10 * GiB, 10 * GiB + kDeviceReserveBytes, 80 * GiB, 0));  // exactly the reserve left
  CHECK_THROWS_WITH(check_arena_fits(10 * GiB, 10 * GiB + kDeviceReserveBytes - 1, 80 * GiB, 3),
                    Catch::Contains("device.max_vram_gb") && Catch::Contains("GPU 3"));
  CHECK_THROWS_WITH(check_arena_fits(200 * GiB, 140 * GiB, 141 * GiB, 0), Catch::Contains("does not fit"));
  CHECK_THROWS(check_arena_fits(1, 0, 0, 0));  // no free memory at all
}

TEST_CASE("column-sum splits cover every row once, at most 128 splits", "[cuda][plan]") {
  for (std::int64_t rows : {1, 31, 32, 33, 4095, 4096, 4097, 8192, 65536, 1000003}) {
    const ColsumPlan p = colsum_plan(rows);
    INFO("rows " << rows);
    CHECK(p.splits >= 1);
    CHECK(p.splits <= kColsumMaxSplits);
    CHECK(p.rows_per_split >= 32);
    CHECK(p.splits * p.rows_per_split >= rows);       // every row in some split
    CHECK((p.splits - 1) * p.rows_per_split < rows);  // no empty split
    CHECK(colsum_scratch_floats(rows, 7) == static_cast<std::size_t>(p.splits * 7));
  }
  CHECK_THROWS(colsum_plan(0));
}

TEST_CASE("attention head-dim dispatch: fast paths for 64/80/96/128, generic otherwise", "[cuda][plan]") {
  CHECK(attention_path(64) == AttnPath::d64);
  CHECK(attention_path(80) == AttnPath::d80);
  CHECK(attention_path(96) == AttnPath::d96);
  CHECK(attention_path(128) == AttnPath::d128);
  for (std::int64_t d : {2, 4, 8, 32, 48, 112, 160, 256}) CHECK(attention_path(d) == AttnPath::generic);
  for (std::int64_t d : {0, -64, 3, 65, 258, 512}) CHECK_THROWS_WITH(attention_path(d), Catch::Contains("head_dim"));
  CHECK(std::string(attention_path_name(attention_path(128))) == "d128");
}

TEST_CASE("attention tiling: shared memory fits sm_80 / sm_90 at every supported head dim", "[cuda][plan]") {
  const std::size_t sm80_max = 163 * 1024;  // opt-in dynamic shared memory per block on sm_80 (sm_90: 227 KiB)
  for (std::int64_t d = 2; d <= kAttnMaxHeadDim; d += 2) {
    INFO("head_dim " << d);
    CHECK(attn_forward_smem(d) <= sm80_max);
    CHECK(attn_dq_smem(d) <= sm80_max);
    CHECK(attn_dkv_smem(d) <= sm80_max);
  }
  CHECK(attn_forward_smem(128) == sizeof(float) * (16 * 128 + 32 * 129 + 32 * 128));
  CHECK(kAttnRowsPerBlock == kAttnWarps * kAttnRowsPerWarp);
  CHECK(attn_row_blocks(1) == 1);
  CHECK(attn_row_blocks(16) == 1);
  CHECK(attn_row_blocks(17) == 2);
  CHECK(attn_row_blocks(8192) == 512);
}

TEST_CASE("attention shape check: q_start must leave at least one query row", "[cuda][plan]") {
  mt::AttnShape a;
  a.batch = 2, a.seq = 137, a.q_heads = 8, a.kv_heads = 2, a.head_dim = 64;
  CHECK_NOTHROW(check_attention_shape(a));
  a.q_start = 136;  // one query row, the last position
  CHECK_NOTHROW(check_attention_shape(a));
  for (std::int64_t bad : {-1, 137, 200}) {
    a.q_start = bad;
    CHECK_THROWS_WITH(check_attention_shape(a), Catch::Contains("q_start"));
  }
  a.q_start = 0, a.kv_heads = 3;
  CHECK_THROWS_WITH(check_attention_shape(a), Catch::Contains("kv heads"));
  a.kv_heads = 2, a.head_dim = 65;
  CHECK_THROWS_WITH(check_attention_shape(a), Catch::Contains("head_dim"));
}

TEST_CASE("attention sequence tiles: grids and causal bounds under q_start", "[cuda][plan]") {
  const std::int64_t R = kAttnRowsPerBlock;
  // The tile the kernels were checked by hand for: queries 100..136 of a 137-key sequence.
  mt::AttnShape a;
  a.seq = 137, a.q_start = 100;
  CHECK(a.q_rows() == 37);
  CHECK(attn_query_blocks(a) == 3);  // rows 0..15, 16..31, 32..36 (+ 11 masked rows)
  CHECK(attn_key_blocks(a) == 9);    // keys 0..143, 137..143 masked
  CHECK(attn_key_end(100, 0, 137) == 116);
  CHECK(attn_key_end(100, 16, 137) == 132);
  CHECK(attn_key_end(100, 32, 137) == 137);  // the last block's masked rows would reach 148
  CHECK(attn_first_query_row(100, 0) == 0);
  CHECK(attn_first_query_row(100, 96) == 0);
  CHECK(attn_first_query_row(100, 112) == 12);
  CHECK(attn_first_query_row(100, 128) == 28);

  // Every shape: the kernels' loops (query blocks walking key tiles of 32 from 0, key blocks walking
  // query tiles of 32 from their first row) visit each causal (query, key) pair once and read nothing past
  // q_rows() or seq; with q_start = 0 the bounds are the ones before sequence tiles.
  for (std::int64_t seq : {1, 15, 16, 17, 31, 32, 33, 100, 137, 200}) {
    for (std::int64_t q_start = 0; q_start < seq; ++q_start) {
      INFO("seq " << seq << " q_start " << q_start);
      a.seq = seq, a.q_start = q_start;
      const std::int64_t Q = a.q_rows();
      const std::int64_t qb = attn_query_blocks(a), kb = attn_key_blocks(a);
      REQUIRE(qb * R >= Q);
      REQUIRE((qb - 1) * R < Q);
      REQUIRE(kb * R >= seq);
      REQUIRE((kb - 1) * R < seq);
      std::vector<int> fwd(static_cast<std::size_t>(Q * seq), 0), dkv(fwd.size(), 0);
      for (std::int64_t r0 = 0; r0 < qb * R; r0 += R) {
        const std::int64_t k_end = attn_key_end(q_start, r0, seq);
        REQUIRE(k_end <= seq);
        REQUIRE(k_end == q_start + std::min(r0 + R, Q));  // one past the block's last real row: no idle tile
        if (q_start == 0) REQUIRE(k_end == std::min(seq, r0 + R));
        for (std::int64_t k0 = 0; k0 < k_end; k0 += kAttnTile)
          for (std::int64_t i = r0; i < std::min(r0 + R, Q); ++i) {
            const std::int64_t pos = q_start + i;
            if (k0 > pos) continue;
            for (std::int64_t j = k0; j < std::min(k0 + kAttnTile, pos + 1); ++j) ++fwd[i * seq + j];
          }
      }
      for (std::int64_t k0 = 0; k0 < kb * R; k0 += R) {
        const std::int64_t first = attn_first_query_row(q_start, k0);
        if (q_start == 0) REQUIRE(first == k0);
        if (k0 >= seq) continue;
        REQUIRE(first < Q);
        if (first > 0) REQUIRE(q_start + first - 1 < k0);  // the skipped rows see none of the block's keys
        for (std::int64_t q0 = first; q0 < Q; q0 += kAttnTile)
          for (std::int64_t i = q0; i < std::min(q0 + kAttnTile, Q); ++i)
            for (std::int64_t j = k0; j < std::min(k0 + R, seq); ++j)
              if (q_start + i >= j) ++dkv[i * seq + j];
      }
      std::int64_t wrong = 0;  // pairs visited other than once when causal, never otherwise
      for (std::int64_t i = 0; i < Q; ++i)
        for (std::int64_t j = 0; j < seq; ++j) {
          const int want = j <= q_start + i ? 1 : 0;
          wrong += (fwd[i * seq + j] != want) + (dkv[i * seq + j] != want);
        }
      REQUIRE(wrong == 0);
    }
  }
}

TEST_CASE("a CUDA failure names the stage, layer, step, op and last kernel", "[cuda][plan]") {
  FaultContext c;
  CHECK(describe_fault(c).empty());  // nothing known: the call alone says it
  c.op = "rope_apply";
  CHECK(describe_fault(c) == " (op rope_apply)");  // an op called directly (the op test)
  c.kernel = "rope_kernel";
  CHECK(describe_fault(c) == " (op rope_apply, last kernel rope_kernel)");
  c = FaultContext{};
  c.stage = "layer_backward", c.layer = 3, c.step = 12, c.micro_batch = 1, c.device = 0;
  CHECK(describe_fault(c) == " (in layer_backward of layer 3, step 12, micro-batch 1, on GPU 0)");
  c.op = "attention_backward", c.kernel = "attn_dq_kernel";
  CHECK(describe_fault(c) ==
        " (in layer_backward of layer 3, step 12, micro-batch 1, on GPU 0; op attention_backward, last kernel "
        "attn_dq_kernel)");
  FaultContext head;
  head.stage = "head_forward_backward", head.step = 0, head.kernel = "cublasLtMatmul";
  CHECK(describe_fault(head) == " (in head_forward_backward, step 0; last kernel cublasLtMatmul)");
  // per thread; an op starts its kernel part afresh
  fault_context() = c;
  note_op("linear_forward");
  CHECK(fault_context().op == std::string("linear_forward"));
  CHECK(fault_context().kernel == nullptr);
  note_kernel("to_bf16_kernel");
  std::thread([] { CHECK(fault_context().stage == nullptr); }).join();
  CHECK(describe_fault(fault_context()).find("op linear_forward, last kernel to_bf16_kernel") != std::string::npos);
  fault_context() = FaultContext{};
}

// The three dispatch launches run serially here (every block, every expert thread, in any order: each
// output has one owner) and must give the CPU's grouping, bit for bit.
TEST_CASE("the multi-block MoE dispatch groups the choices as the CPU does", "[cuda][plan][moe]") {
  std::mt19937 rng(7);
  for (const auto& [P, E] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {0, 8}, {1, 4}, {1023, 8}, {1024, 8}, {1025, 3}, {5000, 128}, {3 * 1024 + 17, 1500}}) {
    std::vector<std::int32_t> expert(static_cast<std::size_t>(P));
    for (auto& e : expert) e = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(E));
    if (P > 100) std::fill(expert.begin() + 10, expert.begin() + 90, 1);  // a popular expert
    const std::int64_t chunks = dispatch_chunks(P);
    std::vector<std::int64_t> scratch(dispatch_scratch_bytes(P, E) / sizeof(std::int64_t), -1);
    std::int64_t* offsets = scratch.data();
    std::int64_t* counts = offsets + E + 1;
    const auto chunk = [&](std::int64_t c) {
      return std::pair{expert.data() + c * kDispatchChunk, std::min(kDispatchChunk, P - c * kDispatchChunk)};
    };
    for (std::int64_t c = chunks - 1; c >= 0; --c)  // blocks in any order
      for (std::int64_t e = 0; e < E; ++e) counts[c * E + e] = dispatch_count(chunk(c).first, chunk(c).second, e);
    for (std::int64_t e = E - 1; e >= 0; --e) offsets[e + 1] = dispatch_column_prefix(counts, chunks, E, e);
    dispatch_offsets(offsets, E);
    for (std::int64_t e = 0; e < E; ++e)
      for (std::int64_t c = 0; c < chunks; ++c) counts[c * E + e] += offsets[e];
    std::vector<std::int32_t> order(expert.size(), -1), slot_pos(expert.size(), -1);
    for (std::int64_t c = chunks - 1; c >= 0; --c)
      for (std::int64_t e = E - 1; e >= 0; --e)
        dispatch_place(chunk(c).first, chunk(c).second, c * kDispatchChunk, e, counts[c * E + e], order.data(),
                       slot_pos.data());
    mt::RouteShape s;
    s.tokens = P, s.top_k = 1, s.experts = E;
    std::vector<std::int32_t> order_ref(expert.size()), pos_ref(expert.size());
    std::vector<std::int64_t> off_ref(static_cast<std::size_t>(E + 1));
    mt::cpu::moe_dispatch(expert.data(), s, order_ref.data(), pos_ref.data(), off_ref.data());
    INFO("P " << P << " E " << E);
    CHECK(std::vector<std::int64_t>(offsets, offsets + E + 1) == off_ref);
    CHECK(order == order_ref);
    CHECK(slot_pos == pos_ref);
  }
  CHECK(dispatch_scratch_bytes(0, 8) == 9 * sizeof(std::int64_t));
  CHECK(dispatch_scratch_bytes(2049, 8) == (9 + 3 * 8) * sizeof(std::int64_t));
}

TEST_CASE("the plan cache keeps at most its capacity, dropping the least recently used", "[cuda][plan]") {
  CHECK_THROWS(LruCache<int, int>(0));
  LruCache<int, std::shared_ptr<int>> cache(3);
  std::weak_ptr<int> first;
  for (int k = 0; k < 3; ++k) {
    auto v = std::make_shared<int>(10 * k);
    if (k == 0) first = v;
    cache.insert(k, std::move(v));
  }
  REQUIRE(cache.find(0) != nullptr);  // 0 is now the most recently used: 1 goes first
  cache.insert(3, std::make_shared<int>(30));
  CHECK(cache.size() == 3);
  CHECK(cache.find(1) == nullptr);
  CHECK(**cache.find(0) == 0);
  CHECK(cache.evictions() == 1);
  // A shape per expert per step (a mixture of experts): the cache stays bounded, the values released.
  for (int k = 100; k < 5100; ++k) {
    if (!cache.find(k % 1000 + 100)) cache.insert(k % 1000 + 100, std::make_shared<int>(k));
    CHECK(cache.size() <= 3);
  }
  CHECK(first.expired());  // an entry dropped releases what it held
  std::size_t seen = 0;
  cache.for_each([&](int, const std::shared_ptr<int>&) { ++seen; });
  CHECK(seen == 3);
  cache.clear();
  CHECK(cache.size() == 0);
}
