#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "data/sha256.h"
#include "dist/agree.h"
#include "dist/diagnostics.h"
#include "dist/grid.h"
#include "dist/rank_states.h"
#include "dist/schedule.h"
#include "dist/staged_comm.h"
#include "dist/tp_collectives.h"
#include "kernels/backend.h"
#include "kernels/cpu_info.h"
#include "model/flops.h"
#include "model/model.h"
#include "perf/cost_model.h"
#include "train/accounting.h"
#include "train/dump.h"
#include "train/checkpointer.h"
#include "train/data_plane.h"
#include "train/gather.h"
#include "train/gemm_record.h"
#include "train/run_report.h"
#include "train/schedule.h"
#include "train/spike_policy.h"
#include "train/stage_link.h"
#include "train/stragglers.h"
#include "train/tensorboard.h"
#include "data/text_input.h"
#include "util/error.h"
#include "util/files.h"

namespace wiola {
namespace {

using Clock = std::chrono::steady_clock;
using dist::Comm;
using dist::DType;
using dist::GroupKind;
using dist::ReduceOp;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string human_duration(double s) {
  char buf[64];
  const long v = long(s + 0.5);
  if (v >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", v / 3600, (v / 60) % 60);
  else if (v >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", v / 60, v % 60);
  else std::snprintf(buf, sizeof buf, "%lds", v);
  return buf;
}

// Fault injection for the failure-path tests: WIOLA_FAULT=KIND:RANK:STEP
// makes world rank RANK, at the start of step STEP, throw ("fail") or stop
// answering ("stall"). Off unless the variable is set.
struct Fault {
  std::string kind;
  int rank = -1;
  int64_t step = -1;
};
Fault fault_from_env() {
  Fault f;
  const char* v = std::getenv("WIOLA_FAULT");
  if (!v || !*v) return f;
  const std::string s(v);
  const auto a = s.find(':'), b = s.rfind(':');
  WIOLA_CHECK(a != std::string::npos && b > a, "WIOLA_FAULT='", s, "': expected KIND:RANK:STEP");
  f.kind = s.substr(0, a);
  WIOLA_CHECK(f.kind == "fail" || f.kind == "stall", "WIOLA_FAULT='", s, "': KIND is fail or stall");
  f.rank = std::atoi(s.substr(a + 1, b - a - 1).c_str());
  f.step = std::atoll(s.substr(b + 1).c_str());
  return f;
}
void inject_fault(const Fault& f, int rank, int64_t step) {
  if (f.rank != rank || f.step != step) return;
  if (f.kind == "fail") fail("injected fault (WIOLA_FAULT) at step ", step);
  if (f.kind == "stall")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until the job is aborted
}

// Test hook of the loss-spike policy: WIOLA_INJECT_LOSS_SPIKE=STEP makes the
// loss the detection sees at step STEP 1000 times larger, the first time this
// process runs that step (training itself is unchanged). -1: off.
int64_t spike_injection_from_env() {
  const char* v = std::getenv("WIOLA_INJECT_LOSS_SPIKE");
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long long step = std::strtoll(v, &end, 10);
  WIOLA_CHECK(*end == 0 && step >= 1, "WIOLA_INJECT_LOSS_SPIKE='", v, "': expected a step number >= 1");
  return step;
}

// `w` added to the sorted, disjoint windows `list` (overlapping or adjacent
// ones merge).
void add_window(std::vector<StepWindow>& list, StepWindow w) {
  list.push_back(w);
  std::sort(list.begin(), list.end(), [](const StepWindow& a, const StepWindow& b) { return a.from < b.from; });
  std::vector<StepWindow> merged;
  for (const StepWindow& x : list) {
    if (!merged.empty() && x.from <= merged.back().to + 1) merged.back().to = std::max(merged.back().to, x.to);
    else merged.push_back(x);
  }
  list = std::move(merged);
}

nlohmann::json windows_json(const std::vector<StepWindow>& list) {
  nlohmann::json j = nlohmann::json::array();
  for (const StepWindow& x : list) j.push_back({x.from, x.to});
  return j;
}

std::map<std::string, dist::CommTraffic> traffic_snapshot(dist::Grid& grid) {
  std::map<std::string, dist::CommTraffic> s;
  for (auto k : {GroupKind::Tp, GroupKind::Pp, GroupKind::Dp, GroupKind::Embed, GroupKind::Mp})
    s[dist::group_name(k)] = grid.traffic(k);
  return s;
}

// A blend's sources, their shares, and how often the run's T_max steps visit
// each (a source visited many times over is repeated data).
void print_blend(const TokenLoader& ld, int64_t run_samples) {
  for (size_t k = 0; k < ld.num_sources(); ++k) {
    const double share = ld.source_share(k), S = double(ld.source_info(k).num_samples);
    std::printf("    source %zu: %s, share %.4f, %llu samples, %.3g epochs over the run\n", k + 1,
                ld.source_name(k).c_str(), share, (unsigned long long)ld.source_info(k).num_samples,
                double(run_samples) * share / S);
  }
}

nlohmann::json blend_json(const std::vector<BlendSource>& blend) {
  nlohmann::json j = nlohmann::json::array();
  for (const BlendSource& b : blend) j.push_back({{"path", b.path}, {"weight", b.weight}});
  return j;
}

}  // namespace

StepBudget StepBudget::of(const RunConfig& rc) {
  const TrainSection& tr = rc.train;
  const int64_t GB = rc.global_batch(), T = rc.model.T;
  StepBudget b;
  b.t_max = tr.steps;
  b.source = "train.steps";
  if (b.t_max == 0 && tr.tokens > 0) { b.t_max = steps_for_tokens(tr.tokens, GB, int(T)); b.source = "train.tokens"; }
  if (b.t_max == 0) { b.t_max = chinchilla_steps(rc.model.param_count(), GB, int(T)); b.source = "Chinchilla 20 N"; }
  b.warmup = tr.warmup >= 0 ? tr.warmup : default_warmup(b.t_max);
  b.last_step = tr.max_steps > 0 ? std::min(b.t_max, tr.max_steps) : b.t_max;
  return b;
}

// ---- the run's state -----------------------------------------------------------
// Construction order is the setup order: loaders (checked before any
// collective), grid, model, optimizer, metrics writer.
struct Trainer::State {
  const RunConfig& rc;
  TrainOptions opt;
  Ops<float>& ops;
  Comm& world;
  StepBudget budget;
  int B, T, m;        // micro-batch, sequence length, micro-batches per step
  int64_t GB;         // global batch (sequences)
  dist::GridCoord me;
  std::unique_ptr<TokenLoader> loader;
  // Validation: the data's "val" split, or of a blend each source's that has
  // one (evaluated one by one, so each gets its own loss).
  struct ValSource {
    std::unique_ptr<TokenLoader> loader;
    LoaderState start;
    size_t source = 0;  // in data.blend
    double share = 1;   // of the blend
  };
  std::vector<ValSource> vals;
  std::vector<double> last_val_sources;  // per blend source (NaN: left out)
  std::unique_ptr<dist::Grid> grid;
  std::string data_plane;  // what carries backend tensors: "nccl", "mpi", "mpi-staged"
  std::vector<std::pair<int, int>> stages;  // layer range of every stage
  int l0 = 0, l1 = 0;
  bool first = true, last = true;
  std::vector<dist::Action> actions;        // this stage's schedule
  int slots = 1;                            // activation slots the schedule needs
  std::unique_ptr<dist::CommTpCollectives> tpc;
  std::unique_ptr<Model<float>> model;
  std::unique_ptr<dist::DistAdamW> adam;
  bool zero = false, overlap = false;
  const ParamEntry* embed = nullptr;        // the tied embedding, if this stage holds it
  std::unique_ptr<StageLink> link;
  std::map<int64_t, std::string> dumps;
  std::filesystem::path run_dir;
  std::ofstream metrics;                    // world rank 0
  std::ofstream schedule_trace;             // TrainOptions::trace_schedule: this rank's executed actions
  TrainProgress progress;
  std::vector<int32_t> batch;               // this rank's slice of the global batch
  Fault fault;
  RunMeasure measure;
  double ema_step_s = 0, train_s = 0, last_val = -1;
  std::vector<Model<float>::AtmStats> atm_stats;  // of the last training step
  // Accounting (train/accounting.h): the step in progress, sums over the
  // accounted steps (2.., not dump steps), the job-wide view of the last.
  bool sync_phases = false;                 // a device backend: synchronise at phase ends
  DevicePeak peak;                          // this rank's MFU denominator
  double job_peak = 0;                      // the sum over ranks
  double step_flops = 0;                    // the job's model FLOPs per step
  StepTimes cur, acc_times;                 // this step, this rank; sum over accounted steps
  int64_t acc_steps = 0;
  double acc_step_s = 0, self_s = 0;        // accounted steps' seconds; the accounting's own
  AtmSaving step_atm, atm;                  // this rank's last step; job-wide (summed with the loss)
  std::unique_ptr<Checkpointer> ckpt;       // checkpoint.dir or init_from set
  Clock::time_point last_save = Clock::now();
  int64_t resumed_from = 0;
  int saves = 0;
  // Monitoring (docs/performance.md): this rank's state for timeout
  // diagnostics (RUN_DIR/ranks), per-rank step times, TensorBoard (rank 0).
  std::unique_ptr<dist::RankStateBoard> board;
  std::unique_ptr<StragglerWatch> stragglers;
  std::unique_ptr<TensorBoardWriter> tb;
  // Loss-spike policy (docs/checkpoints.md "Loss spikes"): the data windows
  // skipped (train.skip_batches, plus the rewinds' and a resumed
  // checkpoint's), the rewinds made, the detection window's losses (oldest
  // first), the current run of consecutive skipped steps.
  bool spike_on = false;
  std::vector<StepWindow> windows;
  int64_t rewinds = 0;
  SpikeDetector spike;                  // the window's losses, the run of skipped steps
  int64_t inject_spike = -1;            // WIOLA_INJECT_LOSS_SPIKE (test hook)
  nlohmann::json pending_rewind;        // rank 0: goes into the next metrics record
  bool gemm_shared = false;
  nlohmann::json resumed_gemm;  // the resumed checkpoint's GEMM record (train/gemm_record.h); null: none

  State(const RunConfig& r, const TrainOptions& o, Ops<float>& b, Comm& w)
      : rc(r), opt(o), ops(b), world(w), budget(StepBudget::of(r)), B(r.train.micro_batch),
        T(r.model.T), m(r.train.grad_accum), GB(r.global_batch()),
        spike_on(r.train.spike_sigma > 0 || r.train.spike_skipped > 0), windows(r.train.skip_batches),
        spike(SpikeSettings{r.train.spike_sigma, r.train.spike_window, r.train.spike_skipped}) {}
  // Step t's data lies in a skipped window.
  bool skipping(int64_t t) const {
    for (const StepWindow& w : windows)
      if (t >= w.from && t <= w.to) return true;
    return false;
  }
  // A step of a skipped window: its global batch read and dropped.
  StepOutcome skip_data_step(int64_t t);
  // After step t (not a skipped one): whether it is a spike, agreed by all
  // ranks (rank 0 decides); `why` says what, on rank 0.
  bool spike_detected(int64_t t, const StepOutcome& out, std::string& why);
  // Collective: back to the newest checkpoint c, window [c+1, t] skipped.
  void rewind(int64_t t, const std::string& why);
  // Rank 0: metrics.jsonl without the records after `step`.
  void cut_metrics(int64_t step);
  // Rank 0: RUN_DIR/config.toml, with the skip list in effect.
  void write_config_toml() const {
    RunConfig c = rc;
    c.train.skip_batches = windows;
    write_text_atomic((run_dir / "config.toml").string(), run_config_to_toml(c));
  }
  bool root() const { return world.rank() == 0; }
  size_t mb_tokens() const { return size_t(B) * (T + 1); }

  void check_and_open_data();
  void open_validation(uint64_t data_seed);
  double validation_loss(ValSource& v);
  void build_grid_and_schedule();
  void build_model_and_optimizer();
  void setup_checkpoints();
  void open_outputs();
  void share_gemm_tuning(bool measured);
  void check_resumed_gemm();
  void measure_peak();
  // After step t: closes the step's times and adds them to the run's.
  void account_step(int64_t t, bool dumping);
  MemoryUse memory_use() const;
  ResumeState resume_state() const {
    ResumeState st;
    st.step = progress.step;
    st.tokens = progress.tokens;
    st.skipped = progress.skipped;
    st.applied_steps = adam->applied_steps();
    st.loader = loader->state();
    st.spike = spike_on || !windows.empty();
    st.skip_batches = windows;
    st.rewinds = rewinds;
    st.consecutive_skipped = spike.state().consecutive_skipped;
    st.recent_losses = spike.state().recent_losses;
    return st;
  }
  nlohmann::json checkpoint_info() const;
  void attach_tokenizer();
  // Sum over the world of the last stage's CE sums (tp rank 0 of each DP
  // replica's last stage contributes): the control plane, host doubles.
  // ATM's figures of this step ride along (job-wide sums into `atm`), so
  // the accounting adds no collective of its own.
  double world_loss() {
    const double local = model->take_loss_sum();
    double v[4] = {(last && me.tp == 0) ? local : 0.0, step_atm.mu_sum, step_atm.layers, step_atm.saved_flops};
    if (world.size() > 1) world.all_reduce(v, 4, ReduceOp::Sum);
    atm = {v[1], v[2], v[3]};
    return v[0];
  }
  // Dumps: a flat backend buffer of this rank as full tensors on rank 0.
  std::vector<float> gather_backend(const float* buf) {
    std::vector<float> host(model->n_params());
    ops.download(host.data(), buf, host.size() * sizeof(float));
    return gather_full(*grid, rc.model, model->layout(), host, stages);
  }
  // Dump steps: parameters and (after step 1) AdamW moments before the step.
  void dump_state_before(int64_t t, StepDump& dump) {
    model->set_keep_logits(world.size() == 1);
    dump.params = gather_backend(model->params());
    if (t == 1) return;
    std::vector<float> mm, vv;
    adam->gather_moments(mm, vv);
    dump.m = gather_full(*grid, rc.model, model->layout(), mm, stages);
    dump.v = gather_full(*grid, rc.model, model->layout(), vv, stages);
  }
  // Dump steps: the gradient of the mean loss, the DP mean of the replicas'.
  void dump_grads(StepDump& dump) {
    std::vector<float> host(model->n_params());
    ops.download(host.data(), model->grads(), host.size() * sizeof(float));
    if (rc.parallel.dp > 1) {
      grid->dp().all_reduce(host.data(), host.size(), ReduceOp::Sum);
      for (float& x : host) x /= float(rc.parallel.dp);
    }
    dump.grads = gather_full(*grid, rc.model, model->layout(), host, stages);
  }
  // Adds what each group moved since `before` to the run's measurements.
  void measure_traffic(const std::map<std::string, dist::CommTraffic>& before) {
    for (const auto& [k, v] : traffic_snapshot(*grid)) {
      auto& acc = measure.traffic[k];
      acc.ops += v.ops - before.at(k).ops;
      acc.payload_bytes += v.payload_bytes - before.at(k).payload_bytes;
      acc.wire_bytes += v.wire_bytes - before.at(k).wire_bytes;
    }
    ++measure.steps;
  }
};

// Every check before any work; all ranks agree. (Nothing here communicates:
// a failure on any rank is printed once and ends every rank before the first
// collective of the run.)
void Trainer::State::check_and_open_data() {
  const auto& par = rc.parallel;
  const dist::GridConfig gc{par.tp, par.pp, par.dp};
  me = dist::grid_coord(gc, world.rank());
  const uint64_t data_seed = rc.data.seed >= 0 ? uint64_t(rc.data.seed) : rc.train.seed;
  dist::agree_on_setup(world, "wiola train", [&] {
    validate_run_config(rc);
    WIOLA_CHECK(!rc.data.path.empty() || !rc.data.blend.empty(), rc.source, ": data.path is not set (a "
                "manifest.json from `wiola prep`, its directory, or one .h5 shard), nor data.blend");
    WIOLA_CHECK(gc.world() == world.size(), "parallel.tp x pp x dp = ", par.tp, " x ", par.pp, " x ",
                par.dp, " = ", gc.world(), " ranks, but the job has ", world.size(),
                " (run with mpirun -np ", gc.world(), ", or change [parallel])");
    dist::validate_layout(gc, world.size(), rc.model.L, rc.model.Hkv, rc.model.H, rc.model.dA,
                          rc.model.dB, rc.model.V, int(GB), B, m);
    loader = std::make_unique<TokenLoader>(rc.data_sources(), "train", T, int(GB), me.dp, par.dp, data_seed,
                                           rc.data.shuffle, rc.data.prefetch > 0, size_t(rc.data.max_open_shards));
    loader->expect(uint32_t(rc.model.V));
    for (const auto& [step, path] : opt.dumps)
      WIOLA_CHECK(step >= 1 && step <= budget.last_step, "--dump-step ", step, ":", path,
                  ": step outside 1..", budget.last_step);
    if (!rc.checkpoint.dir.empty() && world.rank() == 0) {
      Checkpointer::prepare_dir(rc.checkpoint.dir);
      // A fresh run beside another run's checkpoints would mix the two (a
      // later resume takes the newest step, whichever run wrote it).
      const auto there = ckpt::list_checkpoints(rc.checkpoint.dir, true);
      WIOLA_CHECK(rc.checkpoint.resume || there.empty(), "checkpoint.resume = false, but checkpoint.dir '",
                  rc.checkpoint.dir, "' already holds checkpoints (", there.front(),
                  "...); use an empty directory, or move them away");
    }
    if (!rc.checkpoint.init_from.empty()) (void)ckpt::resolve_checkpoint(rc.checkpoint.init_from);
    if (rc.train.eval_every > 0) open_validation(data_seed);
  });
  batch.resize(loader->local_batch() * size_t(T + 1));
}

// The validation loaders: the "val" split of the data, or one for each
// blended source whose split is long enough (a small source may have none; it
// is left out with a warning, and the others keep their relative shares).
void Trainer::State::open_validation(uint64_t data_seed) {
  const auto& par = rc.parallel;
  const std::vector<BlendSource> sources = rc.data_sources();
  auto open = [&](size_t k) {
    auto ld = std::make_unique<TokenLoader>(sources[k].path, "val", T, B * par.dp, me.dp, par.dp, data_seed, false,
                                            false, size_t(rc.data.max_open_shards));
    const LoaderState start = ld->state();
    vals.push_back({std::move(ld), start, k, loader->source_share(k)});
  };
  if (sources.size() == 1) return open(0);
  for (size_t k = 0; k < sources.size(); ++k) {
    try {
      open(k);
    } catch (const Error& e) {
      if (root())
        std::fprintf(stderr, "wiola train: warning: validation leaves out blend source %zu: %s\n", k + 1, e.what());
    }
  }
  WIOLA_CHECK(!vals.empty(), "train.eval_every is set, but no source of data.blend has a usable \"val\" split "
              "(see the warnings above); set train.eval_every = 0");
}

// The communicators (control plane MPI; data plane for the backend's
// memory), this rank's pipeline stage and its schedule.
void Trainer::State::build_grid_and_schedule() {
  const auto& par = rc.parallel;
  // Ranks that share a GPU (several ranks on one device) cannot use NCCL.
  const std::string shared_gpu = world.size() > 1 ? ranks_sharing_a_gpu(ops, world) : "";
  DataPlane plane = choose_data_plane(ops, par.data_plane, world.size(), shared_gpu);
  data_plane = plane.name;
  if (root() && !shared_gpu.empty() && par.data_plane == "auto")
    std::fprintf(stderr, "wiola train: %s: tensors between ranks go through host memory (NCCL needs a GPU "
                 "per rank)\n", shared_gpu.c_str());
  grid = std::make_unique<dist::Grid>(dist::GridConfig{par.tp, par.pp, par.dp}, world, plane.factory);
  // TP ranks compute the TP-replicated tensors (norm γ/δ, φ, W_f) each on
  // its own; OpenBLAS's results depend on the thread count, so replicas
  // stay bit-identical only when a TP group shares one (checkpoints write
  // them once and check they agree).
  if (par.tp > 1) {
    const int64_t mine = cpu_threads();
    std::vector<int64_t> all(size_t(par.tp));
    grid->tp().all_gather(&mine, all.data(), 1, DType::I64);
    for (int r = 0; r < par.tp; ++r)
      if (all[size_t(r)] != mine) {
        if (me.tp != 0) throw dist::SetupFailed();
        fail("the TP ranks of stage ", me.pp, " (dp ", me.dp, ") use different thread counts (", mine, " and ",
             all[size_t(r)], "); set train.threads (or OMP_NUM_THREADS) the same on every rank of a TP group");
      }
  }
  stages = perf::pipeline_stages(rc.model, par.pp, par.stage_balance);
  std::tie(l0, l1) = stages[size_t(me.pp)];
  first = grid->first_stage();
  last = grid->last_stage();
  actions = par.schedule == "gpipe"   ? dist::schedule_gpipe(par.pp, me.pp, m)
            : par.schedule == "zb-h1" ? dist::schedule_zb_h1(par.pp, me.pp, m)
                                      : dist::schedule_1f1b(par.pp, me.pp, m);
  slots = std::max(1, dist::max_in_flight(actions));
}

void Trainer::State::build_model_and_optimizer() {
  const auto& par = rc.parallel;
  const TrainSection& tr = rc.train;
  if (par.tp > 1) tpc = std::make_unique<dist::CommTpCollectives>(grid->data(GroupKind::Tp));
  ModelOptions mo;
  mo.micro_batch = B;
  mo.recompute = tr.recompute;
  mo.slots = slots;
  mo.split_backward = par.schedule == "zb-h1";  // B and W as separate actions
  mo.weight_slots = std::max(1, dist::max_pending_weight(actions));  // micro-batches between B and W
  mo.param_align = opt.param_align;
  model = std::make_unique<Model<float>>(ops, rc.model, ModelShard{me.tp, par.tp, l0, l1}, tpc.get(), mo);
  model->init(tr.seed);

  dist::AdamWConfig ac;
  ac.beta1 = tr.beta1; ac.beta2 = tr.beta2; ac.eps = tr.adam_eps;
  ac.weight_decay = tr.weight_decay; ac.clip = tr.clip;
  ac.zero = zero = par.zero && par.dp > 1;
  ac.nonfinite_fatal = tr.nonfinite_fatal;
  ac.zero_grads = true;  // each step leaves them zero for the next (the model starts with them zero)
  const bool dp = par.dp > 1;
  adam = std::make_unique<dist::DistAdamW>(
      ops, model->params(), model->grads(), model->n_params(),
      dist::optimizer_segments(model->layout().entries(), me.tp, !(par.pp > 1 && !first)), ac,
      dp ? &grid->data(GroupKind::Dp) : nullptr, world.size() > 1 ? &grid->mp() : nullptr,
      dp ? &grid->dp() : nullptr);
  adam->set_weight_copy(model->weight_copy());  // no Model::refresh_weights after a step
  // Overlap: the last micro-batch's backward reports finished layers, whose
  // buckets start their DP reduction while earlier layers still compute.
  overlap = par.overlap && dp;
  if (overlap) model->set_grad_ready([this](size_t off, size_t n) { adam->grad_ready(off, n); });
  embed = model->layout().try_find("model.embed_tokens.weight");
  link = std::make_unique<StageLink>(ops, grid->data(GroupKind::Pp), model->boundary_dtype(),
                                     size_t(B) * T * rc.model.d);
}

// The MFU denominator: every rank finds its peak at the same time (ranks
// that share cores measure their share), the job's is the sum.
void Trainer::State::measure_peak() {
  sync_phases = rc.train.accounting && !ops.host_accessible();
  step_flops = train_step_flops(rc.model, int(GB));
  if (world.size() > 1) world.barrier();
  peak = device_peak(ops, rc);
  job_peak = world.size() > 1 ? world.all_reduce_value(peak.flops, ReduceOp::Sum) : peak.flops;
}

MemoryUse Trainer::State::memory_use() const {
  const auto mm = model->memory();
  MemoryUse u;
  u.params = double(mm.master + mm.weights);
  u.grads = double(mm.grads);
  u.optimizer = double(adam->state_bytes_this_rank());
  u.activations = double(mm.activations + mm.workspace);
  u.peak = ops.host_accessible() ? peak_rss_mib() * 1048576.0 : double(ops.peak_bytes());
  return u;
}

void Trainer::State::account_step(int64_t t, bool dumping) {
  SelfTimer self(self_s);
  cur.set_other();
  if (t > 1 && !dumping) {
    acc_times.add(cur);
    acc_step_s += cur.total - cur.checkpoint;
    ++acc_steps;
  }
}

// What a manifest records about the run besides its identity (informative:
// resume checks only the identity).
nlohmann::json Trainer::State::checkpoint_info() const {
  const auto& par = rc.parallel;
  nlohmann::json st = nlohmann::json::array();
  for (const auto& [a, b] : stages) st.push_back({a, b});
  const auto pr = ops.precision();
  return {{"config", run_config_to_toml(rc)},
          {"layout", {{"tp", par.tp}, {"pp", par.pp}, {"dp", par.dp}, {"zero", zero}, {"stages", st}}},
          {"backend", ops.name()},
          {"backend_options", backend_option_fields(rc.train.backend_options)},
          {"precision", {{"activations", dist::dtype_name(pr.act)}, {"residual", dist::dtype_name(pr.residual)},
                         {"weights", dist::dtype_name(pr.weight)}}},
          {"threads_per_rank", cpu_threads()},
          {"simd", cpu_simd_target()},  // the kernels' run-time target on this rank
          {"cpu", host_cpu_model()},
          {"schedule", {{"t_max", budget.t_max}, {"warmup", budget.warmup}, {"lr_max", rc.train.lr_max},
                        {"lr_min", rc.train.lr_min}}},
          {"data_path", rc.data.path},
          {"data_blend", blend_json(rc.data.blend)}};
}

// Resume from checkpoint.dir's newest sound checkpoint, or a weights-only
// start from checkpoint.init_from (a resume wins: a preempted fine-tuning
// run continues from its own checkpoints).
void Trainer::State::setup_checkpoints() {
  const auto& cc = rc.checkpoint;
  if (cc.dir.empty() && cc.init_from.empty()) return;
  dist::set_context("checkpoint setup");
  ckpt = std::make_unique<Checkpointer>(rc, *grid, ops, *model, *adam, stages,
                                        run_identity(rc, loader->info(), loader.get()), checkpoint_info());
  std::string folder;
  if (!cc.dir.empty() && cc.resume) folder = ckpt->find_resume();
  if (!folder.empty()) {
    const ResumeState st = ckpt->resume(folder);
    progress.step = st.step;
    progress.tokens = st.tokens;
    progress.skipped = st.skipped;
    loader->restore(st.loader);
    resumed_from = st.step;
    resumed_gemm = st.gemm;
    for (const StepWindow& w : st.skip_batches) add_window(windows, w);
    rewinds = st.rewinds;
    spike.restore({st.recent_losses, st.consecutive_skipped});
    if (root())
      std::printf("wiola train: resuming from %s (step %lld, %lld tokens, layout of this run: tp %d x pp %d x dp %d)\n",
                  folder.c_str(), (long long)st.step, (long long)st.tokens, rc.parallel.tp, rc.parallel.pp,
                  rc.parallel.dp);
  } else if (!cc.init_from.empty()) {
    ckpt->load_weights(cc.init_from);
    if (root())
      std::printf("wiola train: weights from %s (new optimizer state, data from the start)\n",
                  ckpt::resolve_checkpoint(cc.init_from).c_str());
  }
  if (cc.dir.empty()) ckpt.reset();  // init_from only: nothing to save
  if (ckpt && root()) attach_tokenizer();
  std::fflush(stdout);
}

// The tokenizer the data was made with (the prep manifest names it, with its
// SHA-256) goes into every checkpoint. One that has moved or changed since
// prep is left out with a warning: the tools then ask for --tokenizer.
void Trainer::State::attach_tokenizer() {
  const DatasetInfo& di = loader->info();
  const auto skip = [&](const std::string& why) {
    std::fprintf(stderr, "wiola train: warning: checkpoints will not carry the tokenizer (%s); "
                         "generate and export will need --tokenizer\n", why.c_str());
  };
  if (di.tokenizer_file.empty()) return skip("the data source names no tokenizer file");
  std::string text;
  try {
    text = read_file(di.tokenizer_file);
  } catch (const Error& e) {
    return skip(e.what());
  }
  std::string sha = sha256_hex(text);
  if (sha != di.tokenizer_sha256)
    return skip(di.tokenizer_file + " changed since prep (sha256 " + sha.substr(0, 12) + "…, the data's " +
                di.tokenizer_sha256.substr(0, 12) + "…)");
  ckpt->set_tokenizer(std::move(text), std::move(sha));
}

// metrics.jsonl: a fresh run starts it; a resumed run cuts it back to the
// checkpoint's step (atomically) and appends, so no step appears twice.
void Trainer::State::open_outputs() {
  dumps.insert(opt.dumps.begin(), opt.dumps.end());
  run_dir = rc.train.run_dir;
  fault = fault_from_env();
  if (spike_on) inject_spike = spike_injection_from_env();
  if (opt.trace_schedule) {
    const auto dir = run_dir / "schedule_trace";
    std::filesystem::create_directories(dir);
    const auto path = dir / ("rank" + std::to_string(world.rank()) + ".txt");
    schedule_trace.open(path, progress.step > 0 ? std::ios::app : std::ios::trunc);
    WIOLA_CHECK(schedule_trace.good(), "cannot write '", path.string(), "'");
  }
  if (!root()) return;
  std::filesystem::create_directories(run_dir);
  write_config_toml();
  const auto path = run_dir / "metrics.jsonl";
  if (progress.step > 0) {
    cut_metrics(progress.step);
  } else {
    metrics.open(path, std::ios::trunc);
  }
  WIOLA_CHECK(metrics.good(), "cannot write '", path.string(), "'");
}

void Trainer::State::cut_metrics(int64_t step) {
  const auto path = run_dir / "metrics.jsonl";
  if (metrics.is_open()) metrics.close();
  std::string kept, line;
  std::ifstream in(path);
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).at("step").get<int64_t>() <= step) kept += line + "\n";
    } catch (const std::exception&) {
      // a torn last line of a killed run: dropped
    }
  }
  in.close();
  write_text_atomic(path.string(), kept);
  metrics.open(path, std::ios::app);
}

