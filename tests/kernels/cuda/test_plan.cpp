// The CUDA backend's host-side arithmetic (kernels/cuda/plan.hpp), tested without a GPU.
#include <catch2/catch.hpp>

#include "kernels/cuda/plan.hpp"

using namespace mt::cuda;

TEST_CASE("the arena fit check refuses what does not fit, naming the keys", "[cuda][plan]") {
  const std::size_t GiB = std::size_t{1} << 30;
  CHECK_NOTHROW(check_arena_fits(100 * GiB, 140 * GiB, 141 * GiB, 0));
  CHECK_NOTHROW(check_arena_fits(10 * GiB, 10 * GiB + kDeviceReserveBytes, 80 * GiB, 0));  // exactly the reserve left
  CHECK_THROWS_WITH(
      check_arena_fits(10 * GiB, 10 * GiB + kDeviceReserveBytes - 1, 80 * GiB, 3),
      Catch::Contains("device.max_vram_gb") && Catch::Contains("GPU 3") && Catch::Contains("device.device_memory_mb"));
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
