// Checks a run's executed pipeline order (issue 37: "each rank's executed
// order of actions equals the simulator's, exactly"). Reads the per-rank
// traces `wiola train` writes under WIOLA_TRACE_SCHEDULE=1
// (RUN_DIR/schedule_trace/rank<R>.txt, TrainOptions::trace_schedule) and
// requires, for every rank and every step 1..STEPS, the executed actions to
// equal dist::to_string(schedule(pp, stage, m)) exactly; every stage must be
// present DP·TP times. Then the simulator (dist::simulate_pipeline) runs the
// same schedules under balanced and uneven stage costs (with and without a
// link delay, W timed apart): on every rank its actions must start in the
// schedule's order, each after the previous one ended. The chunked
// schedules (interleaved with V chunks per rank, default 2; zb-v) are costed
// per global chunk.
//
//   schedule_trace_check RUN_DIR SCHEDULE PP DP TP M STEPS [V]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "dist/schedule.h"

namespace {

using wiola::dist::Action;

std::vector<Action> schedule_of(const std::string& name, int pp, int stage, int m, int v) {
  if (name == "1f1b") return wiola::dist::schedule_1f1b(pp, stage, m);
  if (name == "gpipe") return wiola::dist::schedule_gpipe(pp, stage, m);
  if (name == "zb-h1") return wiola::dist::schedule_zb_h1(pp, stage, m);
  if (name == "interleaved") return wiola::dist::schedule_interleaved(pp, stage, m, v);
  if (name == "zb-v") return wiola::dist::schedule_zb_v(pp, stage, m);
  std::fprintf(stderr, "schedule_trace_check: unknown schedule '%s'\n", name.c_str());
  std::exit(2);
}

int failures = 0;
void mismatch(const std::string& what) {
  std::fprintf(stderr, "MISMATCH: %s\n", what.c_str());
  ++failures;
}

// The simulator's per-rank order under `cost` equals the schedules' order.
void check_simulator(const std::vector<std::vector<Action>>& sched, const wiola::dist::StageCosts& cost,
                     wiola::dist::ChunkPlacement placement, const std::string& label) {
  const wiola::dist::PipelineSim sim = wiola::dist::simulate_pipeline(sched, cost, placement);
  for (size_t s = 0; s < sched.size(); ++s) {
    const auto& st = sim.start[s];
    std::vector<size_t> order(st.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return st[a] < st[b]; });
    std::vector<Action> sim_order;
    for (size_t k : order) sim_order.push_back(sched[s][k]);
    if (sim_order != sched[s])
      mismatch(label + ": stage " + std::to_string(s) + " simulated order " + wiola::dist::to_string(sim_order) +
               " != schedule " + wiola::dist::to_string(sched[s]));
    for (size_t k = 1; k < st.size(); ++k)
      if (st[k] < sim.end[s][k - 1])
        mismatch(label + ": stage " + std::to_string(s) + " action " + std::to_string(k) +
                 " starts before the previous one ends");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8 && argc != 9) {
    std::fprintf(stderr, "usage: schedule_trace_check RUN_DIR SCHEDULE PP DP TP M STEPS [V]\n");
    return 2;
  }
  const std::filesystem::path dir = std::filesystem::path(argv[1]) / "schedule_trace";
  const std::string name = argv[2];
  const int pp = std::atoi(argv[3]), dp = std::atoi(argv[4]), tp = std::atoi(argv[5]), m = std::atoi(argv[6]),
            steps = std::atoi(argv[7]);
  const int v = name == "zb-v" ? 2 : name == "interleaved" ? (argc == 9 ? std::atoi(argv[8]) : 2) : 1;
  const auto placement = name == "zb-v" ? wiola::dist::ChunkPlacement::V : wiola::dist::ChunkPlacement::Interleaved;
  std::vector<std::vector<Action>> sched;
  for (int s = 0; s < pp; ++s) sched.push_back(schedule_of(name, pp, s, m, v));

  // The trainer's executed order, every rank, every step.
  std::map<int, int> ranks_per_stage;
  int files = 0;
  for (int r = 0; r < pp * dp * tp; ++r) {
    const auto path = dir / ("rank" + std::to_string(r) + ".txt");
    std::ifstream in(path);
    if (!in) {
      mismatch("no trace " + path.string());
      continue;
    }
    ++files;
    std::string line;
    int expect_step = 1, stage = -1;
    while (std::getline(in, line)) {
      const auto colon = line.find(':');
      std::istringstream head(line.substr(0, colon));
      std::string w1, w2, w3, w4;
      int t = 0, st = 0, d = 0, p = 0;
      head >> w1 >> t >> w2 >> st >> w3 >> d >> w4 >> p;
      if (colon == std::string::npos || w1 != "step" || w2 != "stage" || st < 0 || st >= pp) {
        mismatch(path.string() + ": unreadable line '" + line + "'");
        continue;
      }
      if (t != expect_step) mismatch(path.string() + ": step " + std::to_string(t) + ", expected " +
                                     std::to_string(expect_step));
      ++expect_step;
      if (stage >= 0 && st != stage) mismatch(path.string() + ": the stage changed");
      stage = st;
      const std::string executed = line.substr(colon + 2), expected = wiola::dist::to_string(sched[size_t(st)]);
      if (executed != expected)
        mismatch("rank " + std::to_string(r) + " stage " + std::to_string(st) + " step " + std::to_string(t) +
                 ": executed '" + executed + "', schedule '" + expected + "'");
    }
    if (expect_step != steps + 1)
      mismatch(path.string() + ": " + std::to_string(expect_step - 1) + " steps traced, expected " +
               std::to_string(steps));
    if (stage >= 0) ++ranks_per_stage[stage];
    if (r == 0 || stage == pp - 1)
      std::printf("rank %d stage %d: %s\n", r, stage, wiola::dist::to_string(sched[size_t(std::max(stage, 0))]).c_str());
  }
  for (int s = 0; s < pp; ++s)
    if (ranks_per_stage[s] != dp * tp)
      mismatch("stage " + std::to_string(s) + " ran on " + std::to_string(ranks_per_stage[s]) + " ranks, expected " +
               std::to_string(dp * tp));

  // The simulator's order: balanced, uneven stages (a heavier last chunk,
  // W about a third of the backward) with and without a link delay.
  wiola::dist::StageCosts even, uneven;
  for (int g = 0; g < pp * v; ++g) {
    even.fwd.push_back(1);
    even.bwd.push_back(2);
    even.bwd_weight.push_back(0.9);
    const double f = 1 + 0.25 * g / v + (g == pp * v - 1 ? 1.5 : 0);
    uneven.fwd.push_back(f);
    uneven.bwd.push_back(2 * f);
    uneven.bwd_weight.push_back(0.7 * f);
  }
  check_simulator(sched, even, placement, "simulator (balanced)");
  check_simulator(sched, uneven, placement, "simulator (uneven)");
  uneven.link = 0.4;
  check_simulator(sched, uneven, placement, "simulator (uneven, link 0.4)");

  std::printf("schedule %s pp %d dp %d tp %d m %d: %d rank traces x %d steps %s; simulator order %s\n", name.c_str(),
              pp, dp, tp, m, files, steps, failures ? "CHECKED WITH MISMATCHES" : "equal the schedule",
              failures ? "(see above)" : "equal");
  return failures ? 1 : 0;
}