StepOutcome Trainer::State::skip_data_step(int64_t t) {
  const auto t0 = Clock::now();
  cur = StepTimes{};
  dist::set_context("stage " + std::to_string(me.pp) + " step " + std::to_string(t) + " data (skipped window)");
  loader->next_batch(batch.data());  // read and dropped: the data after the window is the same
  StepOutcome out;
  out.loss = out.grad_norm = std::nan("");
  out.lr = lr_at(t, budget.t_max, budget.warmup, rc.train.lr_max, rc.train.lr_min);
  out.adam_step = adam->applied_steps();
  progress.step = t;
  out.seconds = seconds_since(t0);
  cur.data = cur.total = out.seconds;
  return out;
}

bool Trainer::State::spike_detected(int64_t t, const StepOutcome& out, std::string& why) {
  double seen = out.loss;  // what detection sees
  if (t == inject_spike) {
    seen *= 1000.0;
    inject_spike = -1;  // the first time only
  }
  const SpikeVerdict v = spike.check(seen, out.skipped);
  int64_t flag = v.rewind ? 1 : 0;
  why = v.reason;
  if (world.size() > 1) {
    dist::set_context("step " + std::to_string(t) + " loss-spike decision");
    world.broadcast(&flag, 1, 0);  // rank 0's decision on every rank
  }
  if (flag && why.empty()) why = "loss-spike policy (rank 0's decision)";
  if (flag) return true;
  spike.accept(out.loss, out.skipped);
  return false;
}

