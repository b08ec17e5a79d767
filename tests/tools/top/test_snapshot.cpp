// megatrain-top's text (tools/top/snapshot.hpp) of a job of several ranks: every rank's step, busiest
// actor and last collective; a rank behind the others and a long wait are named. Quick: no node runs.
#include <catch2/catch.hpp>
#include <string>

#include <nlohmann/json.hpp>

#include "tools/top/snapshot.hpp"

namespace {

std::string render(const nlohmann::json& ranks) {
  mt::monitor_client::SnapshotInput in;
  in.status = {{"state", "running"}, {"step", 12}, {"ranks", ranks}};
  in.stuck_after_s = 30;
  std::string text;
  for (const auto& line : mt::monitor_client::render_snapshot(in)) text += line + "\n";
  return text;
}

nlohmann::json transfer(int peer, bool done, double seconds) {
  return {{"channel", "grads"}, {"peer", peer}, {"what", "the gradients of stage 2, step 12, round 0"},
          {"sending", false},   {"done", done}, {"seconds", seconds}};
}

}  // namespace

TEST_CASE("megatrain-top: every rank's step and busiest actor and last collective - a hang and a straggler named",
          "[tools][monitor]") {
  const std::string quiet = render(nlohmann::json::array({{{"rank", 0},
                                                           {"step", 12},
                                                           {"slowest_actor", "compute"},
                                                           {"slowest_busy_s", 0.52},
                                                           {"last_collective", transfer(1, true, 0.004)},
                                                           {"live", true}},
                                                          {{"rank", 1},
                                                           {"step", 12},
                                                           {"slowest_actor", "compute"},
                                                           {"slowest_busy_s", 0.61},
                                                           {"last_collective", transfer(0, true, 0.002)}}}));
  INFO(quiet);
  CHECK_THAT(quiet, Catch::Contains("rank  step    slowest actor (busy)    last collective"));
  CHECK_THAT(quiet, Catch::Contains("0*    12      compute 0.52 s          took 0.004 s from rank 1 (grads)"));
  CHECK_THAT(quiet, Catch::Contains("1     12      compute 0.61 s"));
  CHECK_THAT(quiet, !Catch::Contains("RANKS:"));

  const std::string hang = render(nlohmann::json::array({{{"rank", 0},
                                                          {"step", 12},
                                                          {"slowest_actor", "collector"},
                                                          {"slowest_busy_s", 0.1},
                                                          {"last_collective", transfer(1, false, 42)},
                                                          {"live", true}},
                                                         {{"rank", 1},
                                                          {"step", 11},
                                                          {"slowest_actor", "compute"},
                                                          {"slowest_busy_s", 3.0},
                                                          {"last_collective", nullptr}}}));
  INFO(hang);
  CHECK_THAT(hang, Catch::Contains("WAITING 42.0 s from rank 1 (grads)"));
  CHECK_THAT(hang, Catch::Contains("RANKS: rank 0 waits 42 s for rank 1: the gradients of stage 2"));
  CHECK_THAT(hang, Catch::Contains("RANKS: rank 1 is behind: step 11 of 12"));
  CHECK_THAT(hang, Catch::Contains("none yet"));

  // One rank (or an older node): no ranks table.
  CHECK_THAT(render(nlohmann::json::array()), !Catch::Contains("slowest actor"));
}

TEST_CASE("megatrain-top: a bf16 run's header names its kernel choices", "[tools][monitor]") {
  mt::monitor_client::SnapshotInput in;
  in.status = {{"state", "running"},
               {"step", 3},
               {"run",
                {{"model", "llama"},
                 {"arch", "llama"},
                 {"bf16", true},
                 {"kernel_choices",
                  {{"bf16_gemm", {{"path", "onednn"}, {"source", "probe"}}},
                   {"bf16_attention", {{"path", "pairs"}, {"source", "cache"}}}}}}}};
  std::string text;
  for (const auto& line : mt::monitor_client::render_snapshot(in)) text += line + "\n";
  CHECK_THAT(text, Catch::Contains(" bf16 (products onednn, attention pairs), "));
  in.status["run"]["kernel_choices"] = nlohmann::json::object();  // an fp32 run: none made
  text.clear();
  for (const auto& line : mt::monitor_client::render_snapshot(in)) text += line + "\n";
  CHECK_THAT(text, Catch::Contains(" bf16, "));
  CHECK_THAT(text, !Catch::Contains("(products"));
}
