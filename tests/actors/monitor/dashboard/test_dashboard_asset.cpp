// The dashboard compiled into the binary: every file of monitor/dashboard/ is served byte for
// byte as it is in the source tree (the oracle: the file itself, read at test time), with its content
// type; "/" is the page; query strings are ignored; nothing else is an asset.
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>

#include "monitor/dashboard/dashboard_asset.hpp"

namespace {

std::string source_file(const std::string& name) {
  std::ifstream in(std::string(MEGATRAIN_SOURCE_DIR) + "/monitor/dashboard/" + name, std::ios::binary);
  REQUIRE(in);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("dashboard assets are the source files, byte for byte", "[monitor][dashboard]") {
  const struct {
    const char* path;
    const char* file;
    const char* type;
  } cases[] = {{"/", "index.html", "text/html; charset=utf-8"},
               {"/index.html", "index.html", "text/html; charset=utf-8"},
               {"/dashboard.js", "dashboard.js", "text/javascript; charset=utf-8"},
               {"/dashboard.css", "dashboard.css", "text/css; charset=utf-8"}};
  for (const auto& c : cases) {
    INFO(c.path);
    const auto asset = mt::monitor::dashboard_asset(c.path);
    REQUIRE(asset);
    CHECK(asset->content_type == c.type);
    CHECK(std::string(asset->body) == source_file(c.file));
  }
  // The page loads exactly the assets that exist (relative URLs, so it works behind a path prefix).
  const std::string page(mt::monitor::dashboard_asset("/")->body);
  CHECK_THAT(page, Catch::Contains("src=\"dashboard.js\""));
  CHECK_THAT(page, Catch::Contains("href=\"dashboard.css\""));
}

TEST_CASE("dashboard assets: query strings are ignored, unknown paths are not assets", "[monitor][dashboard]") {
  CHECK(mt::monitor::dashboard_asset("/?stuck_after=60"));
  CHECK(mt::monitor::dashboard_asset("/dashboard.js?v=2"));
  for (const char* path : {"/nope.js", "/status", "/../dashboard.js", "dashboard.js", "/dashboard.js/", "/embed.cmake",
                           "/CMakeLists.txt", "//dashboard.js"}) {
    INFO(path);
    CHECK_FALSE(mt::monitor::dashboard_asset(path));
  }
}
