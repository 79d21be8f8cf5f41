// The pipeline bubble, explained (issue 37): for wiola-1.5b and wiola-360m
// on 64 H100s with the planner's device model (the committed H100 profile),
// step time, the simulated bubble split into fill/drain and stage imbalance
// (dist::PipelineSim, docs/distributed.md §4) and the peak activation memory
// per rank, for the planner's best layout and pp 4 / 8 at several numbers of
// micro-batches, per schedule: 1F1B, GPipe, interleaved 1F1B (v = 2, 4
// chunks per rank where p·v ≤ L and m % p == 0), ZB-H1 (B and W timed
// apart: W the weight-gradient GEMMs, perf::StageFlops::bwd_weight) and ZB-V
// (two chunks per rank in a V, where m ≥ p and 2p ≤ L). The chunked
// schedules' chunks are cut by the FLOP balancer ("compute") and by the
// chunk balancer ("chunks": perf::balance_chunks, the simulated step
// minimised); on GPUs wiola train sends their pipeline messages through
// host memory, which these figures do not time (marked in the row). No MPI,
// no GPU: the planner's predictions.
//
//   build/bench/wiola_pipeline_bubbles
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "model/config.h"
#include "perf/device_profile.h"
#include "perf/planner.h"

using namespace wiola;
using namespace wiola::perf;

