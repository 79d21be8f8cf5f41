// The training loop, for any process layout (docs/model.md §5): one rank of
// a TP × PP × DP grid (a single process is the 1 × 1 × 1 grid). The run is a
// Trainer object made of named parts, each in its own file. What this rank
// is and holds:
//   RunSettings       config, options, backend, world, budget, batch shape,
//                     grid coordinate (train/run_settings.h)
//   TrainData         the training loader and this rank's batch (train/train_data.h)
//   RankComms         the grid, data plane, TP collectives and stage link
//                     (train/rank_comms.h)
//   StageLayers       which layers this rank's model chunks hold (train/stage_layers.h)
//   StageSchedule     this stage's schedule of actions and slots (train/stage_schedule.h)
//   RankModel         the model chunks and their parameter store (train/rank_model.h)
//   RankOptimizer     DistAdamW with ZeRO and DP overlap (train/rank_optimizer.h)
// What it does with them, each part given only what it reads:
//   ScheduleRunner    one step of the schedule over the stage link, telling
//                     its observers (train/schedule_runner.h)
//   Validator         validation loaders and losses (train/validator.h)
//   TaskEvaluator     multiple-choice task scores, train.eval_tasks (train/task_evaluator.h)
//   Accounting        the step's phases as timed scopes, MFU, memory, the
//                     run's measurements (train/accounting.h)
//   Outputs           config.toml, metrics.jsonl, TensorBoard, schedule
//                     trace, banner, log lines, the run report (train/outputs.h)
//   CheckpointPolicy  resume, when to save and commit, stop requests
//                     (train/checkpoint_policy.h)
//   SpikePolicy       loss-spike detection, rewinds, skipped data windows
//                     (train/spike_policy.h)
//   DumpRecorder      the numerics dump of --dump-step (train/dump_recorder.h)
// and its work is:
//   Trainer(...)   setup: every check agreed by all ranks, then the parts
//   run()          the steps, each followed by its diagnostics, then the report
//   step(t)        the step's maths: data -> forward and backward (the
//                  runner) -> tied-embedding sum and loss -> optimizer
//   evaluate()     validation loss (ATM off)
// The backend (Ops) is chosen at start-up (launch/, train.backend) and
// passed in; nothing here assumes its buffers are host memory.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/run_config.h"
#include "data/tasks.h"
#include "dist/comm.h"
#include "dist/optimizer.h"
#include "kernels/ops.h"
#include "model/params.h"
#include "train/lr_schedule.h"

namespace wiola {

// Exit status of a run that stopped early at a checkpoint because it was
// asked to (SIGUSR1/SIGTERM: preemption); running it again resumes.
inline constexpr int kExitPreempted = 75;

struct TrainOptions {
  std::vector<std::pair<int64_t, std::string>> dumps;  // (step, path)
  bool quiet = false;                                  // no progress lines
  // Polled once per step on every rank (a signal flag); when any rank says
  // yes, all stop after the same step, write a checkpoint and return.
  std::function<bool()> stop_requested;
  // ParamLayout alignment of the model's flat buffers. Results do not depend
  // on it; 1 (the packed layout before tensors were aligned) lets tests
  // write such checkpoints (`wiola train` reads WIOLA_PARAM_ALIGN).
  size_t param_align = kParamAlign;
  // A test hook (`wiola train` reads WIOLA_TRACE_SCHEDULE=1): every rank
  // writes the pipeline actions it executed, in the order each completed,
  // one line per step to RUN_DIR/schedule_trace/rank<R>.txt:
  //   "step T stage S dp D tp P: F0 F1 B0 ..." (dist::to_string).
  bool trace_schedule = false;
};

struct TrainSummary {
  int64_t steps = 0, t_max = 0, skipped = 0;
  double first_loss = 0, last_loss = 0;
  double val_loss = -1;      // last validation loss (-1: none)
  double tokens_per_s = 0;   // whole run, wall clock of the steps
  int64_t resumed_from = 0;  // checkpoint step this run resumed from (0: a fresh start)
  bool stopped = false;      // stopped early at a checkpoint (stop_requested)
  // The last task scores (train.eval_tasks; empty: none).
  std::vector<TaskScores> tasks;
};

// Step budget of a run (docs/model.md §4): T_max from train.steps, else
// train.tokens, else the Chinchilla rule; warm-up; where this run stops.
struct StepBudget {
  int64_t t_max = 0, warmup = 0, last_step = 0;
  const char* source = "";  // which rule set T_max
  LrSchedule lr;            // eta(t) (train/lr_schedule.h)
  static StepBudget of(const RunConfig& rc);
};

// Where a run is, besides the model, optimizer and loader states. The
// optimizer's applied-step count (its bias-correction step) lives in
// DistAdamW::applied_steps().
struct TrainProgress {
  int64_t step = 0;     // schedule step t of the last completed step (0: none)
  int64_t skipped = 0;  // steps whose update was skipped (non-finite gradient norm)
  int64_t tokens = 0;   // training tokens consumed by completed steps
};

// What one step reports.
struct StepOutcome {
  double loss = 0, lr = 0, grad_norm = 0, seconds = 0;
  double z_loss = 0;              // train.z_loss: the mean z lse^2 term trained on beside the loss
  double checkpoint_seconds = 0;  // the loop's wait for checkpoint work after the step
  int64_t adam_step = 0;          // AdamW bias-correction step of this update (applied steps + 1)
  bool skipped = false;
};

struct RunSettings;
struct TrainData;
struct RankComms;
struct StageLayers;
struct StageSchedule;
struct RankModel;
struct RankOptimizer;
class StageChunk;
class ScheduleRunner;
class Validator;
class TaskEvaluator;
class Accounting;
class Outputs;
class CheckpointPolicy;
class SpikePolicy;
class DumpRecorder;
struct ResumeState;

class Trainer {
 public:
  // Setup, collective over `world` (size tp·pp·dp of rc.parallel). Throws
  // wiola::Error on a bad config or input (dist::SetupFailed on every rank
  // after an agreed failure); the caller ends the job.
  Trainer(const RunConfig& rc, const TrainOptions& opt, Ops<float>& ops, dist::Comm& world);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Steps progress().step + 1 .. the budget's last step, then the report.
  TrainSummary run();
  // Training step t (the next one): returns its loss, learning rate and
  // gradient norm (identical on every rank).
  StepOutcome step(int64_t t);
  // Mean validation cross-entropy over train.eval_batches global batches.
  double evaluate();

