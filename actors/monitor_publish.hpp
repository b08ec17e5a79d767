// Internal: what the engine publishes to the monitor (no CAF): a step's figures, history record and
// event; the live figures of each tick (link bytes, arena, wall time); a dump of every actor's state;
// the start of each pipeline (its actors running again); the model as /status names it.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "actors/context.hpp"
#include "monitor/monitor.hpp"

namespace mt::actors {

// A pipeline's actors are about to start: each is marked running. A run with evaluation is a chain of
// pipelines (training segments and evaluation passes, engine.hpp), and the node marks every actor of
// the one that ends stopped; without this, the next one's actors would read "stopped" while working.
// Only this pipeline's devices: an evaluation pass runs on device 0 alone.
void publish_pipeline_start(Context& ctx);

// The model as /status and megatrain-top name it: the Hugging Face directory, the config.json, or,
// for a model defined by [model] keys, what they define ("llama (hidden 256, from [model] keys)").
std::string model_description(const TrainConfig& cfg, const ModelConfig& model);

// The train.jsonl fields of a step record.
nlohmann::json step_record_json(const StepRecord& r);

// A step finished: the board's figures, a /history record (the train.jsonl fields + "t", "h2d_bytes",
// "d2h_bytes") and a `step` event with the same record.
void publish_step(Context& ctx, const StepRecord& r);

// The tick's figures: link bytes, arena use, wall time and the time lost to pauses and restarts.
void publish_live(Context& ctx, double paused_s, double restart_s);

// A transfer with another rank as /status "ranks" shows it: {channel, peer, what, sending, done, seconds}.
nlohmann::json transfer_json(const cluster::TransferView& t);

// Every actor's state (as /status lists them), for the watchdog's dump.
nlohmann::json actors_json(const monitor::StatusBoard& board);

}  // namespace mt::actors
