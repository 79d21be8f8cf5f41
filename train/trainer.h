// The training loop, for any process layout (docs/model.md §5): one rank of
// a TP × PP × DP grid (a single process is the 1 × 1 × 1 grid). The run is a
// Trainer object holding everything a checkpoint saves and restores (the
// model, the optimizer, the loader, the progress counters and the metrics
// writer), and its work is named parts:
//   Trainer(...)   setup: every check agreed by all ranks, then the grid,
//                  model, optimizer and loaders
//   run()          the steps, then the report
//   step(t)        data -> pipeline schedule -> tied-embedding sum ->
//                  optimizer (+ the numerics dump on dump steps)
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
#include "dist/comm.h"
#include "dist/optimizer.h"
#include "kernels/ops.h"
#include "model/params.h"

namespace wiola {

// Exit status of a run that stopped early at a checkpoint because it was
// asked to (SIGUSR1/SIGTERM: preemption); running it again resumes.
inline constexpr int kExitPreempted = 75;

struct TrainOptions {
  std::vector<std::pair<int64_t, std::string>> dumps;  // (step, path)
  bool quiet = false;                                 // no progress lines
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
  double val_loss = -1;       // last validation loss (-1: none)
  double tokens_per_s = 0;    // whole run, wall clock of the steps
  int64_t resumed_from = 0;   // checkpoint step this run resumed from (0: a fresh start)
  bool stopped = false;       // stopped early at a checkpoint (stop_requested)
};

// Step budget of a run (docs/model.md §4): T_max from train.steps, else
// train.tokens, else the Chinchilla rule; warm-up; where this run stops.
struct StepBudget {
  int64_t t_max = 0, warmup = 0, last_step = 0;
  const char* source = "";  // which rule set T_max
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
  double checkpoint_seconds = 0;  // the loop's wait for checkpoint work after the step
  int64_t adam_step = 0;  // AdamW bias-correction step of this update (applied steps + 1)
  bool skipped = false;
};

struct StepDump;

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
  struct State;
  std::unique_ptr<State> s_;

  void print_banner();
  // Checkpoint bookkeeping after step t (collective): the per-step control
  // all-reduce, commits of finished background writes, new saves. Returns
  // true when the run must stop (a stop was requested and saved).
  bool after_step(int64_t t);
  // Returns this rank's ATM decisions on dump steps (empty otherwise).
  std::vector<uint8_t> run_schedule(int64_t t, bool dumping, StepDump* dump);
  void dump_step(int64_t t, const StepOutcome& out, StepDump& dump, const std::vector<uint8_t>& atm_flat);
  void log_step(int64_t t, const StepOutcome& out, bool evaluated);
  void write_report(const TrainSummary& sum);
};

// Setup + run() on `world` with the backend `ops`.
TrainSummary run_training(const RunConfig& rc, const TrainOptions& opt, Ops<float>& ops,
                          dist::Comm& world);

}  // namespace wiola