  const StepBudget& budget() const;
  TrainProgress& progress();

 private:
  struct Fault;  // WIOLA_FAULT (failure-path tests)

  // Setup: every check before any work, agreed by all ranks.
  void check_and_open_data();
  // Restores a checkpoint's progress, data position and spike state.
  void restore(const ResumeState& st);
  // What a checkpoint saves besides the tensors.
  ResumeState resume_state() const;
  // A step of a skipped data window: its global batch read and dropped.
  StepOutcome skip_data_step(int64_t t);
  // This rank's grid (collective), layers, schedule, model, optimizer and
  // stage link; then the schedule runner with its observers.
  void build_rank();
  void make_runner();
  // The step's maths, in order (step()).
  // The step's data: this rank's slice of the global batch (the test hooks'
  // faults and delays act here, inside its time).
  void load_batch(int64_t t);
  // Forward and backward of this rank's micro-batches over the schedule.
  void forward_backward(int64_t t, bool dumping);
  // The tied embedding's gradient summed between its two ends, then the
  // mean loss over the global batch.
  double embedding_sum_and_loss(int64_t t, bool dumping);
  // The DP reduction, norm, clip and AdamW: the update.
  dist::StepResult update(int64_t t, double lr, int64_t adam_step);
  // Sum over the world of the last stage's CE sums (ATM's figures ride along).
  double world_loss();
  // Documents: the targets of the step's global batch that count (summed
  // over DP), and the runner's loss scale from them.
  void count_targets();
  // Collective: back to the newest checkpoint, data window [c+1, t] skipped.
  void rewind(int64_t t, const std::string& why);
  // GEMM tuning shared from rank 0 (train.cuda_gemm = auto), and a
  // resumed checkpoint's compared with this run's.
  void share_gemm_tuning(bool measured);
  void check_resumed_gemm();

  std::unique_ptr<RunSettings> run_;
  std::unique_ptr<TrainData> data_;
  std::unique_ptr<RankComms> comms_;
  std::unique_ptr<StageLayers> layers_;
  std::unique_ptr<StageSchedule> schedule_;
  std::unique_ptr<RankModel> model_;
  std::unique_ptr<RankOptimizer> optimizer_;
  TrainProgress progress_;
  double counted_targets_ = 0;          // documents: this step's, over the global batch
  double z_loss_sum_ = 0, z_loss_ = 0;  // train.z_loss: the last world sum, and the step's mean term
  std::unique_ptr<Validator> validator_;
  std::unique_ptr<TaskEvaluator> tasks_;
  std::unique_ptr<Accounting> acct_;
  std::unique_ptr<Outputs> outputs_;
  std::unique_ptr<CheckpointPolicy> checkpoints_;
  std::unique_ptr<SpikePolicy> spikes_;
  std::unique_ptr<DumpRecorder> dumps_;
  std::unique_ptr<Fault> fault_;
  std::vector<std::unique_ptr<StageChunk>> stage_chunks_;  // the model's chunks as the runner drives them
  std::unique_ptr<ScheduleRunner> runner_;
  bool gemm_shared_ = false;  // rank 0's measured GEMM choices adopted by every rank
};

// Setup + run() on `world` with the backend `ops`.
TrainSummary run_training(const RunConfig& rc, const TrainOptions& opt, Ops<float>& ops, dist::Comm& world);

}  // namespace wiola
