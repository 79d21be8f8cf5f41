// Detection of the loss-spike policy (train.spike_*; docs/checkpoints.md
// "Loss spikes"): fed each trained step's loss and whether the step was
// skipped (non-finite gradient norm), it says whether the run should rewind
// and why. A step is a spike when its loss exceeds mean + spike_sigma x std
// (population) of the last spike_window accepted losses (only once the
// window is full), or when it ends a run of spike_skipped consecutive
// skipped steps. Pure: no ranks, no I/O. The Trainer owns the rest of the
// policy (rank 0's decision broadcast, the rewind, the skipped windows); its
// state round-trips through the checkpoint manifest's "spike" object.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace wiola {

struct SpikeSettings {
  double sigma = 0;  // train.spike_sigma (0: no loss check)
  int window = 50;   // train.spike_window
  int skipped = 0;   // train.spike_skipped (0: no skipped-steps check)
};

// What the detector carries from step to step (manifest "spike":
// "recent_losses", oldest first, and "consecutive_skipped").
struct SpikeState {
  std::vector<double> recent_losses;
  int64_t consecutive_skipped = 0;
};

struct SpikeVerdict {
  bool rewind = false;
  std::string reason;  // empty when !rewind
};

class SpikeDetector {
 public:
  explicit SpikeDetector(SpikeSettings s, SpikeState state = {}) : s_(s), st_(std::move(state)) {}

  // Judges a step: counts it into the run of consecutive skipped steps (a
  // trained one ends the run) and checks both limits. `loss` is the loss
  // detection sees; a non-finite or skipped step's is not compared.
  SpikeVerdict check(double loss, bool skipped);
  // A step that did not rewind: its loss (when finite and not skipped) joins
  // the window, the oldest leaving a full one.
  void accept(double loss, bool skipped);
  // check, then accept unless it says rewind.
  SpikeVerdict step(double loss, bool skipped) {
    SpikeVerdict v = check(loss, skipped);
    if (!v.rewind) accept(loss, skipped);
    return v;
  }

  const SpikeState& state() const { return st_; }
  void restore(SpikeState state) { st_ = std::move(state); }

 private:
  SpikeSettings s_;
  SpikeState st_;
};

// The manifest's fields of SpikeState, and back (throws naming `where` on a
// missing or mistyped field).
void spike_state_to_json(const SpikeState& st, nlohmann::json& spike);
SpikeState spike_state_from_json(const nlohmann::json& spike, const std::string& where);

}  // namespace wiola