namespace {

constexpr int kGpus = 64;
constexpr double kGiB = 1073741824.0;
const Precision kBf16{DType::BF16, DType::F32, DType::BF16, true};  // as `wiola plan` on a GPU

void print_header() {
  std::printf("  %-26s %-14s %-8s %9s %8s %10s %10s %9s %9s  %s\n", "layout (tp pp dp, mb x m)", "schedule", "balance",
              "step s", "bubble", "fill/drn", "imbalance", "act GiB", "live mb", "");
}

void print_row(const ModelConfig& c, const Cluster& cl, ComputeModel& cm, Layout lay, dist::Schedule schedule,
               const std::string& balance, int v = 1) {
  lay.schedule = schedule;
  lay.stage_balance = balance == "layers" ? StageBalance::Layers : StageBalance::Compute;  // "chunks": compute
  lay.virtual_stages = v;
  if (balance == "chunks") lay = balance_chunks(c, lay, cl, cm, kBf16);
  const Workload w = wiola_workload(c, lay, kBf16);
  const Prediction p = predict(w, cl, cm);
  double act = 0;  // the fullest rank's activations (the first stage under 1F1B)
  for (const StageWork& s : w.stages) act = std::max(act, s.memory.activations);
  char name[64];
  std::snprintf(name, sizeof name, "%d %d %d, %dx%d%s%s", lay.tp, lay.pp, lay.dp, lay.micro_batch, lay.micro_batches,
                lay.zero_active() ? " z" : "", lay.recompute ? " rc" : "");
  // Live activations at the peak, in micro-batches of a rank's layers: the
  // first rank's and the last's.
  char live[32];
  std::snprintf(live, sizeof live, "%g/%g", p.peak_live.front(), p.peak_live.back());
  const std::string sched =
      std::string(to_string(schedule)) + (schedule == dist::Schedule::Interleaved ? " v" + std::to_string(v) : "");
  std::string note = p.fits ? "" : "does not fit: " + p.why_not;
  if (dist::chunked(schedule))
    note += (note.empty() ? "" : "; ") + std::string("not picked on GPUs: pipeline messages through host memory");
  if (!lay.cuts.empty()) {
    note += note.empty() ? "chunks" : "; chunks";
    for (size_t k = 1; k < lay.cuts.size(); ++k) {
      note += ' ';
      note += std::to_string(lay.cuts[k] - lay.cuts[k - 1]);
    }
  }
  std::printf("  %-26s %-14s %-8s %9.3f %7.1f%% %9.1f%% %9.1f%% %9.2f %9s  %s\n", name, sched.c_str(), balance.c_str(),
              p.step_s, 100 * p.bubble_sim, 100 * p.bubble_fill_drain, 100 * p.bubble_imbalance, act / kGiB, live,
              note.c_str());
}

// The layout with tp 1 and `pp` stages over the 64 GPUs at micro-batch mb,
// the best layout's ZeRO and recompute choices kept.
Layout with_pp(const Layout& best, int global_batch, int pp, int mb) {
  Layout l = best;
  l.tp = 1;
  l.pp = pp;
  l.dp = kGpus / pp;
  l.micro_batch = mb;
  l.micro_batches = global_batch / l.dp / mb;
  return l;
}

void report(const std::string& model) {
  const ModelConfig c = model_preset(model);
  const Cluster cl = Cluster::gpu("h100", kGpus);
  const auto cm = gpu_compute_model(cl, GpuComputeChoice{});
  const int global_batch = std::max(1, int(std::lround(524288.0 / c.T)));  // `wiola plan`'s default
  SearchSpace sp;
  sp.global_batch = global_batch;
  const Layout best = search_wiola(c, cl, *cm, sp, kBf16).front().layout;
  std::printf("\n%s on %d H100s, global batch %d x %d tokens; best layout (wiola plan): %s\n", model.c_str(), kGpus,
              global_batch, c.T, best.name().c_str());
  std::printf("  compute: %s\n", cm->describe().c_str());
  {  // The split backward's parts on the first and the last stage of tp1 pp8, micro-batch 1.
    Layout l = with_pp(best, global_batch, 8, 1);
    l.schedule = dist::Schedule::ZbH1;
    const Prediction p = predict(wiola_workload(c, l, kBf16), cl, *cm);
    for (size_t s : {size_t(0), p.stage_fwd_s.size() - 1})
      std::printf("  pp8 stage %zu, one micro-batch: F %.2f ms, B %.2f ms, W %.2f ms\n", s, 1e3 * p.stage_fwd_s[s],
                  1e3 * (p.stage_bwd_s[s] - p.stage_bwd_weight_s[s]), 1e3 * p.stage_bwd_weight_s[s]);
  }
  {  // What `wiola plan` says of the schedules for tp1 pp8, micro-batch 1 (the chunked ones balanced).
    const Prediction p = predict_schedules(c, with_pp(best, global_batch, 8, 1), cl, *cm, kBf16);
    std::printf("  wiola plan's schedule choice at tp1 pp8, 1x%d: %s\n", p.layout.micro_batches,
                p.schedule_why.c_str());
  }
  print_header();
  std::vector<Layout> layouts = {best};
  for (int pp : {4, 8})
    for (int mb : {1, 2, 4, 8})
      if ((global_batch / (kGpus / pp)) % mb == 0) layouts.push_back(with_pp(best, global_batch, pp, mb));
  for (const Layout& l : layouts) {
    print_row(c, cl, *cm, l, dist::Schedule::OneFOneB, "compute");
    if (l.pp == 1) continue;                                       // no pipeline: nothing to split or schedule
    print_row(c, cl, *cm, l, dist::Schedule::OneFOneB, "layers");  // the even split, against the FLOP-balanced one
    print_row(c, cl, *cm, l, dist::Schedule::GPipe, "compute");
    for (int v : {2, 4})
      if (l.pp * v <= c.L && l.micro_batches % l.pp == 0)
        for (const char* balance : {"compute", "chunks"})
          print_row(c, cl, *cm, l, dist::Schedule::Interleaved, balance, v);
    print_row(c, cl, *cm, l, dist::Schedule::ZbH1, "compute");
    if (l.micro_batches >= l.pp && 2 * l.pp <= c.L)
      for (const char* balance : {"compute", "chunks"}) print_row(c, cl, *cm, l, dist::Schedule::ZbV, balance);
    else std::printf("  %-26s %-14s needs m >= p = %d micro-batches\n", "", "zb-v", l.pp);
  }
}

}  // namespace

int main() {
  std::printf(
      "wiola_pipeline_bubbles: simulated bubble = fill/drain (every stage at the mean stage cost) + "
      "imbalance (the rest); act GiB: peak activation memory of the fullest rank; live mb: live "
      "activations at the peak, in micro-batches of the rank's layers, first rank/last rank\n");
  for (const char* m : {"wiola-1.5b", "wiola-360m"}) report(m);
  return 0;
}
