// Pipeline schedules: completeness, satisfiable dependencies (whole-pipeline
// simulation), in-flight activation bounds and the bubble formula.
#include <gtest/gtest.h>

#include <map>

#include "dist/schedule.h"
#include "util/error.h"

using namespace wiola::dist;

namespace {
using Sched = std::vector<Action> (*)(int, int, int);

void check_schedule(Sched make, int pp, int m, int max_live_of_stage0) {
  std::vector<std::vector<Action>> all;
  for (int s = 0; s < pp; ++s) {
    const auto sc = make(pp, s, m);
    all.push_back(sc);
    // Each micro-batch forwarded once and backwarded once, forward first.
    std::map<int, int> f, b;
    for (const Action& a : sc) {
      if (a.op == Op::Fwd) {
        EXPECT_EQ(b[a.micro], 0);
        ++f[a.micro];
      } else {
        EXPECT_EQ(f[a.micro], 1) << "backward before forward, micro " << a.micro;
        ++b[a.micro];
      }
    }
    ASSERT_EQ(int(sc.size()), 2 * m);
    for (int i = 0; i < m; ++i) {
      EXPECT_EQ(f[i], 1);
      EXPECT_EQ(b[i], 1);
    }
    const int live = max_in_flight(sc);
    if (max_live_of_stage0 < 0)  // 1F1B bound
      EXPECT_LE(live, std::min(pp - s, m)) << "pp=" << pp << " stage=" << s;
    else
      EXPECT_LE(live, m);
  }
  // Dependencies satisfiable: the simulation finds a global order (throws on deadlock).
  PipelineSim sim;
  ASSERT_NO_THROW(sim = simulate_pipeline(all, 1.0, 2.0)) << "pp=" << pp << " m=" << m;
  EXPECT_GT(sim.makespan, 0.0);
}
}  // namespace

TEST(Schedule, OneFOneBShape) {
  EXPECT_EQ(to_string(schedule_1f1b(4, 0, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(to_string(schedule_1f1b(4, 3, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  EXPECT_EQ(to_string(schedule_1f1b(4, 1, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(to_string(schedule_gpipe(2, 0, 3)), "F0 F1 F2 B0 B1 B2");
}

TEST(Schedule, AllConfigurationsCompleteAndDeadlockFree) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 12; ++m) {
      check_schedule(&schedule_1f1b, pp, m, -1);
      check_schedule(&schedule_gpipe, pp, m, m);
    }
}

TEST(Schedule, OneFOneBPeakActivationsIsPpMinusStage) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int s = 0; s < pp; ++s)
      EXPECT_EQ(max_in_flight(schedule_1f1b(pp, s, 16)), pp - s);
  EXPECT_EQ(max_in_flight(schedule_gpipe(4, 0, 16)), 16);
}

TEST(Schedule, SimulatedBubbleMatchesFormula) {
  // Balanced stages, any t_fwd/t_bwd: makespan = (m + p − 1)(t_f + t_b).
  for (int pp = 1; pp <= 6; ++pp)
    for (int m = 1; m <= 10; ++m)
      for (Sched make : {&schedule_1f1b, &schedule_gpipe}) {
        std::vector<std::vector<Action>> all;
        for (int s = 0; s < pp; ++s) all.push_back(make(pp, s, m));
        const PipelineSim sim = simulate_pipeline(all, 1.0, 2.0);
        EXPECT_DOUBLE_EQ(sim.makespan, 3.0 * (m + pp - 1)) << "pp=" << pp << " m=" << m;
        EXPECT_NEAR(sim.bubble_fraction, bubble_fraction_predicted(pp, m), 1e-12);
      }
  EXPECT_DOUBLE_EQ(bubble_fraction_predicted(4, 8), 3.0 / 11.0);
}

namespace {
std::vector<std::vector<Action>> whole_pipeline(Sched make, int pp, int m) {
  std::vector<std::vector<Action>> all;
  for (int s = 0; s < pp; ++s) all.push_back(make(pp, s, m));
  return all;
}
}  // namespace

TEST(Schedule, BubbleSplitBalancedIsAllFillDrain) {
  for (int pp = 1; pp <= 6; ++pp)
    for (int m = 1; m <= 10; ++m)
      for (Sched make : {&schedule_1f1b, &schedule_gpipe}) {
        const StageCosts even{std::vector<double>(size_t(pp), 1.0), std::vector<double>(size_t(pp), 2.0), 0.0};
        const PipelineSim sim = simulate_pipeline(whole_pipeline(make, pp, m), even);
        EXPECT_EQ(sim.bubble_imbalance, 0.0) << "pp=" << pp << " m=" << m;
        EXPECT_NEAR(sim.bubble_fill_drain, bubble_fraction_predicted(pp, m), 1e-12);
      }
}

TEST(Schedule, BubbleSplitHeavyLastStageIsImbalance) {
  // The head: the last stage costs two more layers' worth. Same mean cost as
  // the balanced split, so fill/drain is the formula and the rest is imbalance.
  for (int pp : {2, 4, 8})
    for (int m : {4, 8, 32})
      for (Sched make : {&schedule_1f1b, &schedule_gpipe}) {
        StageCosts heavy{std::vector<double>(size_t(pp), 1.0), std::vector<double>(size_t(pp), 2.0), 0.0};
        heavy.fwd.back() = 3.0;
        heavy.bwd.back() = 6.0;
        const PipelineSim sim = simulate_pipeline(whole_pipeline(make, pp, m), heavy);
        EXPECT_GT(sim.bubble_imbalance, 0.01) << "pp=" << pp << " m=" << m;
        EXPECT_NEAR(sim.bubble_fill_drain, bubble_fraction_predicted(pp, m), 1e-12);
        EXPECT_NEAR(sim.bubble_fill_drain + sim.bubble_imbalance, sim.bubble_fraction, 1e-15);
        // Whatever the split, the makespan is at least m times the slowest stage.
        EXPECT_GE(sim.makespan, m * 9.0 - 1e-9);
      }
}

TEST(Schedule, DeadlockDetected) {
  // Stage 1 wants F1 before F0: stage 0 sends F0 first, fine; but a stage 0
  // that runs B0 before F1 while stage 1 waits for F1 first deadlocks.
  std::vector<std::vector<Action>> bad = {
      {{Op::Fwd, 0}, {Op::Bwd, 0}, {Op::Fwd, 1}, {Op::Bwd, 1}},
      {{Op::Fwd, 1}, {Op::Fwd, 0}, {Op::Bwd, 0}, {Op::Bwd, 1}}};
  EXPECT_THROW(simulate_pipeline(bad, 1, 2), wiola::Error);
  EXPECT_THROW(schedule_1f1b(2, 2, 4), wiola::Error);
  EXPECT_THROW(schedule_gpipe(2, 0, 0), wiola::Error);
}