void Trainer::State::rewind(int64_t t, const std::string& why) {
  const TrainSection& tr = rc.train;
  const std::string at = why + " at step " + std::to_string(t);
  WIOLA_CHECK(rewinds < tr.spike_max_rewinds, at, ": not rewinding again, ", rewinds,
              " rewinds made already (train.spike_max_rewinds = ", tr.spike_max_rewinds, ")");
  WIOLA_CHECK(ckpt != nullptr, at, ": no checkpoint to rewind to (checkpoint.dir is not set)");
  dist::set_context("step " + std::to_string(t) + " loss-spike rewind");
  if (ckpt->in_flight()) ckpt->finish();  // the save in flight is of an earlier, good step
  const std::string folder = ckpt->find_resume();
  WIOLA_CHECK(!folder.empty(), at, ": no checkpoint in ", rc.checkpoint.dir,
              " to rewind to (none saved yet: checkpoint.every sets how often)");
  const std::string run_id = ckpt->run_id();
  const ResumeState st = ckpt->resume(folder);
  WIOLA_CHECK(st.step < t && st.run_id == run_id, at, ": the newest checkpoint ", folder, " (step ", st.step,
              ") is not an earlier one of this run; cannot rewind");
  progress.step = st.step;
  progress.tokens = st.tokens;
  progress.skipped = st.skipped;
  loader->restore(st.loader);
  spike.restore({st.recent_losses, st.consecutive_skipped});
  ++rewinds;
  const StepWindow w{st.step + 1, t};
  add_window(windows, w);
  if (!root()) return;
  std::printf("wiola train: %s: rewinding to %s (step %lld) and skipping the data of steps %lld..%lld "
              "(rewind %lld of at most %d)\n", at.c_str(), folder.c_str(), (long long)st.step, (long long)w.from,
              (long long)w.to, (long long)rewinds, tr.spike_max_rewinds);
  std::fflush(stdout);
  cut_metrics(st.step);
  if (tb) tb->restart(st.step + 1);  // TensorBoard drops the rewound steps as metrics.jsonl does
  pending_rewind = {{"detected_at", t}, {"reason", why}, {"checkpoint_step", st.step},
                    {"window", {w.from, w.to}}, {"rewinds", rewinds}, {"skip_batches", windows_json(windows)}};
  write_config_toml();
}

