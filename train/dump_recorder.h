// The Trainer's numerics-dump part (--dump-step N:PATH; docs/model.md §7):
// on a dump step it records the state before the update (parameters, AdamW
// moments), what each forward of the schedule decided (logits of a single
// process, ATM decisions of this rank's layers), the gradient of the mean
// loss, and after the update the parameters; then it gathers the global
// batch and the ATM decisions and writes the file on rank 0 (train/dump.h,
// gathered by train/gather.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "train/dump.h"
#include "train/schedule_runner.h"

namespace wiola {

struct RunSettings;
struct TrainData;
struct RankComms;
struct RankModel;
struct RankOptimizer;
struct StageLayers;
struct StepOutcome;

// As the schedule runner's observer it reads each forward's chunk.
class DumpRecorder final : public ScheduleObserver {
 public:
  // It reads the batch, the model (keeping the head's logits on dump
  // steps), the optimizer's moments, gathered over comms' grid by `layers`.
  DumpRecorder(const RunSettings& run, const TrainData& data, RankComms& comms, RankModel& model,
               RankOptimizer& optimizer, const StageLayers& layers,
               const std::vector<std::pair<int64_t, std::string>>& dumps);

  // Whether step t is a dump step.
  bool due(int64_t t) const { return dumps_.count(t) > 0; }
  // Step t starts: on a dump step, the parameters and (after step 1) the
  // AdamW moments before it (collective). Returns whether it records.
  bool begin(int64_t t);
  // After a forward of the schedule (on one of the rank's chunks): the
  // logits (single process, the head's chunk) and the chunk's layers' ATM
  // decisions.
  void compute_ends(const dist::Action& a) override;
  // Before the optimizer step: the gradient of the mean loss, the DP mean
  // of the replicas' (collective).
  void grads();
  // After the update: the parameters, then the file (collective; written
  // on rank 0).
  void finish(int64_t t, const StepOutcome& out);

 private:
  // A flat backend buffer of this rank as full tensors on rank 0.
  std::vector<float> gather_backend(const float* buf);

  const RunSettings& run_;
  const TrainData& data_;
  RankComms& comms_;
  RankModel& model_;
  RankOptimizer& optimizer_;
  const StageLayers& layers_;
  std::map<int64_t, std::string> dumps_;
  bool active_ = false;
  StepDump dump_;
  std::map<int, std::vector<uint8_t>> atm_local_;  // layer -> this rank's decisions
};

}  // namespace wiola
