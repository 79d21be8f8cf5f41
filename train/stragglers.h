// Per-rank step times and stragglers (train.straggler_share;
// docs/performance.md). Every rank's wall time per step is the same: the
// collectives make the fast ranks wait for the slow one. What tells a
// straggler apart is its own work: the step time minus the time the rank
// spent blocked on other ranks (exposed communication, pipeline bubble) and
// checkpoint work, i.e. compute + optimizer + data + other of the
// accounting's breakdown (train/accounting.h). A rank whose median own work
// exceeds its peers' median by more than the share is named: in a warning at
// the log line (per log interval, one all_gather of two doubles on the
// control plane) and in report.json. Peers: the ranks of the same pipeline
// stage (they run the same layers) when the stage has several, else all.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "dist/comm.h"
#include "train/accounting.h"

namespace wiola {

// Ranks whose value exceeds (1 + share) x the median of their group's values
// (group_of[r]: rank r's group; a group of one rank is compared with all
// ranks). share <= 0: none.
std::vector<int> find_stragglers(const std::vector<double>& own_s, const std::vector<int>& group_of, double share);

// Median of `v` (NaN when empty).
double median_of(std::vector<double> v);

class StragglerWatch {
 public:
  // Reads the test-only WIOLA_SLOW_RANK=RANK:MS (world rank RANK sleeps MS
  // milliseconds at the start of every step, inside its data phase).
  StragglerWatch(const RunConfig& rc, dist::Comm& world);
  // The injected delay, when this rank is WIOLA_SLOW_RANK's.
  void inject_delay() const;
  // After step t with its closed breakdown `cur` (accounted: step 2.., not
  // a dump step). Collective over the world at log steps (t a multiple of
  // train.log_every, or the last step) when train.straggler_share > 0.
  void after_step(int64_t t, const StepTimes& cur, bool accounted, int64_t last_step);
  // End of the run (collective): every rank's medians over the accounted
  // steps; on rank 0 prints them and returns report.json's
  // "step_time_per_rank" (null elsewhere).
  nlohmann::json report() const;

 private:
  dist::Comm& world_;
  double share_ = 0;
  int log_every_ = 1;
  std::vector<int> group_of_;         // every world rank's pipeline stage, or -1 (compared with all)
  int slow_rank_ = -1;                // WIOLA_SLOW_RANK
  double slow_ms_ = 0;
  std::vector<double> step_s_, own_s_;  // this rank, per accounted step
  size_t interval_from_ = 0;          // first sample of the current log interval
  std::vector<int> flagged_;          // ranks named at the last log step
};

}  // namespace wiola