// GEMMs tuned per shape (train.cuda_gemm = auto; docs/gpu.md): every rank
// takes rank 0's choices, so that all compute with the same algorithms
// (TP-replicated weights would drift apart otherwise). At start-up the run
// folder's cache (gemm_tuning.json, an earlier run's: a resume computes as it
// did); after this process's first step, rank 0's table with what it measured
// in that step, which rank 0 then writes to the cache.
void Trainer::State::share_gemm_tuning(bool measured) {
  if (rc.train.backend_options.gemm != "auto") return;
  const auto cache = run_dir / "gemm_tuning.json";
  std::string text;
  if (root()) {
    if (measured) text = ops.gemm_tuning();
    else if (std::filesystem::exists(cache)) text = read_file(cache.string());
  }
  if (world.size() > 1) {
    int64_t n = int64_t(text.size());
    world.broadcast(&n, 1, 0);
    if (!root()) text.assign(size_t(n), '\0');
    if (n > 0) world.broadcast(text.data(), size_t(n), DType::U8, 0);
  }
  if (!text.empty()) ops.adopt_gemm_tuning(text);  // empty: a backend that does not tune, or no cache yet
  if (root() && measured && !text.empty()) write_text_atomic(cache.string(), text);
  // A resume computes with the resumed checkpoint's choices (its manifest
  // records them), whatever the run folder's cache holds: every rank read
  // the same manifest. A table for another device is ignored, with a
  // message (check_resumed_gemm warns).
  if (!measured && resumed_gemm.is_object() && resumed_gemm.contains("tuning") && !resumed_gemm["tuning"].is_null())
    ops.adopt_gemm_tuning(resumed_gemm["tuning"].dump());
}

