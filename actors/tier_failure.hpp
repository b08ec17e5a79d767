// A run that ended because the NVMe tier failed (a write: disk full, a file-size limit, an I/O error;
// a read: damage, truncation, an I/O error): its error names the file and the errno text, and says
// which checkpoint holds the last consistent state.
//
// Why no new checkpoint is written at that moment: the tier rewrites each stage's state in place, so
// when it fails mid-step the stages already updated no longer have their state before the step, and
// the stages not yet updated can be neither read (a read failure) nor kept (their updates need the
// tier: the model's state does not fit RAM, which is why it is on the tier). No whole step is
// consistent except the ones a checkpoint already holds; those checkpoints are intact (they are HDF5
// files outside the tier) and resume bit for bit.
#pragma once
#include <cstdint>

#include "actors/engine.hpp"

namespace mt::actors {

// When `result` failed and `host`'s moment store reports a failure, rewrites result.error to name the
// tier's failure and the newest checkpoint of the run (result.checkpoints), or says there is none.
void explain_tier_failure(EngineResult& result, const HostModel& host, std::int64_t first_step);

}  // namespace mt::actors
