#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/text_input.h"
#include "dist/agree.h"
#include "dist/diagnostics.h"
#include "model/flops.h"
#include "train/accounting.h"
#include "train/checkpoint_policy.h"
#include "train/dump_recorder.h"
#include "train/gemm_record.h"
#include "train/spike_policy.h"
#include "train/outputs.h"
#include "train/lr_schedule.h"
#include "train/rank_comms.h"
#include "train/rank_model.h"
#include "train/rank_optimizer.h"
#include "train/run_settings.h"
#include "train/schedule_runner.h"
#include "train/stage_layers.h"
#include "train/stage_schedule.h"
#include "train/train_data.h"
#include "train/stragglers.h"
#include "train/task_evaluator.h"
#include "train/validator.h"
#include "util/error.h"
#include "util/files.h"
#include "util/test_hooks.h"

namespace wiola {

using dist::Comm;
using dist::DType;
using dist::GroupKind;
using dist::ReduceOp;

StepBudget StepBudget::of(const RunConfig& rc) {
  const TrainSection& tr = rc.train;
  const int64_t GB = rc.global_batch(), T = rc.model.T;
  StepBudget b;
  b.t_max = tr.steps;
  b.source = "train.steps";
  if (b.t_max == 0 && tr.tokens > 0) {
    b.t_max = steps_for_tokens(tr.tokens, GB, int(T));
    b.source = "train.tokens";
  }
  if (b.t_max == 0) {
    b.t_max = chinchilla_steps(rc.model.param_count(), GB, int(T));
    b.source = "Chinchilla 20 N";
  }
  b.warmup = tr.warmup >= 0 ? tr.warmup : default_warmup(b.t_max);
  b.last_step = tr.max_steps > 0 ? std::min(b.t_max, tr.max_steps) : b.t_max;
  b.lr = LrSchedule::of(tr, b.t_max, b.warmup);
  return b;
}

// Fault injection for the failure-path tests: WIOLA_FAULT=KIND:RANK:STEP
// makes world rank RANK, at the start of step STEP, throw ("fail") or stop
// answering ("stall"). Off unless the variable is set.
struct Trainer::Fault {
  std::string kind;
  int rank = -1;
  int64_t step = -1;