// After a resume: whether this run computes its GEMMs as the checkpoint's
// run did (train/gemm_record.h). Where not (another card or library
// version, another train.cuda_gemm, choices the device does not take) the
// run goes on with a warning: the difference is rounding, and refusing
// would strand a checkpoint on the card that wrote it; the steps from here
// are then not bit for bit those of the uninterrupted run.
void Trainer::State::check_resumed_gemm() {
  if (!root() || resumed_gemm.is_null()) return;
  const std::string diff = gemm_record_difference(resumed_gemm, gemm_record(ops, rc.train.backend_options));
  if (diff.empty()) return;
  std::fprintf(stderr,
               "wiola: warning: the resumed checkpoint's GEMMs ran other algorithms than this run will (%s); "
               "training goes on, but not bit for bit as the uninterrupted run would have\n",
               diff.c_str());
  std::fflush(stderr);
}

// ---- Trainer ---------------------------------------------------------------------
Trainer::Trainer(const RunConfig& rc, const TrainOptions& opt, Ops<float>& ops, Comm& world)
    : s_(std::make_unique<State>(rc, opt, ops, world)) {
  s_->check_and_open_data();
  s_->board = dist::RankStateBoard::open(world, (std::filesystem::path(rc.train.run_dir) / "ranks").string());
  s_->stragglers = std::make_unique<StragglerWatch>(rc, world);
  s_->build_grid_and_schedule();
  s_->build_model_and_optimizer();
  s_->measure_peak();
  s_->setup_checkpoints();
  s_->open_outputs();
  if (rc.train.tensorboard && s_->root())
    s_->tb = std::make_unique<TensorBoardWriter>(s_->run_dir / "tensorboard", rc.data.blend, s_->progress.step + 1);
  s_->share_gemm_tuning(false);
  s_->check_resumed_gemm();
  print_banner();
}

Trainer::~Trainer() = default;

const StepBudget& Trainer::budget() const { return s_->budget; }
TrainProgress& Trainer::progress() { return s_->progress; }

void Trainer::print_banner() {
  State& s = *s_;
  if (!s.root()) return;
  const RunConfig& rc = s.rc;
  const ModelConfig& cfg = rc.model;
  const auto& par = rc.parallel;
  const auto& di = s.loader->info();
  const int64_t n_params = cfg.param_count();
  std::printf("wiola train: %s  %lld parameters (d=%d L=%d H=%d H_kv=%d d_A=%d d_B=%d V=%d T=%d)\n",
              cfg.name.c_str(), (long long)n_params, cfg.d, cfg.L, cfg.H, cfg.Hkv, cfg.dA, cfg.dB, cfg.V,
              s.T);
  std::printf("  data %s: %llu train samples; global batch %lld = %d x %d micro-batches x %d DP "
              "(%lld tokens/step)\n", rc.data.blend.empty() ? rc.data.path.c_str() : "blend",
              (unsigned long long)di.num_samples, (long long)s.GB, s.B, s.m, par.dp, (long long)(s.GB * s.T));
  if (!rc.data.blend.empty()) print_blend(*s.loader, s.budget.t_max * s.GB);
  std::printf("  Chinchilla budget: D = 20 x %lld = %lld tokens; T_max = ceil(D / (%lld x %d)) = %lld steps\n",
              (long long)n_params, (long long)(20 * n_params), (long long)s.GB, s.T,
              (long long)chinchilla_steps(n_params, s.GB, s.T));
  std::printf("  steps T_max = %lld (from %s), warmup %lld, lr %.3g -> %.3g, backend %s, %d threads per rank\n",
              (long long)s.budget.t_max, s.budget.source, (long long)s.budget.warmup, rc.train.lr_max,
              rc.train.lr_min, s.ops.name(), cpu_threads());
  std::string compiled;
  for (const auto& n : cpu_simd_compiled_targets()) compiled += (compiled.empty() ? "" : " ") + n;
  std::printf("  CPU %s, SIMD %s (compiled: %s; -march=%s)\n", host_cpu_model().c_str(),
              cpu_simd_target(), compiled.c_str(), cpu_build_march());
  if (s.world.size() > 1)
    std::printf("  layout: %d ranks = tp %d x pp %d x dp %d; ZeRO %s; schedule %s with %d micro-batches, "
                "predicted bubble %.3f; DP overlap %s; data plane %s\n",
                s.world.size(), par.tp, par.pp, par.dp, s.zero ? "on" : "off", par.schedule.c_str(), s.m,
                dist::bubble_fraction_predicted(par.pp, s.m), s.overlap ? "on" : "off", s.data_plane.c_str());
  if (par.pp > 1) {
    std::printf("  pipeline stages (%s balance):", par.stage_balance.c_str());
    for (const auto& [a, b] : s.stages) std::printf(" [%d,%d)", a, b);
    std::printf("\n");
  }
  std::printf("  memory (rank 0): parameters+gradients %.1f MiB, AdamW state %.1f MiB, activations %.1f MiB "
              "(%d slot%s)%s\n",
              double(s.model->param_bytes()) / 1048576.0, double(s.adam->state_bytes_this_rank()) / 1048576.0,
              double(s.model->activation_bytes()) / 1048576.0, s.slots, s.slots > 1 ? "s" : "",
              rc.train.recompute ? " (recompute on)" : "");
  if (s.ckpt) {
    const auto& cc = rc.checkpoint;
    std::printf("  checkpoints: %s, %s%s%s, keep %d%s, %s writes\n", cc.dir.c_str(),
                cc.every > 0 ? ("every " + std::to_string(cc.every) + " steps").c_str() : "at the end",
                cc.minutes > 0 ? (" and every " + std::to_string(cc.minutes) + " min").c_str() : "",
                " and on SIGUSR1/SIGTERM", cc.keep,
                cc.keep_every > 0 ? (" + every step multiple of " + std::to_string(cc.keep_every)).c_str() : "",
                cc.async ? "background" : "blocking");
  }
  std::fflush(stdout);
}

