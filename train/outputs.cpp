#include "train/outputs.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "dist/diagnostics.h"
#include "kernels/backend.h"
#include "kernels/cpu_info.h"
#include "perf/cost_model.h"
#include "train/accounting.h"
#include "train/spike_policy.h"
#include "train/rank_comms.h"
#include "train/rank_model.h"
#include "train/rank_optimizer.h"
#include "train/run_settings.h"
#include "train/stage_layers.h"
#include "train/stage_schedule.h"
#include "train/train_data.h"
#include "train/run_report.h"
#include "train/lr_schedule.h"
#include "train/validator.h"
#include "util/error.h"
#include "util/files.h"

namespace wiola {
namespace {

std::string human_duration(double s) {
  char buf[64];
  const long v = long(s + 0.5);
  if (v >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", v / 3600, (v / 60) % 60);
  else if (v >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", v / 60, v % 60);
  else std::snprintf(buf, sizeof buf, "%lds", v);
  return buf;
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

// Which rank ran where, each dimension's links; a TP group across nodes is
// warned about (its all-reduces, two a layer, then cross the slow link).
void print_placement(const dist::Placement& p) {
  std::printf("  placement: %zu node%s (%s); links: tp %s, pp %s, dp %s\n", p.nodes.size(),
              p.nodes.size() > 1 ? "s" : "", p.nodes_summary().c_str(), dist::link_name(p.tp), dist::link_name(p.pp),
              dist::link_name(p.dp));
  if (p.tp_across.empty()) return;
  std::string group;
  for (int r : p.tp_across)
    group += (group.empty() ? "" : ", ") + std::to_string(r) + " (" + p.rank_node[size_t(r)] + ")";
  std::fprintf(stderr,
               "wiola train: warning: a tensor-parallel group spans nodes (ranks %s): its all-reduces, two a layer "
               "in each direction, cross the inter-node link; give every node a multiple of parallel.tp ranks "
               "(hostfile slots), placed in rank order (mpirun's default --map-by slot, Slurm's block "
               "distribution)\n",
               group.c_str());
}

}  // namespace

Outputs::Outputs(const RunSettings& run, const TrainData& data, const RankComms& comms, const StageLayers& layers,
                 const StageSchedule& schedule, const RankModel& model, const RankOptimizer& optimizer)
    : run_(run),
      data_(data),
      comms_(comms),
      layers_(layers),
      schedule_(schedule),
      model_(model),
      optimizer_(optimizer),
      run_dir_(run.rc.train.run_dir),
      board_(dist::RankStateBoard::open(run.world, (run_dir_ / "ranks").string())),
      timeline_(std::make_unique<Timeline>(run)) {}

Outputs::~Outputs() = default;

// metrics.jsonl: a fresh run starts it; a resumed run cuts it back to the
// checkpoint's step (atomically) and appends, so no step appears twice.
void Outputs::open(int64_t step, const std::vector<StepWindow>& windows) {
  const RunSettings& p = run_;
  if (p.opt.trace_schedule) {
    const auto dir = run_dir_ / "schedule_trace";
    std::filesystem::create_directories(dir);
    const auto path = dir / ("rank" + std::to_string(p.world.rank()) + ".txt");
    trace_.open(path, step > 0 ? std::ios::app : std::ios::trunc);
    WIOLA_CHECK(trace_.good(), "cannot write '", path.string(), "'");
  }
  if (!p.root()) return;
  std::filesystem::create_directories(run_dir_);
  write_config_toml(windows);
  const auto path = run_dir_ / "metrics.jsonl";
  if (step > 0) {
    cut_metrics(step);
  } else {
    metrics_.open(path, std::ios::trunc);
  }
  WIOLA_CHECK(metrics_.good(), "cannot write '", path.string(), "'");
  if (p.rc.train.tensorboard)
    tb_ = std::make_unique<TensorBoardWriter>(run_dir_ / "tensorboard", p.rc.data.blend, step + 1);
}

void Outputs::cut_metrics(int64_t step) {
  const auto path = run_dir_ / "metrics.jsonl";
  if (metrics_.is_open()) metrics_.close();
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
  metrics_.open(path, std::ios::app);
}

void Outputs::write_config_toml(const std::vector<StepWindow>& windows) const {
  RunConfig c = run_.rc;
  c.train.skip_batches = windows;
  write_text_atomic((run_dir_ / "config.toml").string(), run_config_to_toml(c));
}

void Outputs::rewound(int64_t step, const std::vector<StepWindow>& windows) {
  if (!run_.root()) return;
  cut_metrics(step);
  if (tb_) tb_->restart(step + 1);  // TensorBoard drops the rewound steps as metrics.jsonl does
  write_config_toml(windows);
}

void Outputs::schedule_done(int64_t t) {
  if (!tracing()) return;
  const dist::GridCoord& me = run_.me;
  trace_ << "step " << t << " stage " << me.pp << " dp " << me.dp << " tp " << me.tp << ": "
         << dist::to_string(executed_) << '\n';
  trace_.flush();
  executed_.clear();
}

void Outputs::banner(bool checkpoints, const Accounting& acct) {
  const RunSettings& s = run_;
  if (!s.root()) return;
  const RunConfig& rc = s.rc;
  const ModelConfig& cfg = rc.model;
  const auto& par = rc.parallel;
  const auto& di = data_.loader->info();
  const int64_t n_params = cfg.param_count();
  std::printf("wiola train: %s  %lld parameters (d=%d L=%d H=%d H_kv=%d d_A=%d d_B=%d V=%d T=%d)\n", cfg.name.c_str(),
              (long long)n_params, cfg.d, cfg.L, cfg.H, cfg.Hkv, cfg.dA, cfg.dB, cfg.V, s.T);
  std::printf(
      "  data %s: %llu train samples; global batch %lld = %d x %d micro-batches x %d DP "
      "(%lld tokens/step)\n",
      rc.data.blend.empty() ? rc.data.path.c_str() : "blend", (unsigned long long)di.num_samples, (long long)s.GB, s.B,
      s.m, par.dp, (long long)(s.GB * s.T));
  if (!rc.data.blend.empty()) print_blend(*data_.loader, s.budget.t_max * s.GB);
  for (size_t j = 0; j < rc.data.stages.size(); ++j) {
    std::printf("    data stage %zu from step %lld: weights", j + 1, (long long)rc.data.stages[j].from);
    for (double w : rc.data.stages[j].weights) std::printf(" %g", w);
    std::printf("\n");
  }
  std::printf("  Chinchilla budget: D = 20 x %lld = %lld tokens; T_max = ceil(D / (%lld x %d)) = %lld steps\n",
              (long long)n_params, (long long)(20 * n_params), (long long)s.GB, s.T,
              (long long)chinchilla_steps(n_params, s.GB, s.T));
  std::printf("  steps T_max = %lld (from %s), warmup %lld, lr %.3g -> %.3g, backend %s, %d threads per rank\n",
              (long long)s.budget.t_max, s.budget.source, (long long)s.budget.warmup, rc.train.lr_max, rc.train.lr_min,
              s.ops.name(), cpu_threads());
  if (s.budget.lr.kind == LrScheduleKind::Wsd)
    std::printf("  lr schedule wsd: stable to step %lld, then %s decay over %lld steps\n",
                (long long)s.budget.lr.decay_start, to_string(s.budget.lr.shape).data(),
                (long long)(s.budget.t_max - s.budget.lr.decay_start));
  std::string compiled;
  for (const auto& n : cpu_simd_compiled_targets()) compiled += (compiled.empty() ? "" : " ") + n;
  std::printf("  CPU %s, SIMD %s (compiled: %s; -march=%s)\n", host_cpu_model().c_str(), cpu_simd_target(),
              compiled.c_str(), cpu_build_march());
  if (s.ops.device_name().empty()) std::printf("  BLAS %s\n", cpu_blas().summary.c_str());
  if (acct.peak().flops > 0)
    std::printf("  MFU against %.4g GFLOP/s per rank: %s\n", acct.peak().flops / 1e9, acct.peak().source.c_str());
  if (s.world.size() > 1)
    std::printf(
        "  layout: %d ranks = tp %d x pp %d x dp %d; ZeRO %s; schedule %s%s with %d micro-batches, "
        "predicted bubble %.3f; DP overlap %s; data plane %s\n",
        s.world.size(), par.tp, par.pp, par.dp, optimizer_.zero ? "on" : "off", to_string(par.schedule).data(),
        par.schedule == dist::Schedule::Interleaved ? (" v=" + std::to_string(schedule_.v)).c_str() : "", s.m,
        perf::bubble_formula(rc.layout()), optimizer_.overlap ? "on" : "off", comms_.data_plane.c_str());
  if (s.world.size() > 1) print_placement(comms_.placement);
  const Model<float>::Memory mem = model_.memory();
  if (par.pp > 1) {
    std::printf("  pipeline stages (%s balance):", to_string(par.stage_balance).data());
    for (const LayerRanges& st : layers_.stages) {
      std::printf(" ");
      for (size_t c = 0; c < st.size(); ++c) std::printf("%s[%d,%d)", c ? "+" : "", st[c].first, st[c].second);
    }
    std::printf("%s\n", layers_.v > 1 ? (" (" + std::to_string(layers_.v) + " chunks per rank)").c_str() : "");
  }
  std::printf(
      "  memory (rank 0): parameters+gradients %.1f MiB, AdamW state %.1f MiB, activations %.1f MiB "
      "(%d slot%s)%s\n",
      double(mem.master + mem.grads + mem.weights) / 1048576.0,
      double(optimizer_.adam->state_bytes_this_rank()) / 1048576.0, double(mem.activations) / 1048576.0,
      schedule_.slots, schedule_.slots > 1 ? "s" : "", rc.train.recompute ? " (recompute on)" : "");
  if (checkpoints) {
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

// One metrics record per step (rank 0) and a progress line every log_every.
void Outputs::log_step(int64_t t, const StepOutcome& out, bool evaluated, const TrainProgress& progress,
                       const Accounting& acct, const Validator& val, SpikePolicy& spikes, bool checkpoints) {
  const RunSettings& s = run_;
  if (!s.root()) return;
  const bool data_skipped = spikes.skipping(t);  // no tokens trained, no model FLOPs
  const double tps = data_skipped ? 0.0 : double(s.GB * s.T) / out.seconds;
  nlohmann::json j = {{"step", t},
                      {"loss", out.loss},
                      {"lr", out.lr},
                      {"grad_norm", out.grad_norm},
                      {"tokens", progress.tokens},
                      {"tokens_per_s", tps},
                      {"step_ms", out.seconds * 1e3},
                      {"skipped", progress.skipped}};
  if (s.rc.train.z_loss > 0) j["z_loss"] = std::isfinite(out.z_loss) ? nlohmann::json(out.z_loss) : nlohmann::json();
  if (data_skipped) j["data_skipped"] = true;
  if (!s.rc.data.stages.empty()) j["data_stage"] = data_stage_at(s.rc.data.stages, t);  // 0: data.blend's weights
  if (nlohmann::json r = spikes.take_rewind_record(); !r.is_null())  // the first record after a loss-spike rewind
    j["rewind"] = std::move(r);
  if (checkpoints) j["checkpoint_ms"] = out.checkpoint_seconds * 1e3;
  const double mfu = acct.job_peak() > 0 && !data_skipped ? acct.step_flops() / out.seconds / acct.job_peak() : 0.0;
  if (acct.job_peak() > 0 && !data_skipped) j["mfu"] = mfu;
  if (acct.breakdown()) {
    // Where rank 0's step went (report.json: every rank's mean).
    nlohmann::json tm = nlohmann::json::object();
    const auto parts = acct.step_times().parts();
    for (size_t i = 0; i < parts.size(); ++i) tm[StepTimes::kNames[i]] = parts[i] * 1e3;
    j["time_ms"] = tm;
  }
  if (acct.atm().layers > 0) {
    j["atm_mu"] = acct.atm().mu_sum / acct.atm().layers;
    j["atm_saved_attention_gflop"] = acct.atm().saved_flops / 1e9;
  }
  j["peak_mem_mib"] = s.ops.host_accessible() ? peak_rss_mib() : double(s.ops.peak_bytes()) / 1048576.0;
  if (!std::isfinite(out.loss)) j["loss"] = nullptr;
  if (!std::isfinite(out.grad_norm)) j["grad_norm"] = nullptr;
  if (evaluated) j["val_loss"] = val.last();
  if (evaluated && !val.last_sources().empty()) {  // a blend: [loss of source 1, ...], null where left out
    nlohmann::json per = nlohmann::json::array();
    for (double x : val.last_sources()) per.push_back(std::isfinite(x) ? nlohmann::json(x) : nlohmann::json());
    j["val_loss_sources"] = per;
  }
  const std::vector<TaskScores> tasks = std::exchange(tasks_, {});
  if (!tasks.empty()) {  // {"NAME/acc": a, "NAME/acc_norm": b, ...}; TensorBoard: metrics/tasks/NAME/acc
    nlohmann::json tj = nlohmann::json::object();
    for (const TaskScores& ts : tasks) {
      tj[ts.name + "/acc"] = ts.acc;
      tj[ts.name + "/acc_norm"] = ts.acc_norm;
      tj[ts.name + "/gold_loglik"] = ts.gold_loglik;
    }
    j["tasks"] = tj;
  }
  metrics_ << j.dump() << '\n';
  metrics_.flush();
  if (tb_) tb_->add_metrics(t, j);
  const int64_t last_step = s.budget.last_step;
  if (s.opt.quiet || !(t % s.rc.train.log_every == 0 || t == 1 || t == last_step || evaluated || !tasks.empty()))
    return;
  std::printf("step %6lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %.0f tok/s | %.0f ms | ETA %s", (long long)t,
              (long long)last_step, out.loss, out.lr, out.grad_norm, tps, out.seconds * 1e3,
              human_duration(acct.ema_step_seconds() * double(last_step - t)).c_str());
  if (s.rc.train.z_loss > 0) std::printf(" | z-loss %.4f", out.z_loss);
  if (acct.job_peak() > 0 && !data_skipped) std::printf(" | MFU %.1f%%", 100.0 * mfu);
  if (acct.breakdown() && acct.step_times().total > 0 && !data_skipped) {
    const StepTimes& jt = acct.step_times();
    const double tot = jt.total / 100.0;
    std::printf(" | compute %.0f%% comm %.0f%% bubble %.0f%% opt %.0f%% data %.0f%%", jt.compute / tot, jt.comm / tot,
                jt.bubble / tot, jt.optimizer / tot, jt.data / tot);
  }
  if (evaluated) std::printf(" | val %.4f", val.last());
  if (evaluated && val.sources() > 1) {
    std::printf(" (");
    for (size_t i = 0; i < val.sources(); ++i)
      std::printf("%s%zu: %.4f", i ? ", " : "", val.source_number(i), val.last_sources()[val.source_number(i) - 1]);
    std::printf(")");
  }
  for (const TaskScores& ts : tasks) std::printf(" | %s acc %.3f norm %.3f", ts.name.c_str(), ts.acc, ts.acc_norm);
  if (data_skipped) std::printf(" | DATA SKIPPED (skipped window)");
  if (out.skipped) std::printf(" | SKIPPED (non-finite grad norm; %lld so far)", (long long)progress.skipped);
  std::printf("\n");
  std::fflush(stdout);
}

void Outputs::report(const TrainSummary& sum, const Accounting& acct) {
  dist::set_context("run report");
  write_run_report(run_, comms_, optimizer_, model_, acct, sum, run_dir_);
  dist::set_context("timeline");
  timeline_->write();
}

}  // namespace wiola