  static Fault from_env() {
    Fault f;
    const TestHook h(Hook::Fault);
    if (!h.set()) return f;
    h.fields(3, 3);
    f.kind = h.word(0, {"fail", "stall"});
    f.rank = int(h.integer(1, 0, INT32_MAX));
    f.step = h.integer(2, 1);
    return f;
  }
  void inject(int at_rank, int64_t at_step) const {
    if (rank != at_rank || step != at_step) return;
    if (kind == "fail") fail("injected fault (WIOLA_FAULT) at step ", at_step);
    if (kind == "stall")
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until the job is aborted
  }
};

// ---- setup ------------------------------------------------------------------------
// The parts are made in the setup order: the checks and loaders (before any
// collective), the rank state board, the grid, model and optimizer, the
// MFU denominator, the resume, the outputs; then the banner.
Trainer::Trainer(const RunConfig& rc, const TrainOptions& opt, Ops<float>& ops, Comm& world)
    : run_(std::make_unique<RunSettings>(rc, opt, ops, world)),
      data_(std::make_unique<TrainData>()),
      comms_(std::make_unique<RankComms>()),
      layers_(std::make_unique<StageLayers>()),
      schedule_(std::make_unique<StageSchedule>()),
      model_(std::make_unique<RankModel>()),
      optimizer_(std::make_unique<RankOptimizer>()),
      validator_(
          std::make_unique<Validator>(*run_, *schedule_, *model_, *comms_, *data_, [this] { return world_loss(); })),
      tasks_(std::make_unique<TaskEvaluator>(*run_, *schedule_, *model_, *comms_)),
      spikes_(std::make_unique<SpikePolicy>(rc, world)) {
  check_and_open_data();
  outputs_ = std::make_unique<Outputs>(*run_, *data_, *comms_, *layers_, *schedule_, *model_, *optimizer_);
  acct_ = std::make_unique<Accounting>(*run_, *comms_, *model_, *optimizer_);
  build_rank();
  acct_->measure_peak();
  checkpoints_ = std::make_unique<CheckpointPolicy>(*run_, *data_, *comms_, *model_, *optimizer_, *layers_);
  if (const std::optional<ResumeState> st = checkpoints_->setup()) {
    restore(*st);
    spikes_->restore(*st);
  }
  dumps_ = std::make_unique<DumpRecorder>(*run_, *data_, *comms_, *model_, *optimizer_, *layers_, opt.dumps);
  fault_ = std::make_unique<Fault>(Fault::from_env());
  make_runner();
  spikes_->read_test_hook();
  outputs_->open(progress_.step, spikes_->windows());
  share_gemm_tuning(false);
  check_resumed_gemm();
  outputs_->banner(checkpoints_->on(), *acct_);
}

// The communicators (control plane MPI; data plane for the backend's
// memory), this rank's layers and schedule, its model chunks sized for the
// schedule, the optimizer on them, the stage link.
void Trainer::build_rank() {
  const RunSettings& run = *run_;
  comms_->open(run);
  *layers_ = cut_stage_layers(run.rc, run.me.pp);
  *schedule_ = make_stage_schedule(run.rc.parallel.schedule, run.rc.parallel.pp, run.me.pp, run.m, layers_->v,
                                   layers_->placement);
  model_->build(run, *layers_, *schedule_, comms_->tpc.get());
  optimizer_->build(run, *comms_, *model_, layers_->first);
  comms_->open_link(run, model_->model->boundary_dtype());
}

// The runner drives the model's chunks; it tells the accounting (compute
// times), the dump recorder (each forward) and the outputs (the trace).
void Trainer::make_runner() {
  const RunSettings& run = *run_;
  std::vector<StageChunk*> chunks;
  for (auto& c : model_->chunks) {
    stage_chunks_.push_back(std::make_unique<ModelChunk>(*c));
    chunks.push_back(stage_chunks_.back().get());
  }
  const double scale = 1.0 / (double(run.B) * run.m * run.T);  // this rank's mean; DP averages
  runner_ = std::make_unique<ScheduleRunner>(*schedule_, std::move(chunks), *comms_->link, run.mb_tokens(), scale);
  runner_->add_observer(*acct_);
  runner_->add_observer(*dumps_);
  runner_->add_observer(*outputs_);
}

Trainer::~Trainer() = default;

const StepBudget& Trainer::budget() const { return run_->budget; }
TrainProgress& Trainer::progress() { return progress_; }

// Every check before any work; all ranks agree. (Nothing here communicates:
// a failure on any rank is printed once and ends every rank before the first
// collective of the run.)
void Trainer::check_and_open_data() {
  const RunSettings& p = *run_;
  const RunConfig& rc = p.rc;
  const auto& par = rc.parallel;
  const dist::GridConfig gc{par.tp, par.pp, par.dp};
  const uint64_t data_seed = rc.data.seed >= 0 ? uint64_t(rc.data.seed) : rc.train.seed;
  dist::agree_on_setup(p.world, "wiola train", [&] {
    validate_run_config(rc);
    WIOLA_CHECK(!rc.data.path.empty() || !rc.data.blend.empty(), rc.source,
                ": data.path is not set (a "
                "manifest.json from `wiola prep`, its directory, or one .h5 shard), nor data.blend");
    WIOLA_CHECK(gc.world() == p.world.size(), "parallel.tp x pp x dp = ", par.tp, " x ", par.pp, " x ", par.dp, " = ",
                gc.world(), " ranks, but the job has ", p.world.size(), " (run with mpirun -np ", gc.world(),
                ", or change [parallel])");
    dist::validate_layout(gc, p.world.size(), rc.model.L, rc.model.Hkv, rc.model.H, rc.model.dA, rc.model.dB,
                          rc.model.V, int(p.GB), p.B, p.m);
    data_->open(p, data_seed);
    for (const auto& [step, path] : p.opt.dumps)
      WIOLA_CHECK(step >= 1 && step <= p.budget.last_step, "--dump-step ", step, ":", path, ": step outside 1..",
                  p.budget.last_step);
    CheckpointPolicy::check_setup(rc, p.world.rank());
    if (rc.train.eval_every > 0) validator_->open(data_seed);
    if (!rc.train.eval_tasks.empty()) tasks_->open(*data_);
  });
  data_->batch.resize(data_->loader->local_batch() * size_t(p.T + 1));
  if (rc.data.documents) run_->documents_eos = int32_t(data_->loader->info().eos_id);
}

void Trainer::restore(const ResumeState& st) {
  progress_.step = st.step;
  progress_.tokens = st.tokens;
  progress_.skipped = st.skipped;
  data_->loader->restore(st.loader);
}

ResumeState Trainer::resume_state() const {
  ResumeState st;
  st.step = progress_.step;
  st.tokens = progress_.tokens;
  st.skipped = progress_.skipped;
  st.applied_steps = optimizer_->adam->applied_steps();
  st.loader = data_->loader->state();
  spikes_->save_to(st);
  return st;
}

// GEMMs tuned per shape (train.cuda_gemm = auto; docs/gpu.md): every rank
// takes rank 0's choices, so that all compute with the same algorithms
// (TP-replicated weights would drift apart otherwise). At start-up the run
// folder's cache (gemm_tuning.json, an earlier run's: a resume computes as it
// did); after this process's first step, rank 0's table with what it measured
// in that step, which rank 0 then writes to the cache.
void Trainer::share_gemm_tuning(bool measured) {
  const RunConfig& rc = run_->rc;
  Ops<float>& ops = run_->ops;
  Comm& world = run_->world;
  const bool root = world.rank() == 0;
  if (rc.train.backend_options.gemm != GemmMode::Auto) return;
  const auto cache = std::filesystem::path(rc.train.run_dir) / "gemm_tuning.json";
  std::string text;
  if (root) {
    if (measured) text = ops.gemm_tuning();
    else if (std::filesystem::exists(cache)) text = read_file(cache.string());
  }
  if (world.size() > 1) {
    int64_t n = int64_t(text.size());
    world.broadcast(&n, 1, 0);
    if (!root) text.assign(size_t(n), '\0');
    if (n > 0) world.broadcast(text.data(), size_t(n), DType::U8, 0);
  }
  if (!text.empty()) ops.adopt_gemm_tuning(text);  // empty: a backend that does not tune, or no cache yet
  if (root && measured && !text.empty()) write_text_atomic(cache.string(), text);
  // A resume computes with the resumed checkpoint's choices (its manifest
  // records them), whatever the run folder's cache holds: every rank read
  // the same manifest. A table for another device is ignored, with a
  // message (check_resumed_gemm warns).
  const nlohmann::json& resumed = checkpoints_->resumed_gemm();
  if (!measured && resumed.is_object() && resumed.contains("tuning") && !resumed["tuning"].is_null())
    ops.adopt_gemm_tuning(resumed["tuning"].dump());
}

// After a resume: whether this run computes its GEMMs as the checkpoint's
// run did (train/gemm_record.h). Where not (another card or library
// version, another train.cuda_gemm, choices the device does not take) the
// run goes on with a warning: the difference is rounding, and refusing
// would strand a checkpoint on the card that wrote it; the steps from here
// are then not bit for bit those of the uninterrupted run.
void Trainer::check_resumed_gemm() {
  const nlohmann::json& resumed = checkpoints_->resumed_gemm();
  if (!run_->root() || resumed.is_null()) return;
  const std::string diff = gemm_record_difference(resumed, gemm_record(run_->ops, run_->rc.train.backend_options));
  if (diff.empty()) return;
  std::fprintf(stderr,
               "wiola: warning: the resumed checkpoint's GEMMs ran other algorithms than this run will (%s); "
               "training goes on, but not bit for bit as the uninterrupted run would have\n",
               diff.c_str());
  std::fflush(stderr);
}

// ---- the step ---------------------------------------------------------------------
StepOutcome Trainer::step(int64_t t) {
  const RunSettings& run = *run_;
  acct_->begin_step(t > 1 && !dumps_->due(t));
  const bool dumping = dumps_->begin(t);  // dump steps: the parameters and moments before the update
  StepOutcome out;

  // ==== the step's maths (docs/model.md §4, §5) ===================================
  load_batch(t);
  forward_backward(t, dumping);
  out.loss = embedding_sum_and_loss(t, dumping);
  out.z_loss = z_loss_;
  out.lr = run.budget.lr.at(t);
  dumps_->grads();                                        // dump steps: the gradient the update is about to use
  out.adam_step = optimizer_->adam->applied_steps() + 1;  // bias correction counts applied updates only
  const dist::StepResult res = update(t, out.lr, out.adam_step);
  // ==== end of the step's maths ===================================================

  out.grad_norm = res.grad_norm;
  out.skipped = res.skipped;
  if (res.skipped) ++progress_.skipped;
  dumps_->finish(t, out);
  progress_.step = t;
  progress_.tokens += run.GB * run.T;
  out.seconds = acct_->end_step();
  return out;
}

void Trainer::load_batch(int64_t t) {
  auto data = acct_->phase(Phase::Data);
  dist::set_context(run_->step_context(t) + " data");
  fault_->inject(run_->world.rank(), t);
  acct_->stragglers().inject_delay();
  data_->loader->next_batch(data_->batch.data());
  if (run_->documents_eos >= 0) count_targets();
}

// Documents (docs/model.md §2 "Documents"): the loss is the mean over the
// global batch's counted targets, so each rank scales its CE sum by DP over
// their number (the DP mean of the gradients then divides by DP).
void Trainer::count_targets() {
  const RunSettings& run = *run_;
  double n = double(counted_targets(data_->batch.data(), int(data_->loader->local_batch()), run.T, run.documents_eos));
  if (run.rc.parallel.dp > 1) comms_->grid->dp().all_reduce(&n, &n, 1, DType::F64, ReduceOp::Sum);
  counted_targets_ = std::max(n, 1.0);  // a batch of nothing but EOS: no loss, no gradient
  runner_->set_loss_scale(double(run.rc.parallel.dp) / counted_targets_);
}

// Forward and backward over the schedule (train/schedule_runner.h); the
// gradients accumulate from zero (the model starts so, and every optimizer
// step leaves them so: AdamWConfig::zero_grads). Dump steps read the
// gradients whole: no overlapped DP reduction then.
void Trainer::forward_backward(int64_t t, bool dumping) {
  auto schedule = acct_->phase(Phase::Schedule);
  runner_->run(t, run_->step_context(t), data_->batch.data(), optimizer_->overlap && !dumping);
}

// The tied embedding: the first stage's lookup gradient plus the last
// stage's head gradient, identical on both afterwards. Then the loss, the
// mean CE over the global batch. (Communication, all of it.)
double Trainer::embedding_sum_and_loss(int64_t t, bool dumping) {
  auto comm = acct_->phase(Phase::Comm);
  dist::set_context(run_->step_context(t) + " embedding gradient sum");
  float* grads = model_->model->grads();
  const ParamEntry* embed = model_->embed;
  if (embed && layers_->embed_split)
    comms_->grid->data(GroupKind::Embed)
        .all_reduce(grads + embed->offset, grads + embed->offset, embed->size(), DType::F32, ReduceOp::Sum);
  // (Its span: the padding after it belongs to no other report.)
  if (embed && optimizer_->overlap && !dumping) optimizer_->adam->grad_ready(embed->offset, embed->span);
  const double targets = run_->documents_eos >= 0 ? counted_targets_ : double(run_->GB * run_->T);
  const double loss = world_loss() / targets;
  z_loss_ = z_loss_sum_ / targets;
  return loss;
}

// The DP reduction (bucketed; it may have started during the backward),
// the norm over the model-parallel group, clip, skip a non-finite step,
// AdamW on this rank's shard, the parameters gathered back.
dist::StepResult Trainer::update(int64_t t, double lr, int64_t adam_step) {
  dist::set_context(run_->step_context(t) + " optimizer");
  auto opt = acct_->phase(Phase::Optimizer);
  return optimizer_->adam->step(lr, adam_step);  // refreshes the weight copy too
}

// Sum over the world of the last stage's CE sums (tp rank 0 of each DP
// replica's last stage contributes; the z-loss sum beside it, kept in
// z_loss_sum_): the control plane, host doubles.
// ATM's figures ride along (this rank's in, the job-wide sums out to the
// accounting), so the accounting adds no collective of its own.
double Trainer::world_loss() {
  const RunSettings& run = *run_;
  const double local = model_->head().take_loss_sum(), local_z = model_->head().take_z_loss_sum();
  const AtmSaving& mine = acct_->step_atm();
  const bool speaks = layers_->last && run.me.tp == 0;
  double sums[5] = {speaks ? local : 0.0, mine.mu_sum, mine.layers, mine.saved_flops, speaks ? local_z : 0.0};
  if (run.world.size() > 1) run.world.all_reduce(sums, 5, ReduceOp::Sum);
  acct_->job_atm() = {sums[1], sums[2], sums[3]};
  z_loss_sum_ = sums[4];
  return sums[0];
}

StepOutcome Trainer::skip_data_step(int64_t t) {
  const RunSettings& p = *run_;
  acct_->begin_step(false);
  {
    auto data = acct_->phase(Phase::Data);
    dist::set_context(p.step_context(t) + " data (skipped window)");
    data_->loader->next_batch(data_->batch.data());  // read and dropped: the data after the window is the same
  }
  StepOutcome out;
  out.loss = out.grad_norm = out.z_loss = std::nan("");
  out.lr = p.budget.lr.at(t);
  out.adam_step = optimizer_->adam->applied_steps();
  progress_.step = t;
  out.seconds = acct_->end_step();
  return out;
}

double Trainer::evaluate() { return validator_->validate(); }

void Trainer::rewind(int64_t t, const std::string& why) {
  const std::string at = spikes_->check_rewind(t, why);
  std::string folder;
  const ResumeState st = checkpoints_->rewind(t, at, folder);
  restore(st);
  spikes_->rewound(t, why, at, folder, st);
  outputs_->rewound(st.step, spikes_->windows());
}

// ---- the run ----------------------------------------------------------------------
TrainSummary Trainer::run() {
  const RunSettings& p = *run_;
  const int64_t last_step = p.budget.last_step, resumed_from = checkpoints_->resumed_from();
  TrainSummary sum;
  sum.t_max = p.budget.t_max;
  if (progress_.step >= last_step) {  // resumed at the end: the report of the run stands
    sum.steps = progress_.step;
    sum.resumed_from = resumed_from;
    sum.skipped = progress_.skipped;
    if (p.root())
      std::printf("wiola train: nothing to do: the checkpoint is at step %lld, the run's last step\n",
                  (long long)progress_.step);
    return sum;
  }
  const int64_t first = progress_.step + 1;
  for (int64_t t = first; t <= last_step; ++t) {
    const bool data_skip = spikes_->skipping(t);
    outputs_->trace_begin(t);
    const StepOutcome out = data_skip ? skip_data_step(t) : step(t);
    // After the step: spike detection (before any save: a spike's update is
    // never saved), validation, checkpoints, accounting and the log.
    if (spikes_->on() && !data_skip) {
      std::string why;
      if (spikes_->detected(t, out, why)) {
        rewind(t, why);
        t = progress_.step;  // the loop goes on with the window's first step
        continue;
      }
    }
    if (!data_skip && !gemm_shared_) {
      share_gemm_tuning(true);
      gemm_shared_ = true;
    }
    acct_->count_run_step(t, out.seconds);
    if (t == resumed_from + 1) sum.first_loss = out.loss;  // this run's first step
    sum.last_loss = out.loss;
    sum.steps = t;
    const bool eval_now = validator_->due(t, last_step);
    if (t == last_step) acct_->keep_atm_stats();  // before eval (ATM off)
    if (eval_now) sum.val_loss = evaluate();
    if (tasks_->due(t, last_step)) outputs_->record_tasks(sum.tasks = tasks_->evaluate());
    bool stop = false;
    {
      auto checkpoint = acct_->phase(Phase::Checkpoint);
      const bool local_stop = p.opt.stop_requested && p.opt.stop_requested();
      stop = checkpoints_->after_step(t, local_stop, [this] { return resume_state(); });
    }
    StepOutcome logged = out;
    logged.checkpoint_seconds = acct_->step_times().checkpoint;
    const bool unusual = dumps_->due(t) || data_skip;  // not a step of the accounting's means
    acct_->close_step(t, t > 1 && !unusual, last_step);
    outputs_->log_step(t, logged, eval_now, progress_, *acct_, *validator_, *spikes_, checkpoints_->on());
    outputs_->trace_end();
    if (stop) {
      sum.stopped = true;
      break;
    }
  }
  sum.resumed_from = resumed_from;
  sum.skipped = progress_.skipped;
  const int64_t done = sum.steps > resumed_from ? sum.steps - resumed_from : 0;
  sum.tokens_per_s = acct_->run_seconds() > 0 ? double(done * p.GB * p.T) / acct_->run_seconds() : 0.0;
  if (sum.stopped && p.root())
    std::printf(
        "wiola train: stopped at step %lld on request, checkpoint written; run again to resume "
        "(exit status %d)\n",
        (long long)sum.steps, kExitPreempted);
  outputs_->report(sum, *acct_);
  // mpirun kills the other ranks as soon as one exits non-zero (75 after a
  // stop): nobody leaves before rank 0 has written the report.
  if (p.world.size() > 1) p.world.barrier();
  return sum;
}

TrainSummary run_training(const RunConfig& rc, const TrainOptions& opt, Ops<float>& ops, Comm& world) {
  dist::set_comm_timeout(rc.parallel.comm_timeout_s);  // before the Trainer's first collective
  Trainer trainer(rc, opt, ops, world);
  return trainer.run();
}

}  // namespace wiola
