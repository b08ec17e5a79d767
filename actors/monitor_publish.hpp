// Internal: what the node publishes to the monitor (no CAF): a step's figures, history record and
// event; the live figures of each tick (link bytes, arena, wall time); a dump of every actor's state.
#pragma once
#include <nlohmann/json.hpp>

#include "actors/context.hpp"
#include "monitor/monitor.hpp"

namespace mt::actors {

// The train.jsonl fields of a step record.
nlohmann::json step_record_json(const StepRecord& r);

// A step finished: the board's figures, a /history record (the train.jsonl fields + "t", "h2d_bytes",
// "d2h_bytes") and a `step` event with the same record.
void publish_step(Context& ctx, const StepRecord& r);

// The tick's figures: link bytes, arena use, wall time and the time lost to pauses and restarts.
void publish_live(Context& ctx, double paused_s, double restart_s);

// Every actor's state (as /status lists them), for the watchdog's dump.
nlohmann::json actors_json(const monitor::StatusBoard& board);

}  // namespace mt::actors
