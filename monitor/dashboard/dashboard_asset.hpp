// The dashboard page (HTML, JS, CSS), compiled into the binary at build time: no CAF, no Boost, no
// files read at run time. The monitor endpoint answers GET requests for these paths with them.
#pragma once
#include <optional>
#include <string_view>

namespace mt::monitor {

struct DashboardAsset {
  std::string_view body;          // the file's bytes, valid for the life of the program
  std::string_view content_type;  // e.g. "text/html; charset=utf-8"
};

// The asset for a request path: "/" is index.html; "/index.html", "/dashboard.js", "/dashboard.css" are
// the files of monitor/dashboard/. A query string ("/?stuck_after=60") is ignored. Anything
// else: std::nullopt (the server answers 404).
std::optional<DashboardAsset> dashboard_asset(std::string_view path);

}  // namespace mt::monitor
