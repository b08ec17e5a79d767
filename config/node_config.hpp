// The node binary's configuration: a CAF actor_system_config with every TrainConfig key registered
// (INI sections [train] [model] [data] [device] [threads] [log]; command line --section.key=value),
// so --config-file=x.ini, command-line overrides and --long-help come from CAF; --help and
// --dump-config are printed here (CAF's --help lists only its global options and its dump rounds reals).
//
// CAF 0.17 checks the command line (unknown options and bad values are parser errors) but silently
// drops unknown keys and values of the wrong type in INI files. load() therefore reads the INI file
// itself, rejects every key no option declares and every value the option cannot take (an integer
// where a real is expected is accepted and converted), then lets CAF apply the command line on top,
// and finally runs TrainConfig::validate(). Everything fails before any actor starts.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include <caf/actor_system_config.hpp>

#include "config/train_config.hpp"

namespace mt {

// CAF's scheduler for a run: `threads` workers (the threads.scheduler share) under the work-sharing
// policy. CAF 0.17's default, work stealing, keeps an idle worker polling for about 25 ms after every
// message, waking every 50 us; on the demo (2 cores, both computing) that was 6000 wake-ups and 19% of
// a core per second, and each one preempted a compute thread that its partner then waited for at the
// next barrier. Work sharing sleeps on a condition variable. Our scheduled actors are few and light
// (the blocking work runs on detached actors), so stealing has nothing to gain.
void configure_scheduler(caf::actor_system_config& cfg, int threads);

struct NodeConfigLoad {
  enum class Outcome { run, exit_success, exit_failure };
  Outcome outcome = Outcome::run;
  std::string error;  // exit_failure: what was wrong, naming the key or file
  int exit_code() const { return outcome == Outcome::exit_failure ? 1 : 0; }
};

class NodeConfig : public caf::actor_system_config {
 public:
  NodeConfig();
  NodeConfig(const NodeConfig&) = delete;
  NodeConfig& operator=(const NodeConfig&) = delete;
  NodeConfig(NodeConfig&&) = delete;  // the registered options point into `values`

  // Parses argv (optionally with --config-file=PATH), validates, and applies the thread budget to
  // CAF's scheduler (scheduler.max-threads = the threads.scheduler share). outcome: run;
  // exit_success after --help / --dump-config / --long-help (printed to stdout, nothing validated);
  // exit_failure with `error` set. Never throws for bad input.
  NodeConfigLoad load(int argc, char** argv);
  // The same for an argument list without the program name, and INI text instead of a file
  // (config_file_text empty = no file unless --config-file is among args).
  NodeConfigLoad load(const std::vector<std::string>& args, const std::string& config_file_text = "");

  // The ten sections in INI syntax with every current value, reals at full precision: what
  // --dump-config prints (CAF's own dump rounds reals to 6 decimals, which turns 1e-8 into 0), and a
  // file that --config-file reads back to the same values.
  std::string dump_ini() const;
  // What --help prints: usage, the user's keys, then the expert keys apart (each with when to set it),
  // with type, meaning and current value (CAF's own --help lists only its global options; --long-help
  // adds CAF's internal sections).
  std::string help_text(const std::string& program) const;

  // CAF's settings dump plus every key of the ten sections with its current value (defaults
  // included): the effective configuration as one caf::settings, e.g. to log it.
  caf::settings dump_content() const override;

  // Every key of the ten sections as "section.key", in registration order (docs and tests).
  std::vector<std::string> registered_keys() const;

  bool check_files = true;                  // false: load() validates values only (no filesystem access)
  TrainConfig values;                       // filled by load()
  std::string config_file;                  // the INI file read ("" when none)
  std::string program = "megatrain train";  // argv[0] once load(argc, argv) ran (for --help)

 private:
  void help_keys(std::ostream& out, bool expert) const;
};

}  // namespace mt
