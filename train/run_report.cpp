#include "train/run_report.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/schedule.h"
#include "kernels/cpu_info.h"
#include "perf/cost_model.h"
#include "train/accounting.h"
#include "train/gemm_record.h"
#include "train/rank_comms.h"
#include "train/rank_optimizer.h"
#include "train/run_settings.h"
#include "train/stragglers.h"
#include "util/files.h"

namespace wiola {
namespace {

using dist::DType;

std::string human_bytes(double b) {
  char buf[64];
  if (b >= 1048576.0) std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  else if (b >= 1024.0) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

// Gathers one double per rank (a vector on rank 0, every rank's value).
std::vector<double> gather_values(dist::Comm& world, double x) {
  std::vector<double> all(size_t(world.size()), x);
  if (world.size() > 1) world.all_gather(&x, all.data(), 1, DType::F64);
  return all;
}

// Rank 0's backend: name, options, GEMM choices (recorded as is).
nlohmann::json backend_json(const RunSettings& run) {
  Ops<float>& ops = run.ops;
  nlohmann::json b = {{"name", ops.name()}, {"options", backend_option_fields(run.rc.train.backend_options)}};
  if (const std::string g = ops.gemm_tuning(); !g.empty()) b["gemm_tuning"] = nlohmann::json::parse(g);
  b["gemm"] = gemm_record(ops, run.rc.train.backend_options);
  if (ops.device_name().empty()) b["blas"] = cpu_blas_json();  // which BLAS kernels, chosen by whom
  return b;
}

// The breakdown, memory and MFU part of the report (collective).
void report_accounting(const RunSettings& run, const Accounting& acct, nlohmann::json& report) {
  dist::Comm& world = run.world;
  const bool root = world.rank() == 0;
  const double job_peak = acct.job_peak(), step_flops = acct.step_flops();
  const MemoryUse used = acct.memory_use();
  const perf::Memory predicted = perf::rank_memory(run.rc.model, run.rc.layout(), run.me.pp, run.ops.precision());
  const auto parts = acct.accounted_times().parts();
  const double steps = std::max<int64_t>(acct.accounted_steps(), 1);
  std::vector<std::vector<double>> per_part;  // [part][rank] seconds per step
  for (double p : parts) per_part.push_back(gather_values(world, p / steps));
  const auto step_s = gather_values(world, acct.accounted_steps() > 0 ? acct.accounted_times().total / steps : 0.0);
  const auto share = gather_values(world, acct.run_seconds() > 0 ? acct.self_seconds() / acct.run_seconds() : 0.0);
  const auto peaks = gather_values(world, acct.peak().flops);
  const std::vector<double> mine = {used.params,      used.grads,          used.optimizer,
                                    used.activations, used.peak,           predicted.params,
                                    predicted.grads,  predicted.optimizer, predicted.activations};
  std::vector<double> mem(mine.size() * size_t(world.size()), 0.0);
  if (world.size() > 1) world.all_gather(mine.data(), mem.data(), mine.size(), DType::F64);
  else mem = mine;
  const nlohmann::json step_times = acct.stragglers().report();
  if (!root) return;
  if (!step_times.is_null()) report["step_time_per_rank"] = step_times;
  const int n = world.size();
  const auto mean = [n](const std::vector<double>& v) {
    double x = 0;
    for (double e : v) x += e;
    return x / n;
  };
  if (acct.accounted_steps() > 0) {
    const double acc_s = acct.accounted_seconds();
    const double mfu = job_peak > 0 && acc_s > 0 ? step_flops * double(acct.accounted_steps()) / acc_s / job_peak : 0;
    report["mfu"] = mfu;
    report["model_flops_per_step"] = step_flops;
    std::printf("  MFU %.1f%% (%.3g model FLOP per step over %.3g FLOP/s of %d rank%s; peak: %s)\n", 100.0 * mfu,
                step_flops, job_peak, n, n > 1 ? "s" : "", acct.peak().source.c_str());
  }
  std::vector<double> tflops;
  for (double p : peaks) tflops.push_back(p / 1e12);
  report["peak"] = {{"per_rank_tflops", tflops}, {"job_tflops", job_peak / 1e12}, {"source", acct.peak().source}};
  if (acct.breakdown() && acct.accounted_steps() > 0) {
    nlohmann::json mean_j = nlohmann::json::object(), ranks = nlohmann::json::array();
    for (int r = 0; r < n; ++r) ranks.push_back(nlohmann::json::object());
    std::printf("  time per step (mean over ranks, steps 2..): total %.1f ms =", mean(step_s) * 1e3);
    for (size_t i = 0; i < parts.size(); ++i) {
      mean_j[StepTimes::kNames[i]] = mean(per_part[i]);
      for (int r = 0; r < n; ++r) ranks[size_t(r)][StepTimes::kNames[i]] = per_part[i][size_t(r)];
      if (StepTimes::kNames[i] != std::string("comm_hidden"))
        std::printf(" %s %.1f", StepTimes::kNames[i], mean(per_part[i]) * 1e3);
    }
    const double hidden = mean(per_part[2]);
    if (hidden > 0) std::printf(" (communication hidden behind compute: %.1f ms)\n", hidden * 1e3);
    else std::printf(" (hidden communication: none; MPI progresses only inside its calls)\n");
    mean_j["total"] = mean(step_s);
    for (int r = 0; r < n; ++r) ranks[size_t(r)]["total"] = step_s[size_t(r)];
    report["time_per_step_s"] = {{"mean", mean_j}, {"per_rank", ranks}};
  }
  double worst = 0;
  for (double x : share) worst = std::max(worst, x);
  report["accounting_share"] = worst;
  std::printf("  accounting cost: %.3f%% of step time (largest over ranks, measured)\n", 100.0 * worst);
  nlohmann::json mj = nlohmann::json::array();
  const auto mib = [](double b) { return b / 1048576.0; };
  std::printf("  memory per rank (MiB; measured / cost model): params, grads, optimizer, activations | peak\n");
  for (int r = 0; r < n; ++r) {
    const double* m = mem.data() + size_t(r) * mine.size();
    mj.push_back(
        {{"params", mib(m[0])},
         {"grads", mib(m[1])},
         {"optimizer", mib(m[2])},
         {"activations", mib(m[3])},
         {"peak", mib(m[4])},
         {"predicted",
          {{"params", mib(m[5])}, {"grads", mib(m[6])}, {"optimizer", mib(m[7])}, {"activations", mib(m[8])}}}});
    std::printf("    rank %d: %.1f/%.1f, %.1f/%.1f, %.1f/%.1f, %.1f/%.1f | %.0f\n", r, mib(m[0]), mib(m[5]), mib(m[1]),
                mib(m[6]), mib(m[2]), mib(m[7]), mib(m[3]), mib(m[8]), mib(m[4]));
  }
  report["memory_mib_per_rank"] = mj;
  if (acct.atm().layers > 0) {
    report["atm"] = {{"mu", acct.atm().mu_sum / acct.atm().layers},
                     {"saved_attention_flops_per_step", acct.atm().saved_flops},
                     {"saved_share_of_model_flops", step_flops > 0 ? acct.atm().saved_flops / step_flops : 0.0}};
  }
}

// Every rank's peak RSS, compute and schedule seconds and wire bytes per
// group, and the cost model's bytes per group (rank 0: all ranks'; the
// others: their own; collective).
struct RankFigures {
  double rss = 0;  // this rank's
  std::vector<double> rss_all, busy, sched;
  std::vector<double> wire, analytic;  // [rank][group], kGroups
};

const std::vector<std::string> kGroups = {"tp", "pp", "dp", "embed", "mp"};

RankFigures gather_rank_figures(const RunSettings& run, const RankComms& comms, const RankOptimizer& optimizer,
                                const RankModel& model, const RunMeasure& meas) {
  const RunConfig& rc = run.rc;
  dist::Comm& world = comms.grid->world();
  RankFigures f;
  f.rss = peak_rss_mib();
  f.rss_all.assign(size_t(world.size()), f.rss);
  f.busy.assign(size_t(world.size()), meas.busy_s);
  f.sched.assign(size_t(world.size()), meas.sched_s);
  std::vector<double> wire(kGroups.size());
  for (size_t i = 0; i < kGroups.size(); ++i)
    wire[i] = double(meas.traffic.count(kGroups[i]) ? meas.traffic.at(kGroups[i]).wire_bytes : 0);
  f.wire.assign(kGroups.size() * size_t(world.size()), 0.0);
  if (world.size() > 1) {
    world.all_gather(&f.rss, f.rss_all.data(), 1, DType::F64);
    world.all_gather(&meas.busy_s, f.busy.data(), 1, DType::F64);
    world.all_gather(&meas.sched_s, f.sched.data(), 1, DType::F64);
    world.all_gather(wire.data(), f.wire.data(), wire.size(), DType::F64);
  } else {
    f.wire = wire;
  }
  const perf::Traffic model_traffic =
      perf::rank_traffic(rc.model, rc.layout(), run.me.pp, double(optimizer.padded_params(model)));
  std::vector<double> analytic = {model_traffic.tp, model_traffic.pp, model_traffic.dp, model_traffic.embed, 0};
  f.analytic.assign(kGroups.size() * size_t(world.size()), 0.0);
  if (world.size() > 1) world.all_gather(analytic.data(), f.analytic.data(), analytic.size(), DType::F64);
  else f.analytic = analytic;
  return f;
}

// The measured pipeline: the bubble (the share of the schedule's wall time
// a rank is not computing, waiting for its neighbours, averaged over ranks),
// each rank's compute per step and the communication per group (rank 0,
// more than one rank).
void report_measured_pipeline(const RankFigures& f, int64_t steps, int64_t run_steps, const std::string& bubble_for,
                              const dist::PipelineSim& bubble, const perf::Layout& layout, nlohmann::json& report) {
  const int n = int(f.busy.size());
  double idle = 0;
  std::vector<double> per_rank;
  for (int r = 0; r < n; ++r)
    per_rank.push_back(f.sched[size_t(r)] > 0 ? 1.0 - f.busy[size_t(r)] / f.sched[size_t(r)] : 0.0);
  for (double x : per_rank) idle += x;
  idle /= n;
  report["bubble_measured"] = idle;
  report["bubble_measured_per_rank"] = per_rank;  // each rank's idle share of its schedule time
  // Compute seconds per step of every rank: shows stage imbalance (the
  // last stage also runs the head and the loss).
  std::vector<double> busy_per_step;
  for (double b : f.busy) busy_per_step.push_back(b / double(steps));
  report["compute_s_per_step"] = busy_per_step;
  std::printf(
      "  pipeline: predicted bubble of %s %.3f (%.3f fill/drain + %.3f imbalance; %s = "
      "%.3f), measured idle share of the schedule %.3f (mean over ranks, steps 2..%lld)\n",
      bubble_for.c_str(), bubble.bubble_fraction, bubble.bubble_fill_drain, bubble.bubble_imbalance,
      perf::bubble_formula_name(layout), perf::bubble_formula(layout), idle, (long long)run_steps);
  std::printf("  communication per rank per step (steps 2..; wire bytes, measured / analytic, max over ranks):\n");
  nlohmann::json comm = nlohmann::json::object();
  for (size_t i = 0; i < kGroups.size(); ++i) {
    double measured = 0, ana = 0;
    for (int r = 0; r < n; ++r) {
      measured = std::max(measured, f.wire[size_t(r) * kGroups.size() + i] / double(steps));
      ana = std::max(ana, f.analytic[size_t(r) * kGroups.size() + i]);
    }
    if (measured == 0 && ana == 0) continue;
    std::printf("    %-6s %12s / %s\n", kGroups[i].c_str(), human_bytes(measured).c_str(),
                kGroups[i] == "mp" ? "(norm scalars)" : human_bytes(ana).c_str());
    comm[kGroups[i]] = {{"measured_bytes", measured}, {"analytic_bytes", ana}};
  }
  report["comm_per_rank_per_step"] = comm;
}

}  // namespace

void write_run_report(const RunSettings& run, const RankComms& comms, const RankOptimizer& optimizer,
                      const RankModel& model, const Accounting& acct, const TrainSummary& sum,
                      const std::filesystem::path& run_dir) {
  const RunConfig& rc = run.rc;
  const RunMeasure& meas = acct.measure();
  dist::Comm& world = comms.grid->world();
  const auto& par = rc.parallel;
  const bool root = world.rank() == 0;
  const RankFigures figures = gather_rank_figures(run, comms, optimizer, model, meas);

  // The predicted bubble of the run's own schedule: the simulator on the
  // stages' FLOPs (perf::schedule_bubble; W its weight-GEMM share), beside
  // the balanced formula: 1F1B's (p-1)/(m+p-1), interleaved's with (p-1)/v
  // (what the planner's bubble_analytic says).
  const dist::PipelineSim bubble = perf::schedule_bubble(rc.model, rc.layout());
  const double formula = perf::bubble_formula(rc.layout());
  const std::string bubble_for = std::string(to_string(par.schedule)) + ", simulated on the stages' FLOPs";
  nlohmann::json report;
  if (root) {
    std::printf("done: %lld steps, loss %.4f -> %.4f", (long long)sum.steps, sum.first_loss, sum.last_loss);
    if (sum.val_loss >= 0) std::printf(", val %.4f", sum.val_loss);
    for (const TaskScores& ts : sum.tasks)
      std::printf(", %s acc %.4f acc_norm %.4f", ts.name.c_str(), ts.acc, ts.acc_norm);
    std::printf(", %.0f tokens/s, %lld skipped steps, peak RSS %.0f MiB (rank 0)\n", sum.tokens_per_s,
                (long long)sum.skipped, figures.rss);
    for (const auto& s : acct.atm_stats())
      std::printf("  ATM layer %d (last batch): mu = %.4f, visible attention pairs %.2f%% of causal\n", s.layer, s.mu,
                  100.0 * s.visible_fraction);
    report = {{"world", world.size()},
              {"tp", par.tp},
              {"pp", par.pp},
              {"dp", par.dp},
              {"zero", optimizer.zero},
              {"schedule", to_string(par.schedule)},
              {"micro_batches", rc.train.grad_accum},
              {"data_plane", comms.data_plane},
              {"overlap", optimizer.overlap},
              {"steps", sum.steps},
              {"tokens_per_s", sum.tokens_per_s},
              {"bubble_predicted", bubble.bubble_fraction},
              {"bubble_predicted_schedule", bubble_for},
              {"bubble_predicted_fill_drain", bubble.bubble_fill_drain},
              {"bubble_predicted_imbalance", bubble.bubble_imbalance},
              {"bubble_formula", formula}};
    for (const TaskScores& ts : sum.tasks)  // the last scores of train.eval_tasks
      report["tasks"][ts.name] = {
          {"items", ts.items}, {"acc", ts.acc}, {"acc_norm", ts.acc_norm}, {"gold_loglik", ts.gold_loglik}};
    if (meas.steps > 0 && world.size() > 1)
      report_measured_pipeline(figures, meas.steps, sum.steps, bubble_for, bubble, rc.layout(), report);
  }
  nlohmann::json acct_json = nlohmann::json::object();
  report_accounting(run, acct, acct_json);
  if (root) {
    std::printf("  peak RSS per rank (MiB):");
    for (double r : figures.rss_all) std::printf(" %.0f", r);
    std::printf("\n  metrics: %s\n", (run_dir / "metrics.jsonl").string().c_str());
    report["peak_rss_mib"] = figures.rss_all;
    report["backend"] = backend_json(run);
    const dist::Placement& pl = comms.placement;
    report["placement"] = {
        {"nodes", pl.nodes},
        {"rank_node", pl.rank_node},
        {"links", {{"tp", dist::link_name(pl.tp)}, {"pp", dist::link_name(pl.pp)}, {"dp", dist::link_name(pl.dp)}}}};
    report.update(acct_json);
    write_text_atomic((run_dir / "report.json").string(), report.dump(2) + "\n");
    std::fflush(stdout);
  }
}

}  // namespace wiola