// The pipeline schedule of one step over this rank's micro-batches: forward
// and backward actions in the stage's order, boundary messages between them.
// On dump steps it also collects the logits (single process) and the ATM
// decisions of this rank's layers.
std::vector<uint8_t> Trainer::run_schedule(int64_t t, bool dumping, StepDump* dump) {
  State& s = *s_;
  Model<float>& model = *s.model;
  const int prev = s.me.pp - 1, next = s.me.pp + 1;
  const std::string step_ctx = "stage " + std::to_string(s.me.pp) + " step " + std::to_string(t);
  const double scale = 1.0 / (double(s.B) * s.m * s.T);  // this rank's mean; DP averages
  const bool overlap_now = s.overlap && !dumping;  // dumps read the gradients whole
  std::map<int, std::vector<uint8_t>> atm_local;
  double busy = 0;
  const WaitClock w0 = WaitClock::read(*s.grid);
  const auto ts = Clock::now();
  // Gradient-ready reports come from the step's last backward (its whole
  // backward, or with a split one the norm's from the last B and the
  // layers' from the last W): each range once.
  size_t last_b = s.actions.size(), last_w = s.actions.size();
  for (size_t k = 0; k < s.actions.size(); ++k) {
    if (s.actions[k].op == dist::Op::BwdWeight) last_w = k;
    else if (s.actions[k].op != dist::Op::Fwd) last_b = k;
  }
  // TrainOptions::trace_schedule: each action as it completes, named by the
  // work that ran (not copied from the list).
  std::vector<dist::Action> executed;
  for (size_t k = 0; k < s.actions.size(); ++k) {
    const dist::Action a = s.actions[k];
    const int slot = a.micro % s.slots;
    const int32_t* tok = s.batch.data() + size_t(a.micro) * s.mb_tokens();
    if (a.op == dist::Op::Fwd) {
      dist::set_context(step_ctx + " forward micro-batch " + std::to_string(a.micro));
      if (!s.first) s.link->recv(model.fwd_in(slot), prev, 2 * a.micro);
      const auto tb = Clock::now();
      model.stage_forward(slot, tok, scale, true);
      if (s.sync_phases) s.ops.synchronize();
      busy += seconds_since(tb);
      if (dumping && s.last) {
        const auto& lg = model.last_logits();
        dump->logits.insert(dump->logits.end(), lg.begin(), lg.end());
      }
      if (dumping)
        for (int l = s.l0; l < s.l1; ++l) {
          const auto o = model.atm_open(l);
          if (!o.empty()) atm_local[l].insert(atm_local[l].end(), o.begin(), o.end());
        }
      if (!s.last) s.link->send(model.fwd_out(slot), next, 2 * a.micro);
      if (s.schedule_trace.is_open()) executed.push_back({dist::Op::Fwd, a.micro, a.chunk});
    } else if (a.op == dist::Op::BwdWeight) {
      // W of a split backward: the weight-gradient GEMMs, no messages. The
      // step's last W reports the layers' gradients final.
      dist::set_context(step_ctx + " weight gradients micro-batch " + std::to_string(a.micro));
      model.arm_grad_ready(overlap_now && k == last_w);
      const auto tb = Clock::now();
      model.stage_backward_weight(slot, a.micro % model.options().weight_slots);
      if (s.sync_phases) s.ops.synchronize();
      busy += seconds_since(tb);
      model.arm_grad_ready(false);
      if (s.schedule_trace.is_open()) executed.push_back({dist::Op::BwdWeight, a.micro, a.chunk});
    } else {  // the whole backward, or B of a split one
      dist::set_context(step_ctx + " backward micro-batch " + std::to_string(a.micro));
      if (!s.last) s.link->recv(model.bwd_in(), next, 2 * a.micro + 1);
      model.arm_grad_ready(overlap_now && k == last_b);
      const auto tb = Clock::now();
      const bool split = a.op == dist::Op::BwdInput;
      if (split) model.stage_backward_input(slot, a.micro % model.options().weight_slots);
      else model.stage_backward(slot);
      if (s.sync_phases) s.ops.synchronize();
      busy += seconds_since(tb);
      model.arm_grad_ready(false);
      if (!s.first) s.link->send(model.bwd_out(), prev, 2 * a.micro + 1);
      if (s.schedule_trace.is_open())
        executed.push_back({split ? dist::Op::BwdInput : dist::Op::Bwd, a.micro, a.chunk});
    }
  }
  s.link->flush();
  if (s.schedule_trace.is_open()) {
    s.schedule_trace << "step " << t << " stage " << s.me.pp << " dp " << s.me.dp << " tp " << s.me.tp << ": "
                     << dist::to_string(executed) << '\n';
    s.schedule_trace.flush();
  }
  const double sched = seconds_since(ts);
  if (t > 1 && !dumping) {
    s.measure.busy_s += busy;
    s.measure.sched_s += sched;
  }
  // Waits outside the pipeline group happen inside forward/backward (TP).
  const WaitClock waited = WaitClock::read(*s.grid) - w0;
  s.cur.compute = busy - waited.other;
  s.cur.comm = waited.other;
  s.cur.comm_hidden = waited.hidden();
  s.cur.bubble = sched - busy;
  std::vector<uint8_t> atm_flat;  // this rank's ATM layers in order
  for (auto& [l, v] : atm_local) atm_flat.insert(atm_flat.end(), v.begin(), v.end());
  return atm_flat;
}

