// Software prefetches spread over the work that runs before the rows are needed. The attention reads, a
// group of query blocks after another, each row's head slice: a few cache lines of a longer row, which
// no hardware stream picks up. Asked for at once at a group's start, the next group's thousands of lines
// overflowed the core's miss buffers and most were dropped; queued here and issued a few lines per
// register block of the group's products (bf16_pair_gemm's `fetch`), they arrive while the products run.
#pragma once
#include <cstdint>
#include <limits>

namespace mt::cpu {

class RowFetch {
 public:
  // Rows [0, rows) of a slice of `cols` floats, `stride` floats apart, queued after those before.
  void add(const float* x, std::int64_t stride, std::int64_t rows, std::int64_t cols) {
    if (rows <= 0 || cols <= 0 || n_ == kMaxRanges) return;  // a hint: a range past the last is not fetched
    ranges_[n_++] = {x, stride, rows, cols};
    queued_ += rows * ((cols + 15) / 16);
  }
  // The next `lines` cache lines of the queue (fewer when it runs out).
  void issue(std::int64_t lines) {
    for (; lines > 0 && at_ < n_; --lines, --queued_) {
      const Range& r = ranges_[at_];
      const float* line = r.x + row_ * r.stride + col_;
      __builtin_prefetch(line, 0, 3);
      if ((col_ += 16) < r.cols) continue;
      col_ = 0;
      if (++row_ < r.rows) continue;
      row_ = 0, ++at_;
    }
  }
  // At the next group's start: what is still queued is needed now.
  void restart() {
    issue(std::numeric_limits<std::int64_t>::max());
    clear();
  }
  // At a task's end: what is still queued is for rows read already.
  void clear() { n_ = at_ = 0, row_ = col_ = queued_ = 0; }
  std::int64_t queued() const { return queued_; }  // lines not issued yet

 private:
  static constexpr int kMaxRanges = 8;
  struct Range {
    const float* x;
    std::int64_t stride, rows, cols;
  };
  Range ranges_[kMaxRanges] = {};
  int n_ = 0, at_ = 0;
  std::int64_t row_ = 0, col_ = 0, queued_ = 0;
};

}  // namespace mt::cpu
