// The Trainer's downstream-task part (train.eval_tasks, docs/inference.md
// "Downstream tasks"): multiple-choice task files scored every
// train.eval_tasks_every steps and at the last step, beside the validator
// and like it through the schedule runner (make_forward_schedule, ModelChunk
// in evaluation mode), so every TP/PP/DP layout runs it. Each choice is one
// row of a [B, T + 1] micro-batch (data/tasks.h); the DP ranks take
// consecutive rows; the ranks holding the head read each row's per-token
// cross-entropies and the world sums the rows' log-likelihoods (one rank
// contributes each, so the sum is exact), then every rank scores them. The
// rows go in rounds of a training step's shape (m micro-batches per rank).
#pragma once

#include <cstdint>
#include <vector>

#include "data/tasks.h"

namespace wiola {

struct RunSettings;
struct StageSchedule;
struct RankModel;
struct RankComms;
struct TrainData;

class TaskEvaluator {
 public:
  TaskEvaluator(const RunSettings& run, const StageSchedule& schedule, RankModel& model, RankComms& comms);
  // Reads the task files and encodes them with the data's tokenizer (the
  // file the prep manifest names); throws naming what is missing.
  void open(const TrainData& data);
  // Whether step t ends with task scores (every train.eval_tasks_every steps
  // when positive, and the last step).
  bool due(int64_t t, int64_t last_step) const;
  // Scores every task file (collective).
  const std::vector<TaskScores>& evaluate();
  const std::vector<TaskScores>& last() const { return last_; }

 private:
  std::vector<double> logliks(const std::vector<TaskRequest>& reqs);

  const RunSettings& run_;
  const StageSchedule& schedule_;
  RankModel& model_;
  RankComms& comms_;
  std::vector<TaskFile> tasks_;
  std::vector<std::vector<TaskRequest>> requests_;  // per task
  std::vector<TaskScores> last_;
};

}  // namespace wiola