StepOutcome Trainer::step(int64_t t) {
  State& s = *s_;
  Model<float>& model = *s.model;
  const auto t0 = Clock::now();
  s.cur = StepTimes{};
  const std::string step_ctx = "stage " + std::to_string(s.me.pp) + " step " + std::to_string(t);
  dist::set_context(step_ctx + " data");
  inject_fault(s.fault, s.world.rank(), t);
  s.stragglers->inject_delay();
  s.loader->next_batch(s.batch.data());
  s.cur.data = seconds_since(t0);
  const auto dump_it = s.dumps.find(t);
  const bool dumping = dump_it != s.dumps.end();
  StepDump dump;
  if (dumping) s.dump_state_before(t, dump);
  const auto before = traffic_snapshot(*s.grid);
  // The gradients are zero: the model starts so, and every optimizer step
  // leaves them so (AdamWConfig::zero_grads).
  const std::vector<uint8_t> atm_flat = run_schedule(t, dumping, &dump);

  {
    // ATM's figures of this step (before any evaluation, which runs with
    // ATM off); TP ranks share the decisions, so tp rank 0 speaks for them.
    SelfTimer self(s.self_s);
    s.step_atm = s.me.tp == 0 ? atm_saving(model.atm_stats(), s.rc.model, s.B, s.m) : AtmSaving{};
  }
  // The tied embedding: the first stage's lookup gradient plus the last
  // stage's head gradient, identical on both afterwards. (This and the loss
  // sum are communication, all of it.)
  const auto te = Clock::now();
  dist::set_context(step_ctx + " embedding gradient sum");
  if (s.embed && s.rc.parallel.pp > 1)
    s.grid->data(GroupKind::Embed).all_reduce(model.grads() + s.embed->offset, model.grads() + s.embed->offset,
                                               s.embed->size(), DType::F32, ReduceOp::Sum);
  // (Its span: the padding after it belongs to no other report.)
  if (s.embed && s.overlap && !dumping) s.adam->grad_ready(s.embed->offset, s.embed->span);
  StepOutcome out;
  out.loss = s.world_loss() / double(s.GB * s.T);
  s.cur.comm += seconds_since(te);
  out.lr = lr_at(t, s.budget.t_max, s.budget.warmup, s.rc.train.lr_max, s.rc.train.lr_min);
  if (dumping) s.dump_grads(dump);
  dist::set_context(step_ctx + " optimizer");
  out.adam_step = s.adam->applied_steps() + 1;  // bias correction counts applied updates only
  const WaitClock wa = WaitClock::read(*s.grid);
  const auto ta = Clock::now();
  const dist::StepResult res = s.adam->step(out.lr, out.adam_step);  // refreshes the weight copy too
  if (s.sync_phases) s.ops.synchronize();
  const WaitClock wadam = WaitClock::read(*s.grid) - wa;
  s.cur.optimizer = seconds_since(ta) - (wadam.pp + wadam.other);
  s.cur.comm += wadam.pp + wadam.other;
  s.cur.comm_hidden += wadam.hidden();
  out.grad_norm = res.grad_norm;
  out.skipped = res.skipped;
  if (res.skipped) ++s.progress.skipped;
  if (t > 1 && !dumping) s.measure_traffic(before);
  if (dumping) {
    model.set_keep_logits(false);
    dist::set_context(step_ctx + " dump gather");
    dump.params_after = s.gather_backend(model.params());
    dump_step(t, out, dump, atm_flat);
  }
  s.progress.step = t;
  s.progress.tokens += s.GB * s.T;
  out.seconds = seconds_since(t0);
  s.cur.total = out.seconds;
  return out;
}

// Gathers the dump's tokens and ATM decisions, checks the TP ranks agree,
// and writes the file on rank 0 (docs/model.md §7).
void Trainer::dump_step(int64_t t, const StepOutcome& out, StepDump& dump,
                        const std::vector<uint8_t>& atm_flat) {
  State& s = *s_;
  const TrainSection& tr = s.rc.train;
  if (s.rc.parallel.tp > 1) check_atm_agrees_over_tp(*s.grid, atm_flat, t);
  gather_tokens_and_atm(*s.grid, s.rc.model, s.stages, s.batch, atm_flat,
                        s.loader->local_batch() * size_t(s.T), dump);
  if (!s.root()) return;
  dump.cfg = s.rc.model;
  dump.B = int(s.GB);
  dump.loss = out.loss;
  dump.grad_norm = out.grad_norm;
  dump.float_attrs = {{"lr", out.lr}, {"lr_max", tr.lr_max}, {"lr_min", tr.lr_min},
                      {"beta1", tr.beta1}, {"beta2", tr.beta2}, {"adam_eps", tr.adam_eps},
                      {"weight_decay", tr.weight_decay}, {"clip", tr.clip}};
  dump.int_attrs = {{"step", t}, {"adam_step", out.adam_step}, {"t_max", s.budget.t_max},
                    {"warmup", s.budget.warmup}};
  dist::set_context("stage " + std::to_string(s.me.pp) + " step " + std::to_string(t) +
                    " writing the numerics dump");
  write_step_dump(s.dumps.at(t), full_layout(s.rc.model, s.model->layout()), dump);
}

// The first eval_batches global batches of one validation source.
double Trainer::State::validation_loss(ValSource& v) {
  v.loader->restore(v.start);
  std::vector<int32_t> vb(mb_tokens());
  const int n = rc.train.eval_batches * m;
  for (int i = 0; i < n; ++i) {
    v.loader->next_batch(vb.data());
    dist::set_context("evaluation batch " + std::to_string(i) + (vals.size() > 1 ? " of blend source " +
                      std::to_string(v.source + 1) : std::string()));
    if (!first) link->recv(model->fwd_in(0), me.pp - 1, 2 * i);
    model->stage_forward(0, vb.data(), 0.0, false);
    if (!last) link->send(model->fwd_out(0), me.pp + 1, 2 * i);
  }
  link->flush();
  return world_loss() / (double(rc.train.eval_batches) * GB * T);
}

// A blend's validation loss is the share-weighted mean of its sources'
// (those with a val split): the expected loss on the training mixture.
double Trainer::evaluate() {
  State& s = *s_;
  s.last_val_sources.assign(s.rc.data.blend.size(), std::nan(""));
  double sum = 0, shares = 0;
  for (State::ValSource& v : s.vals) {
    const double loss = s.validation_loss(v);
    if (!s.last_val_sources.empty()) s.last_val_sources[v.source] = loss;
    sum += v.share * loss;
    shares += v.share;
  }
  return sum / shares;
}

// One metrics record per step (rank 0) and a progress line every log_every.
void Trainer::log_step(int64_t t, const StepOutcome& out, bool evaluated) {
  State& s = *s_;
  if (!s.root()) return;
  const bool data_skipped = s.skipping(t);  // no tokens trained, no model FLOPs
  const double tps = data_skipped ? 0.0 : double(s.GB * s.T) / out.seconds;
  nlohmann::json j = {{"step", t}, {"loss", out.loss}, {"lr", out.lr}, {"grad_norm", out.grad_norm},
                      {"tokens", s.progress.tokens}, {"tokens_per_s", tps}, {"step_ms", out.seconds * 1e3},
                      {"skipped", s.progress.skipped}};
  if (data_skipped) j["data_skipped"] = true;
  if (!s.pending_rewind.is_null()) {  // the first record after a loss-spike rewind
    j["rewind"] = std::move(s.pending_rewind);
    s.pending_rewind = nullptr;
  }
  if (s.ckpt) j["checkpoint_ms"] = out.checkpoint_seconds * 1e3;
  const double mfu = s.job_peak > 0 && !data_skipped ? s.step_flops / out.seconds / s.job_peak : 0.0;
  if (s.job_peak > 0 && !data_skipped) j["mfu"] = mfu;
  if (s.rc.train.accounting) {
    // Where rank 0's step went (report.json: every rank's mean).
    nlohmann::json tm = nlohmann::json::object();
    const auto parts = s.cur.parts();
    for (size_t i = 0; i < parts.size(); ++i) tm[StepTimes::kNames[i]] = parts[i] * 1e3;
    j["time_ms"] = tm;
  }
  if (s.atm.layers > 0) {
    j["atm_mu"] = s.atm.mu_sum / s.atm.layers;
    j["atm_saved_attention_gflop"] = s.atm.saved_flops / 1e9;
  }
  j["peak_mem_mib"] = s.ops.host_accessible() ? peak_rss_mib() : double(s.ops.peak_bytes()) / 1048576.0;
  if (!std::isfinite(out.loss)) j["loss"] = nullptr;
  if (!std::isfinite(out.grad_norm)) j["grad_norm"] = nullptr;
  if (evaluated) j["val_loss"] = s.last_val;
  if (evaluated && !s.last_val_sources.empty()) {  // a blend: [loss of source 1, ...], null where left out
    nlohmann::json per = nlohmann::json::array();
    for (double x : s.last_val_sources) per.push_back(std::isfinite(x) ? nlohmann::json(x) : nlohmann::json());
    j["val_loss_sources"] = per;
  }
  s.metrics << j.dump() << '\n';
  s.metrics.flush();
  if (s.tb) s.tb->add_metrics(t, j);
  const int64_t last_step = s.budget.last_step;
  if (s.opt.quiet || !(t % s.rc.train.log_every == 0 || t == 1 || t == last_step || evaluated)) return;
  std::printf("step %6lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %.0f tok/s | %.0f ms | ETA %s",
              (long long)t, (long long)last_step, out.loss, out.lr, out.grad_norm, tps, out.seconds * 1e3,
              human_duration(s.ema_step_s * double(last_step - t)).c_str());
  if (s.job_peak > 0 && !data_skipped) std::printf(" | MFU %.1f%%", 100.0 * mfu);
  if (s.rc.train.accounting && s.cur.total > 0 && !data_skipped) {
    const StepTimes& jt = s.cur;
    const double tot = jt.total / 100.0;
    std::printf(" | compute %.0f%% comm %.0f%% bubble %.0f%% opt %.0f%% data %.0f%%", jt.compute / tot,
                jt.comm / tot, jt.bubble / tot, jt.optimizer / tot, jt.data / tot);
  }
  if (evaluated) std::printf(" | val %.4f", s.last_val);
  if (evaluated && s.vals.size() > 1) {
    std::printf(" (");
    for (size_t i = 0; i < s.vals.size(); ++i)
      std::printf("%s%zu: %.4f", i ? ", " : "", s.vals[i].source + 1, s.last_val_sources[s.vals[i].source]);
    std::printf(")");
  }
  if (data_skipped) std::printf(" | DATA SKIPPED (skipped window)");
  if (out.skipped)
    std::printf(" | SKIPPED (non-finite grad norm; %lld so far)", (long long)s.progress.skipped);
  std::printf("\n");
  std::fflush(stdout);
}

