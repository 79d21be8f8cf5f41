#include "train/run_report.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/schedule.h"
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

// Bytes this rank should put on the wire per step in each group, from the
// model's shapes (ring all-reduce 2(p-1)/p·n, reduce-scatter/all-gather
// (p-1)/p·n each, sends n). The measured figures come from the communicators.
struct TrafficModel {
  double tp = 0, pp = 0, dp = 0, embed = 0;
};
TrafficModel analytic_traffic(const RunConfig& rc, const Model<float>& model, const dist::Grid& grid,
                              size_t padded_params) {
  const auto& g = grid.config();
  const ModelConfig& c = rc.model;
  const double N = double(rc.train.micro_batch) * c.T, d = c.d, m = rc.train.grad_accum, f = 4;
  const ModelShard& s = model.shard();
  const double nl = s.end(c) - s.layer_begin;
  TrafficModel t;
  if (g.tp > 1) {
    // Per micro-batch: 3 all-reduces of [N,d] per layer forward (A, a, b),
    // 2 in backward (column-parallel input gradients), 3 more when the
    // backward recomputes the forward; one per summary gradient made here;
    // the embedding output (first stage); CE max/sum-exp/target [N] and the
    // head input gradient [N,d] (last stage); dφ (one double per layer).
    double elems = nl * (5 + (rc.train.recompute ? 3 : 0)) * N * d + nl * N * d;
    if (s.first_stage()) elems += N * d;
    if (s.last_stage(c)) elems += 3 * N + N * d;
    const double bytes = m * (elems * f + nl * 8);
    t.tp = 2.0 * (g.tp - 1) / g.tp * bytes;
  }
  if (g.pp > 1)
    t.pp = m * double(model.boundary_in() + model.boundary_out()) * N * d * f;
  if (g.dp > 1)
    t.dp = 2.0 * (g.dp - 1) / g.dp * double(padded_params) * f;
  if (g.pp > 1 && (s.first_stage() || s.last_stage(c))) {
    const LocalDims ld(c, s);
    t.embed = double(ld.V) * d * f;  // all-reduce between 2 ranks: 2·(1/2)·n
  }
  return t;
}

}  // namespace

void write_run_report(dist::Grid& grid, const RunConfig& rc, const Model<float>& model,
                      size_t padded_params, bool zero, bool overlap, const TrainSummary& sum,
                      const RunMeasure& meas, const std::vector<Model<float>::AtmStats>& atm,
                      const std::filesystem::path& run_dir) {
  dist::Comm& world = grid.world();
  const auto& par = rc.parallel;
  const int m = rc.train.grad_accum;
  const bool root = world.rank() == 0;
  const double rss = peak_rss_mib();
  std::vector<double> rank_rss(size_t(world.size()), rss);
  std::vector<double> rank_busy(size_t(world.size()), meas.busy_s), rank_sched(size_t(world.size()), meas.sched_s);
  const std::vector<std::string> groups = {"tp", "pp", "dp", "embed", "mp"};
  std::vector<double> wire(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) wire[i] = double(meas.traffic.count(groups[i]) ? meas.traffic.at(groups[i]).wire_bytes : 0);
  std::vector<double> rank_wire(groups.size() * size_t(world.size()), 0.0);
  if (world.size() > 1) {
    world.all_gather(&rss, rank_rss.data(), 1, DType::F64);
    world.all_gather(&meas.busy_s, rank_busy.data(), 1, DType::F64);
    world.all_gather(&meas.sched_s, rank_sched.data(), 1, DType::F64);
    world.all_gather(wire.data(), rank_wire.data(), wire.size(), DType::F64);
  } else {
    rank_wire = wire;
  }
  const TrafficModel model_traffic = analytic_traffic(rc, model, grid, padded_params);
  std::vector<double> analytic = {model_traffic.tp, model_traffic.pp, model_traffic.dp, model_traffic.embed, 0};
  std::vector<double> rank_analytic(groups.size() * size_t(world.size()), 0.0);
  if (world.size() > 1) world.all_gather(analytic.data(), rank_analytic.data(), analytic.size(), DType::F64);
  else rank_analytic = analytic;

  if (root) {
    std::printf("done: %lld steps, loss %.4f -> %.4f", (long long)sum.steps, sum.first_loss, sum.last_loss);
    if (sum.val_loss >= 0) std::printf(", val %.4f", sum.val_loss);
    std::printf(", %.0f tokens/s, %lld skipped steps, peak RSS %.0f MiB (rank 0)\n", sum.tokens_per_s,
                (long long)sum.skipped, rss);
    for (const auto& s : atm)
      std::printf("  ATM layer %d (last batch): mu = %.4f, visible attention pairs %.2f%% of causal\n",
                  s.layer, s.mu, 100.0 * s.visible_fraction);
    nlohmann::json report = {{"world", world.size()}, {"tp", par.tp}, {"pp", par.pp}, {"dp", par.dp},
                             {"zero", zero}, {"schedule", par.schedule}, {"micro_batches", m},
                             {"overlap", overlap}, {"steps", sum.steps}, {"tokens_per_s", sum.tokens_per_s},
                             {"bubble_predicted", dist::bubble_fraction_predicted(par.pp, m)}};
    if (meas.steps > 0 && world.size() > 1) {
      // Bubble: the share of the schedule's wall time a rank is not
      // computing (waiting for its neighbours), averaged over ranks.
      double idle = 0;
      for (int r = 0; r < world.size(); ++r)
        idle += rank_sched[size_t(r)] > 0 ? 1.0 - rank_busy[size_t(r)] / rank_sched[size_t(r)] : 0.0;
      idle /= world.size();
      report["bubble_measured"] = idle;
      // Compute seconds per step of every rank: shows stage imbalance (the
      // last stage also runs the head and the loss).
      std::vector<double> busy_per_step;
      for (double b : rank_busy) busy_per_step.push_back(b / double(meas.steps));
      report["compute_s_per_step"] = busy_per_step;
      std::printf("  pipeline: predicted bubble (p-1)/(m+p-1) = %.3f, measured idle share of the schedule %.3f "
                  "(mean over ranks, steps 2..%lld)\n",
                  dist::bubble_fraction_predicted(par.pp, m), idle, (long long)sum.steps);
      std::printf("  communication per rank per step (steps 2..; wire bytes, measured / analytic, max over ranks):\n");
      nlohmann::json comm = nlohmann::json::object();
      for (size_t i = 0; i < groups.size(); ++i) {
        double measured = 0, ana = 0;
        for (int r = 0; r < world.size(); ++r) {
          measured = std::max(measured, rank_wire[size_t(r) * groups.size() + i] / double(meas.steps));
          ana = std::max(ana, rank_analytic[size_t(r) * groups.size() + i]);
        }
        if (measured == 0 && ana == 0) continue;
        std::printf("    %-6s %12s / %s\n", groups[i].c_str(), human_bytes(measured).c_str(),
                    groups[i] == "mp" ? "(norm scalars)" : human_bytes(ana).c_str());
        comm[groups[i]] = {{"measured_bytes", measured}, {"analytic_bytes", ana}};
      }
      report["comm_per_rank_per_step"] = comm;
    }
    std::printf("  peak RSS per rank (MiB):");
    for (double r : rank_rss) std::printf(" %.0f", r);
    std::printf("\n  metrics: %s\n", (run_dir / "metrics.jsonl").string().c_str());
    report["peak_rss_mib"] = rank_rss;
    write_text_atomic((run_dir / "report.json").string(), report.dump(2) + "\n");
    std::fflush(stdout);
  }
}

}  // namespace wiola
