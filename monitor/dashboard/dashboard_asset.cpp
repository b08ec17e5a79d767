// Looks a request path up in the table embed.cmake generated from the dashboard's files.
#include "monitor/dashboard/dashboard_asset.hpp"

#include <cstring>

#include "monitor/dashboard/embedded_file.hpp"

namespace mt::monitor {

namespace {

std::string_view content_type_of(std::string_view name) {
  auto ends_with = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  if (ends_with(".html")) return "text/html; charset=utf-8";
  if (ends_with(".js")) return "text/javascript; charset=utf-8";
  if (ends_with(".css")) return "text/css; charset=utf-8";
  return "application/octet-stream";
}

}  // namespace

std::optional<DashboardAsset> dashboard_asset(std::string_view path) {
  if (const auto q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
  if (path == "/" || path.empty()) path = "/index.html";
  if (path.front() != '/') return std::nullopt;
  path.remove_prefix(1);
  for (std::size_t i = 0; i < detail::kEmbeddedFileCount; ++i) {
    const detail::EmbeddedFile& f = detail::kEmbeddedFiles[i];
    if (path == f.name)
      return DashboardAsset{std::string_view(reinterpret_cast<const char*>(f.data), f.size), content_type_of(path)};
  }
  return std::nullopt;
}

}  // namespace mt::monitor
