// The Trainer's validation part: the validation loaders (the data's "val"
// split, or of a blend each source's that has one, evaluated one by one so
// that each gets its own loss), when to evaluate, and the last losses for
// the log line, metrics.jsonl and the summary. Evaluation runs the stage's
// forward with ATM off over the first train.eval_batches global batches.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/loader.h"

namespace wiola {

struct RunSettings;
struct StageSchedule;
struct RankModel;
struct RankComms;
struct TrainData;
class ScheduleObserver;

// Forwards only of n micro-batches (`tokens`: n · mb_tokens ids, this
// rank's) through the schedule runner (make_forward_schedule of `train`) on
// `model`'s chunks in evaluation mode (ATM off), the boundary messages on
// `comms`' stage link; `observer`, if any, is told each action. `what` names
// them in diagnostics. The validation batches and the task rows
// (train/task_evaluator.h) run through here.
void run_evaluation_forwards(const StageSchedule& train, RankModel& model, RankComms& comms, int n, size_t mb_tokens,
                             const int32_t* tokens, const std::string& what, ScheduleObserver* observer = nullptr);

class Validator {
 public:
  // The sum over the world of the last stage's CE sums (Trainer::world_loss).
  using WorldLoss = std::function<double()>;

  // The forwards run on `model`'s chunks in `schedule`'s chunk order, their
  // messages on `comms`' stage link; `data`: the training loader (a blend's shares).
  Validator(const RunSettings& run, const StageSchedule& schedule, RankModel& model, RankComms& comms,
            const TrainData& data, WorldLoss world_loss);
  // Opens the loaders (inside the setup agreement): the "val" split of the
  // data, or one for each blended source whose split is long enough (a
  // small source is left out with a warning; the others keep their
  // relative shares).
  void open(uint64_t data_seed);
  // Whether step t ends with an evaluation (train.eval_every, and the last step).
  bool due(int64_t t, int64_t last_step) const;
  // Mean validation cross-entropy; of a blend, the share-weighted mean of
  // its sources' (the expected loss on the training mixture).
  double validate();

  size_t sources() const { return vals_.size(); }
  // 1-based blend source of the k-th validation loader.
  size_t source_number(size_t k) const { return vals_[k].source + 1; }
  double last() const { return last_; }  // -1: none yet
  // Per blend source (NaN: left out); empty without a blend.
  const std::vector<double>& last_sources() const { return last_sources_; }

 private:
  struct Source {
    std::unique_ptr<TokenLoader> loader;
    LoaderState start;
    size_t source = 0;  // in data.blend
    double share = 1;   // of the blend
  };
  double loss_of(Source& v);

  const RunSettings& run_;
  const StageSchedule& schedule_;
  RankModel& model_;
  RankComms& comms_;
  const TrainData& data_;
  WorldLoss world_loss_;
  std::vector<Source> vals_;
  double last_ = -1;
  std::vector<double> last_sources_;
};

}  // namespace wiola