TrainSummary Trainer::run() {
  State& s = *s_;
  TrainSummary sum;
  sum.t_max = s.budget.t_max;
  if (s.progress.step >= s.budget.last_step) {  // resumed at the end: the report of the run stands
    sum.steps = s.progress.step;
    sum.resumed_from = s.resumed_from;
    sum.skipped = s.progress.skipped;
    if (s.root())
      std::printf("wiola train: nothing to do: the checkpoint is at step %lld, the run's last step\n",
                  (long long)s.progress.step);
    return sum;
  }
  const int64_t first = s.progress.step + 1;
  for (int64_t t = first; t <= s.budget.last_step; ++t) {
    const bool data_skip = s.skipping(t);
    const StepOutcome out = data_skip ? s.skip_data_step(t) : step(t);
    if (s.spike_on && !data_skip) {
      std::string why;
      if (s.spike_detected(t, out, why)) {  // before any save: step t's update is never saved
        s.rewind(t, why);
        t = s.progress.step;  // the loop goes on with the window's first step
        continue;
      }
    }
    if (!data_skip && !s.gemm_shared) {
      s.share_gemm_tuning(true);
      s.gemm_shared = true;
    }
    s.train_s += out.seconds;
    s.ema_step_s = t == 1 ? out.seconds : 0.9 * s.ema_step_s + 0.1 * out.seconds;
    if (t == s.resumed_from + 1) sum.first_loss = out.loss;  // this run's first step
    sum.last_loss = out.loss;
    sum.steps = t;
    const bool eval_now = !s.vals.empty() && (t % s.rc.train.eval_every == 0 || t == s.budget.last_step);
    if (t == s.budget.last_step) s.atm_stats = s.model->atm_stats();  // before eval (ATM off)
    if (eval_now) s.last_val = sum.val_loss = evaluate();
    const auto tc = Clock::now();
    const bool stop = after_step(t);
    StepOutcome logged = out;
    logged.checkpoint_seconds = seconds_since(tc);
    s.cur.checkpoint = logged.checkpoint_seconds;
    s.cur.total += logged.checkpoint_seconds;
    const bool unusual = s.dumps.count(t) > 0 || data_skip;  // not a step of the accounting's means
    s.account_step(t, unusual);
    s.stragglers->after_step(t, s.cur, t > 1 && !unusual, s.budget.last_step);
    log_step(t, logged, eval_now);
    if (stop) {
      sum.stopped = true;
      break;
    }
  }
  sum.resumed_from = s.resumed_from;
  sum.skipped = s.progress.skipped;
  const int64_t done = sum.steps > s.resumed_from ? sum.steps - s.resumed_from : 0;
  sum.tokens_per_s = s.train_s > 0 ? double(done * s.GB * s.T) / s.train_s : 0.0;
  if (sum.stopped && s.root())
    std::printf("wiola train: stopped at step %lld on request, checkpoint written; run again to resume "
                "(exit status %d)\n", (long long)sum.steps, kExitPreempted);
  write_report(sum);
  // mpirun kills the other ranks as soon as one exits non-zero (75 after a
  // stop): nobody leaves before rank 0 has written the report.
  if (s.world.size() > 1) s.world.barrier();
  return sum;
}

bool Trainer::after_step(int64_t t) {
  State& s = *s_;
  const bool local_stop = s.opt.stop_requested && s.opt.stop_requested();
  if (!s.ckpt) return false;  // stop signals are only taken over when checkpoints are on
  Checkpointer& ck = *s.ckpt;
  dist::set_context("step " + std::to_string(t) + " checkpoint control");
  // One control all-reduce per step: any rank asked to stop, rank 0's clock
  // says a save is due, any rank still writing the last save.
  const double minutes = s.rc.checkpoint.minutes;
  int64_t flags[3] = {local_stop ? 1 : 0,
                      s.root() && minutes > 0 && seconds_since(s.last_save) >= minutes * 60.0 ? 1 : 0,
                      ck.still_writing() ? 1 : 0};
  if (s.world.size() > 1) s.world.all_reduce(flags, 3, ReduceOp::Max);
  const bool stop = flags[0] != 0, time_due = flags[1] != 0, writing = flags[2] != 0;
  if (ck.in_flight() && !writing) ck.commit();
  const int every = s.rc.checkpoint.every;
  const bool due = stop || time_due || t == s.budget.last_step || (every > 0 && t % every == 0);
  if (!due) return false;
  dist::set_context("step " + std::to_string(t) + " checkpoint");
  if (ck.in_flight()) ck.finish();  // one save at a time
  ck.save(s.resume_state());
  s.last_save = Clock::now();
  ++s.saves;
  if (stop || t == s.budget.last_step) ck.finish(/*final=*/true);  // a failure ends the run with it
  if (s.root() && !s.opt.quiet && (stop || t == s.budget.last_step))
    std::printf("checkpoint step %lld written to %s (%.2f s)\n", (long long)t, s.rc.checkpoint.dir.c_str(),
                ck.last_save_seconds());
  return stop && t < s.budget.last_step;  // a stop at the last step is just the end
}

void Trainer::write_report(const TrainSummary& sum) {
  State& s = *s_;
  dist::set_context("run report");
  const size_t padded = s.zero ? s.adam->shard_elems() * size_t(s.rc.parallel.dp) : s.model->n_params();
  RunAccounting a;
  a.peak = s.peak;
  a.job_peak = s.job_peak;
  a.step_flops = s.step_flops;
  a.breakdown = s.rc.train.accounting;
  a.times = s.acc_times;
  a.steps = s.acc_steps;
  a.step_s = s.acc_step_s;
  a.self_s = s.self_s;
  a.run_s = s.train_s;
  a.memory = s.memory_use();
  a.predicted = perf::rank_memory(s.rc.model, s.rc.layout(), s.me.pp, s.ops.precision());
  a.atm = s.atm;
  a.stragglers = s.stragglers.get();
  a.backend = {{"name", s.ops.name()}, {"options", backend_option_fields(s.rc.train.backend_options)}};
  if (const std::string g = s.ops.gemm_tuning(); !g.empty()) a.backend["gemm_tuning"] = nlohmann::json::parse(g);
  a.backend["gemm"] = gemm_record(s.ops, s.rc.train.backend_options);
  write_run_report(*s.grid, s.rc, *s.model, padded, s.zero, s.overlap, sum, s.measure, s.atm_stats, a, s.run_dir);
}

TrainSummary run_training(const RunConfig& rc, const TrainOptions& opt, Ops<float>& ops, Comm& world) {
  Trainer trainer(rc, opt, ops, world);
  return trainer.run();
}

}  // namespace wiola
