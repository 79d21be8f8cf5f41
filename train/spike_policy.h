// The Trainer's loss-spike part (train.spike_*, train.skip_batches;
// docs/checkpoints.md "Loss spikes"): the data windows whose steps read
// their batch and drop it, rank 0's spike decision (train/spike_detector.h's
// detector) broadcast to every rank, the rewinds made and the record of the
// last one for the next metrics line. Its state round-trips through the
// checkpoint manifest (ResumeState's spike fields); the rewind itself goes
// through the checkpoint part's resume path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "dist/comm.h"
#include "train/checkpointer.h"
#include "train/spike_detector.h"

namespace wiola {

struct StepOutcome;

class SpikePolicy {
 public:
  SpikePolicy(const RunConfig& rc, dist::Comm& world);

  // Detection is on (train.spike_sigma or train.spike_skipped).
  bool on() const { return on_; }
  // Reads the test hook WIOLA_INJECT_LOSS_SPIKE=STEP (when on): the loss the
  // detection sees at step STEP is 1000 times larger, the first time this
  // process runs that step (training itself is unchanged).
  void read_test_hook();
  // Step t's data lies in a skipped window.
  bool skipping(int64_t t) const;
  // The data windows skipped (train.skip_batches, the rewinds', a resumed
  // checkpoint's).
  const std::vector<StepWindow>& windows() const { return windows_; }
  // A resumed checkpoint's state: its windows join ours.
  void restore(const ResumeState& st);
  // The spike fields of a checkpoint's ResumeState.
  void save_to(ResumeState& st) const;
  // After step t (not a skipped one): whether it is a spike, agreed by all
  // ranks (rank 0 decides, broadcast); `why` says what, on rank 0.
  bool detected(int64_t t, const StepOutcome& out, std::string& why);
  // Before a rewind at step t: throws when train.spike_max_rewinds are made
  // already. Returns the message's "WHY at step T".
  std::string check_rewind(int64_t t, const std::string& why) const;
  // After the rewind to checkpoint `st` (from `folder`): its detector
  // state, window [st.step + 1, t] skipped; rank 0 says so and keeps the
  // record for the next metrics line.
  void rewound(int64_t t, const std::string& why, const std::string& at, const std::string& folder,
               const ResumeState& st);
  // Rank 0: the record of the last rewind, once (null: none).
  nlohmann::json take_rewind_record();

 private:
  const RunConfig& rc_;
  dist::Comm& world_;
  bool on_ = false;
  std::vector<StepWindow> windows_;
  int64_t rewinds_ = 0;
  SpikeDetector detector_;        // the window's losses, the run of skipped steps
  int64_t inject_ = -1;           // WIOLA_INJECT_LOSS_SPIKE (test hook)
  nlohmann::json pending_;        // rank 0: goes into the next metrics record
};

}  // namespace wiola
