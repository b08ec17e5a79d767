// GET /metrics: the board as Prometheus text exposition 0.0.4 (every family with HELP and TYPE),
// serialised by prometheus-cpp's TextSerializer (names, label escaping, number formatting).
#pragma once
#include <string>

#include "monitor/status_board.hpp"

namespace mt::monitor {

inline constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";
std::string metrics_text(const StatusBoard& board);

}  // namespace mt::monitor
