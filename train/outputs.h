// The Trainer's outputs part: what a run writes besides checkpoints and
// dumps. Every rank: its state file for timeout diagnostics (RUN_DIR/ranks,
// dist/rank_states.h) and, with TrainOptions::trace_schedule, the pipeline
// actions it executed (RUN_DIR/schedule_trace/rank<R>.txt). Rank 0: the
// effective config (RUN_DIR/config.toml), the banner, one metrics.jsonl
// record per step (and TensorBoard's events, train/tensorboard.h), the
// progress lines, and at the end the run report (train/run_report.h) and,
// with train.trace_steps, the job's timeline (RUN_DIR/trace.json,
// train/timeline.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "config/run_config.h"
#include "dist/rank_states.h"
#include "dist/schedule.h"
#include "train/schedule_runner.h"
#include "train/tensorboard.h"
#include "train/timeline.h"
#include "train/trainer.h"

namespace wiola {

struct RunSettings;
struct TrainData;
struct RankComms;
struct StageLayers;
struct StageSchedule;
struct RankModel;
struct RankOptimizer;
class Accounting;
class Validator;
class SpikePolicy;

// As the schedule runner's observer it keeps the trace of executed actions.
class Outputs final : public ScheduleObserver {
 public:
  // Collective: this rank's state board. The rest is read for the banner
  // and the report: the data, communicators, layers, schedule, model memory
  // and optimizer.
  Outputs(const RunSettings& run, const TrainData& data, const RankComms& comms, const StageLayers& layers,
          const StageSchedule& schedule, const RankModel& model, const RankOptimizer& optimizer);
  ~Outputs() override;

  // metrics.jsonl: a fresh run starts it; a resumed run (`step` > 0, the
  // checkpoint's) cuts it back to that step (atomically) and appends, so no
  // step appears twice. Also config.toml (with the skip list `windows`),
  // the schedule trace and TensorBoard's writer.
  void open(int64_t step, const std::vector<StepWindow>& windows);
  // Rank 0: the run's banner (model, data, budget, the MFU peak `acct`
  // measures against, layout, memory, checkpoints).
  void banner(bool checkpoints, const Accounting& acct);

  // The schedule trace (TrainOptions::trace_schedule): an action as it
  // completes, named by the work that ran; then the step's line.
  bool tracing() const { return trace_.is_open(); }
  void action_done(const dist::Action& a) override {
    if (tracing()) executed_.push_back(a);
  }
  void schedule_done(int64_t t) override;

  // The timeline (train.trace_steps, train/timeline.h): step t starts, and
  // the step in progress ends (after its checkpoint work and log).
  void trace_begin(int64_t t) { timeline_->begin_step(t); }
  void trace_end() { timeline_->end_step(); }

  // Rank 0: step t's metrics record and, every log_every, its progress line.
  // Task scores (train.eval_tasks) for the next log_step's record.
  void record_tasks(const std::vector<TaskScores>& scores) { tasks_ = scores; }
  void log_step(int64_t t, const StepOutcome& out, bool evaluated, const TrainProgress& progress,
                const Accounting& acct, const Validator& val, SpikePolicy& spikes, bool checkpoints);
  // After a rewind to checkpoint step `step` (rank 0): metrics.jsonl and
  // TensorBoard without the later records, config.toml with `windows`.
  void rewound(int64_t step, const std::vector<StepWindow>& windows);
  // The run report and the timeline's trace.json (collective).
  void report(const TrainSummary& sum, const Accounting& acct);

 private:
  void write_config_toml(const std::vector<StepWindow>& windows) const;
  void cut_metrics(int64_t step);

  const RunSettings& run_;
  const TrainData& data_;
  const RankComms& comms_;
  const StageLayers& layers_;
  const StageSchedule& schedule_;
  const RankModel& model_;
  const RankOptimizer& optimizer_;
  std::filesystem::path run_dir_;
  std::unique_ptr<dist::RankStateBoard> board_;
  std::ofstream metrics_;                  // world rank 0
  std::vector<TaskScores> tasks_;          // recorded for the next log_step
  std::unique_ptr<TensorBoardWriter> tb_;  // world rank 0, train.tensorboard
  std::ofstream trace_;                    // this rank's executed actions
  std::unique_ptr<Timeline> timeline_;     // train.trace_steps
  std::vector<dist::Action> executed_;     // of the step in progress
};

}  // namespace wiola
