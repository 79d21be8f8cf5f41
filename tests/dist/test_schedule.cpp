// Pipeline schedules: completeness, satisfiable dependencies (whole-pipeline
// simulation), in-flight activation bounds and the bubble formulas; the
// chunked (interleaved) and split-backward (ZB-H1) schedules, and ZB-V (two
// chunks per rank in a V: placement, dependencies, memory, the paper's
// balanced figure).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

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

// ---- chunks and the split backward (issue 37) --------------------------------------

namespace {
// One rank's schedule: every (micro-batch, chunk < v) forwarded once, then
// backwarded once whole (B) or split (I then W), nothing else.
void check_complete(const std::vector<Action>& sc, int m, int v, const std::string& what) {
  std::map<std::pair<int, int>, std::string> seen;  // (micro, chunk) -> the kinds in order
  for (const Action& a : sc) {
    ASSERT_TRUE(a.micro >= 0 && a.micro < m && a.chunk >= 0 && a.chunk < v) << what << ": " << to_string(a);
    seen[{a.micro, a.chunk}] += to_string(a).substr(0, 1);
  }
  ASSERT_EQ(int(seen.size()), m * v) << what;
  for (const auto& [key, kinds] : seen)
    EXPECT_TRUE(kinds == "FB" || kinds == "FIW") << what << ": micro " << key.first << " chunk " << key.second
                                                 << " runs " << kinds;
}

std::vector<std::vector<Action>> interleaved(int pp, int m, int v) {
  std::vector<std::vector<Action>> all;
  for (int s = 0; s < pp; ++s) all.push_back(schedule_interleaved(pp, s, m, v));
  return all;
}
}  // namespace

TEST(ScheduleChunks, Shapes) {
  EXPECT_EQ(to_string(schedule_interleaved(2, 0, 2, 2)), "F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1");
  EXPECT_EQ(to_string(schedule_interleaved(2, 1, 2, 2)), "F0 F1 F0.1 B0.1 F1.1 B1.1 B0 B1");
  EXPECT_EQ(to_string(schedule_interleaved(2, 1, 4, 2)),
            "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3");
  EXPECT_EQ(schedule_interleaved(4, 2, 8, 1), schedule_1f1b(4, 2, 8));
  // ZB-H1: stage 0 is 1F1B with each backward split in place; the last
  // stage keeps pp − 1 W's pending and runs them after its last B.
  EXPECT_EQ(to_string(schedule_zb_h1(4, 0, 6)), "F0 F1 F2 F3 I0 W0 F4 I1 W1 F5 I2 W2 I3 W3 I4 W4 I5 W5");
  EXPECT_EQ(to_string(schedule_zb_h1(4, 3, 6)), "F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 W3 W4 W5");
  // W operands kept at once (a split backward's weight slots): stage + 1.
  for (int st = 0; st < 4; ++st) {
    EXPECT_EQ(max_pending_weight(schedule_zb_h1(4, st, 6)), st + 1);
    EXPECT_EQ(max_pending_weight(schedule_zb_h1(4, st, 2)), std::min(st + 1, 2));
    EXPECT_EQ(max_pending_weight(schedule_1f1b(4, st, 6)), 0);
  }
  EXPECT_EQ(to_string(Action{Op::BwdWeight, 3, 2}), "W3.2");
  EXPECT_EQ((Action{Op::Fwd, 1}), (Action{Op::Fwd, 1, 0}));
  EXPECT_NE((Action{Op::Fwd, 1}), (Action{Op::Fwd, 1, 1}));
}

TEST(ScheduleChunks, EveryScheduleCompleteAndDeadlockFree) {
  // p 1..8, v 1..4, m p..4p; B and W timed apart, with and without a link delay.
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = pp; m <= 4 * pp; ++m)
      for (double link : {0.0, 0.3}) {
        std::vector<std::vector<std::vector<Action>>> cases;
        std::vector<int> chunks;
        std::vector<std::string> names;
        for (int v = 1; v <= 4; ++v)
          if (v == 1 || m % pp == 0) {
            cases.push_back(interleaved(pp, m, v));
            chunks.push_back(v);
            names.push_back("interleaved v" + std::to_string(v));
          }
        cases.push_back(whole_pipeline(&schedule_zb_h1, pp, m));
        chunks.push_back(1);
        names.push_back("zb-h1");
        for (size_t k = 0; k < cases.size(); ++k) {
          const std::string what = names[k] + " pp=" + std::to_string(pp) + " m=" + std::to_string(m);
          for (int s = 0; s < pp; ++s) check_complete(cases[k][size_t(s)], m, chunks[k], what);
          const size_t n = size_t(pp * chunks[k]);
          const StageCosts cost{std::vector<double>(n, 1.0), std::vector<double>(n, 2.0), link,
                                std::vector<double>(n, 0.8)};
          PipelineSim sim;
          ASSERT_NO_THROW(sim = simulate_pipeline(cases[k], cost)) << what;
          EXPECT_GT(sim.makespan, 0.0) << what;
          for (int s = 0; s < pp; ++s) {
            EXPECT_EQ(sim.peak_live[size_t(s)], max_in_flight(cases[k][size_t(s)])) << what;
            ASSERT_EQ(sim.start[size_t(s)].size(), cases[k][size_t(s)].size());
            for (size_t a = 0; a + 1 < sim.start[size_t(s)].size(); ++a)  // one action at a time per rank
              EXPECT_LE(sim.end[size_t(s)][a], sim.start[size_t(s)][a + 1] + 1e-12) << what;
          }
        }
      }
}

TEST(ScheduleChunks, InterleavedBubbleMatchesFormula) {
  // Balanced chunks (a rank's stage cost split v ways), no link delay: the
  // bubble is ((p − 1)/v)/(m + (p − 1)/v) and the makespan
  // (m + (p − 1)/v)(t_f + t_b).
  for (int pp = 1; pp <= 8; ++pp)
    for (int v = 1; v <= 4; ++v)
      for (int m = pp; m <= 4 * pp; m += pp) {
        const PipelineSim sim = simulate_pipeline(interleaved(pp, m, v), 1.0 / v, 2.0 / v);
        const double fill = double(pp - 1) / v;
        EXPECT_NEAR(sim.makespan, 3.0 * (m + fill), 1e-9) << "pp=" << pp << " v=" << v << " m=" << m;
        EXPECT_NEAR(sim.bubble_fraction, bubble_fraction_interleaved(pp, m, v), 1e-9);
        EXPECT_EQ(sim.bubble_imbalance, 0.0);
        // Live chunk activations: the warm-up + 1 (v = 1: 1F1B's pp − s).
        for (int s = 0; s < pp; ++s)
          EXPECT_EQ(sim.peak_live[size_t(s)],
                    v == 1 ? std::min(pp - s, m) : std::min(m * v, (v - 1) * pp + 2 * (pp - s - 1) + 1));
      }
  EXPECT_DOUBLE_EQ(bubble_fraction_interleaved(4, 8, 1), bubble_fraction_predicted(4, 8));
  EXPECT_DOUBLE_EQ(bubble_fraction_interleaved(4, 8, 3), 1.0 / 9.0);
}

TEST(ScheduleChunks, InterleavingCutsFillDrainNotImbalance) {
  // The head on the last global chunk (3× a chunk's cost): interleaving
  // shrinks fill/drain by about v, the imbalance stays (a heavier chunk
  // still holds every rank up).
  for (int pp : {4, 8}) {
    const int m = 2 * pp;
    double fill_v1 = 0;
    for (int v : {1, 2, 4}) {
      const size_t n = size_t(pp * v);
      StageCosts c{std::vector<double>(n, 1.0 / v), std::vector<double>(n, 2.0 / v), 0.0};
      c.fwd.back() *= 3;
      c.bwd.back() *= 3;
      const PipelineSim sim = simulate_pipeline(interleaved(pp, m, v), c);
      EXPECT_NEAR(sim.bubble_fill_drain, bubble_fraction_interleaved(pp, m, v), 1e-9) << "pp=" << pp << " v=" << v;
      EXPECT_GT(sim.bubble_imbalance, 0.01) << "pp=" << pp << " v=" << v;
      if (v == 1) {
        fill_v1 = sim.bubble_fill_drain;
      } else {
        EXPECT_LT(sim.bubble_fill_drain, fill_v1 / (0.75 * v));
      }
    }
  }
}

TEST(ScheduleChunks, ZeroBubbleH1BeatsOneFOneBAtItsMemory) {
  // Any t_W > 0: ZB-H1's bubble and makespan below 1F1B's (Bwd = B + W),
  // its peak live activations per rank at most 1F1B's peak, min(p, m).
  for (int pp = 2; pp <= 8; ++pp)
    for (int m = 1; m <= 4 * pp; ++m)
      for (auto [tf, tb, tw] : {std::tuple{1.0, 1.0, 1.0}, {1.0, 1.2, 0.8}, {1.0, 0.5, 1.5}, {2.0, 1.0, 1.0},
                                {1.0, 1.0, 0.1}})
        for (double link : {0.0, 0.2}) {
          const size_t n = size_t(pp);
          const StageCosts cost{std::vector<double>(n, tf), std::vector<double>(n, tb + tw), link,
                                std::vector<double>(n, tw)};
          const PipelineSim one = simulate_pipeline(whole_pipeline(&schedule_1f1b, pp, m), cost);
          const PipelineSim zb = simulate_pipeline(whole_pipeline(&schedule_zb_h1, pp, m), cost);
          const std::string what = "pp=" + std::to_string(pp) + " m=" + std::to_string(m) + " tw=" +
                                   std::to_string(tw) + " link=" + std::to_string(link);
          EXPECT_LT(zb.makespan, one.makespan - 1e-9) << what;
          EXPECT_LT(zb.bubble_fraction, one.bubble_fraction) << what;
          const int peak_1f1b = *std::max_element(one.peak_live.begin(), one.peak_live.end());
          EXPECT_EQ(peak_1f1b, std::min(pp, m));
          for (int s = 0; s < pp; ++s) EXPECT_LE(zb.peak_live[size_t(s)], peak_1f1b) << what << " stage " << s;
          // The paper's balanced figure: (p − 1)(T_F + T_B − T_W) of bubble
          // when m ≥ p, T_W ≤ T_B and sends are instant.
          if (m >= pp && tw <= tb && link == 0.0) {
            EXPECT_NEAR(zb.makespan, m * (tf + tb + tw) + (pp - 1) * (tf + tb - tw), 1e-9) << what;
          }
        }
}

TEST(ScheduleChunks, SplitTimesLeaveWholeBackwardSchedulesUnchanged) {
  // A schedule of whole backwards only sees B + W: 1F1B and GPipe as before.
  for (int pp = 1; pp <= 6; ++pp)
    for (int m = 1; m <= 10; ++m)
      for (Sched make : {&schedule_1f1b, &schedule_gpipe}) {
        const PipelineSim a = simulate_pipeline(whole_pipeline(make, pp, m), 1.0, 2.0);
        const PipelineSim b = simulate_pipeline(whole_pipeline(make, pp, m), 1.0, 1.25, 0.75);
        EXPECT_DOUBLE_EQ(a.makespan, b.makespan);
        EXPECT_EQ(a.start, b.start);
        for (int s = 0; s < pp; ++s)
          EXPECT_EQ(a.peak_live[size_t(s)], make == &schedule_1f1b ? std::min(pp - s, m) : m);
      }
}

TEST(ScheduleChunks, BadSchedulesRejected) {
  EXPECT_THROW(schedule_interleaved(4, 0, 6, 2), wiola::Error);  // m % pp != 0
  EXPECT_THROW(schedule_interleaved(4, 0, 8, 0), wiola::Error);
  EXPECT_THROW(schedule_zb_h1(2, 2, 4), wiola::Error);
  const auto message = [](const std::vector<std::vector<Action>>& s) {
    try {
      simulate_pipeline(s, 1.0, 1.0, 1.0);
    } catch (const wiola::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // A W before its B: stuck at the W.
  EXPECT_NE(message({{{Op::Fwd, 0}, {Op::BwdWeight, 0}, {Op::BwdInput, 0}}}).find("stage 0 waits at W0"),
            std::string::npos);
  // Rank 0 runs chunk 1 (global chunk 2) before chunk 0: chunk 1 of rank 1
  // never gets its input.
  const std::vector<std::vector<Action>> early = {
      {{Op::Fwd, 0, 1}, {Op::Fwd, 0, 0}, {Op::Bwd, 0, 1}, {Op::Bwd, 0, 0}},
      {{Op::Fwd, 0, 0}, {Op::Fwd, 0, 1}, {Op::Bwd, 0, 1}, {Op::Bwd, 0, 0}}};
  const std::string e = message(early);
  EXPECT_NE(e.find("stage 0 waits at F0.1"), std::string::npos) << e;
  EXPECT_NE(e.find("stage 1 waits at F0"), std::string::npos) << e;
  // A forward twice, a backward both whole and split.
  EXPECT_NE(message({{{Op::Fwd, 0}, {Op::Fwd, 0}, {Op::Bwd, 0}}}).find("twice"), std::string::npos);
  EXPECT_NE(message({{{Op::Fwd, 0}, {Op::BwdInput, 0}, {Op::Bwd, 0}}}).find("twice"), std::string::npos);
  // A W after a whole backward waits for a B that never comes.
  EXPECT_NE(message({{{Op::Fwd, 0}, {Op::Bwd, 0}, {Op::BwdWeight, 0}}}).find("waits at W0"), std::string::npos);
  // The weight-gradient share is part of the backward.
  EXPECT_THROW(simulate_pipeline({schedule_zb_h1(1, 0, 2)}, StageCosts{{1.0}, {1.0}, 0.0, {2.0}}), wiola::Error);
}

// ---- ZB-V: two chunks per rank in a V (issue 37) -------------------------------------

namespace {
std::vector<std::vector<Action>> zb_v(int pp, int m) {
  std::vector<std::vector<Action>> all;
  for (int s = 0; s < pp; ++s) all.push_back(schedule_zb_v(pp, s, m));
  return all;
}

// Every action of a simulation starts after what it needs has ended (plus
// the link between two ranks), recomputed here from the simulator's times
// and the V placement, independently of the simulator's own bookkeeping.
void check_dependencies(const std::vector<std::vector<Action>>& all, const PipelineSim& sim, double link,
                        const std::string& what) {
  const int pp = int(all.size());
  std::map<std::tuple<int, int, int>, std::pair<double, int>> done;  // (kind F=0/I=1/W=2, g, micro) -> (end, rank)
  for (int s = 0; s < pp; ++s)
    for (size_t k = 0; k < all[size_t(s)].size(); ++k) {
      const Action& a = all[size_t(s)][k];
      const int kind = a.op == Op::Fwd ? 0 : a.op == Op::BwdWeight ? 2 : 1;
      done[{kind, global_chunk(pp, s, a.chunk, ChunkPlacement::V), a.micro}] = {sim.end[size_t(s)][k], s};
    }
  const auto need = [&](int kind, int g, int i, int s, double start) {
    const auto it = done.find({kind, g, i});
    ASSERT_NE(it, done.end()) << what;
    const double arrive = it->second.first + (it->second.second != s ? link : 0.0);
    EXPECT_GE(start + 1e-9, arrive) << what << ": kind " << kind << " chunk " << g << " micro " << i;
  };
  for (int s = 0; s < pp; ++s)
    for (size_t k = 0; k < all[size_t(s)].size(); ++k) {
      const Action& a = all[size_t(s)][k];
      const int g = global_chunk(pp, s, a.chunk, ChunkPlacement::V);
      const double t = sim.start[size_t(s)][k];
      if (a.op == Op::Fwd && g > 0) need(0, g - 1, a.micro, s, t);
      if (a.op == Op::BwdInput) {
        need(0, g, a.micro, s, t);
        if (g + 1 < 2 * pp) need(1, g + 1, a.micro, s, t);
      }
      if (a.op == Op::BwdWeight) need(1, g, a.micro, s, t);
    }
}
}  // namespace

TEST(ScheduleZbV, Placement) {
  // V: rank s holds global chunks s and 2p − 1 − s; interleaved: s and p + s.
  for (int pp = 1; pp <= 8; ++pp)
    for (int s = 0; s < pp; ++s) {
      EXPECT_EQ(global_chunk(pp, s, 0, ChunkPlacement::V), s);
      EXPECT_EQ(global_chunk(pp, s, 1, ChunkPlacement::V), 2 * pp - 1 - s);
      EXPECT_EQ(global_chunk(pp, s, 1, ChunkPlacement::Interleaved), pp + s);
      for (int c = 0; c < 4; ++c)
        for (ChunkPlacement pl : {ChunkPlacement::V, ChunkPlacement::Interleaved})
          EXPECT_EQ(chunk_rank(pp, global_chunk(pp, s, c, pl), pl), s);
    }
  // p 2, m 3, every step's order (warm-up, steady, cool-down).
  EXPECT_EQ(to_string(schedule_zb_v(2, 0, 3)),
            "F0 F1 F2 F0.1 I0.1 W0.1 F1.1 I1.1 W1.1 I0 W0 F2.1 I2.1 W2.1 I1 W1 I2 W2");
  EXPECT_EQ(to_string(schedule_zb_v(2, 1, 3)),
            "F0 F0.1 F1 F1.1 I0.1 W0.1 F2 I0 W0 F2.1 I1.1 W1.1 I1 I2.1 W2.1 I2 W1 W2");
  EXPECT_THROW(schedule_zb_v(4, 0, 3), wiola::Error);  // m < p
  EXPECT_THROW(schedule_zb_v(4, 4, 8), wiola::Error);
}

TEST(ScheduleZbV, CompleteDeadlockFreeAtOneFOneBMemory) {
  // p 1..8, m p..4p, B and W timed apart, with and without a link
  // delay: each (micro-batch, chunk) forwarded once and split-backwarded
  // once, every dependency met, live chunk activations at most 2p on every
  // rank (exactly 2p when m ≥ 2p − 1): 1F1B's peak of p micro-batches of the
  // rank's layers (a chunk is half of them).
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = pp; m <= 4 * pp; ++m)
      for (auto [tf, tb, tw, link] : {std::tuple{1.0, 1.0, 1.0, 0.0}, {1.0, 1.2, 0.8, 0.3}, {2.0, 2.6, 0.5, 0.1}}) {
        const std::string what = "zb-v pp=" + std::to_string(pp) + " m=" + std::to_string(m) +
                                 " link=" + std::to_string(link);
        const auto all = zb_v(pp, m);
        for (int s = 0; s < pp; ++s) {
          check_complete(all[size_t(s)], m, 2, what);
          for (const Action& a : all[size_t(s)]) ASSERT_NE(a.op, Op::Bwd) << what;  // every backward split
        }
        const size_t n = size_t(2 * pp);
        const StageCosts cost{std::vector<double>(n, tf), std::vector<double>(n, tb + tw), link,
                              std::vector<double>(n, tw)};
        PipelineSim sim;
        ASSERT_NO_THROW(sim = simulate_pipeline(all, cost, ChunkPlacement::V)) << what;
        check_dependencies(all, sim, link, what);
        const int one_f_one_b = max_in_flight(schedule_1f1b(pp, 0, m));  // min(p, m) micro-batches
        for (int s = 0; s < pp; ++s) {
          EXPECT_EQ(sim.peak_live[size_t(s)], max_in_flight(all[size_t(s)])) << what;
          EXPECT_LE(sim.peak_live[size_t(s)], 2 * pp) << what << " stage " << s;
          if (m >= 2 * pp - 1) {
            EXPECT_EQ(sim.peak_live[size_t(s)], 2 * pp) << what << " stage " << s;
          }
          EXPECT_LE(sim.peak_live[size_t(s)], 2 * one_f_one_b) << what;
          for (size_t a = 0; a + 1 < sim.start[size_t(s)].size(); ++a)
            EXPECT_LE(sim.end[size_t(s)][a], sim.start[size_t(s)][a + 1] + 1e-12) << what;
        }
        // No schedule beats the last rank's wait for its first input plus its work.
        EXPECT_GE(sim.makespan, 2 * m * (tf + tb + tw) + (pp - 1) * tf + (pp > 1 ? 2 * (pp - 1) * link : 0.0) - 1e-9)
            << what;
      }
  // The interleaved placement is wrong for a V schedule: chunk 1 of rank 0
  // would need chunk 0 of rank p − 1 first, which waits for rank 0's chunk 1.
  EXPECT_THROW(simulate_pipeline(zb_v(2, 3), 1.0, 1.0, 1.0), wiola::Error);
}

TEST(ScheduleZbV, BalancedIsThePapersZeroBubble) {
  // T_F = T_B = T_W per chunk, no link delay (the paper's setting): the
  // makespan is the lower bound 2m(T_F + T_B + T_W) + (p − 1)T_F, the last
  // rank never idles once it starts, and every rank's idle time is the
  // (p − 1)T_F of the first micro-batch's way down the V's first leg.
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 2 * pp - 1; m <= 4 * pp; ++m)
      for (double t : {1.0, 0.37}) {
        const std::string what = "pp=" + std::to_string(pp) + " m=" + std::to_string(m);
        const PipelineSim sim = simulate_pipeline(zb_v(pp, m), t, t, t, ChunkPlacement::V);
        EXPECT_NEAR(sim.makespan, 6.0 * m * t + (pp - 1) * t, 1e-9) << what;
        EXPECT_NEAR(sim.bubble_fraction, (pp - 1.0) / (6.0 * m + pp - 1), 1e-9) << what;
        EXPECT_EQ(sim.bubble_imbalance, 0.0);
        const auto& st = sim.start[size_t(pp - 1)];
        const auto& en = sim.end[size_t(pp - 1)];
        EXPECT_NEAR(st.front(), (pp - 1) * t, 1e-9) << what;
        for (size_t a = 0; a + 1 < st.size(); ++a) EXPECT_NEAR(en[a], st[a + 1], 1e-9) << what;
      }
  // p ≤ m < 2p − 1: rank 0's forwards cannot cover the V's round trip and
  // the pipeline idles more (below m = 2p − 2, more than ZB-H1 on the same
  // work, e.g. p 4, m 4: 33 against 30 chunk times), still less than 1F1B.
  for (int pp = 3; pp <= 8; ++pp)
    for (int m = pp; m < 2 * pp - 2; ++m) {
      const PipelineSim sim = simulate_pipeline(zb_v(pp, m), 1.0, 1.0, 1.0, ChunkPlacement::V);
      const PipelineSim h1 = simulate_pipeline(whole_pipeline(&schedule_zb_h1, pp, m), 2.0, 2.0, 2.0);
      const PipelineSim one = simulate_pipeline(whole_pipeline(&schedule_1f1b, pp, m), 2.0, 4.0);
      EXPECT_GT(sim.makespan, 6.0 * m + pp - 1) << "pp=" << pp << " m=" << m;
      EXPECT_GT(sim.makespan, h1.makespan) << "pp=" << pp << " m=" << m;
      EXPECT_LT(sim.makespan, one.makespan) << "pp=" << pp << " m=" << m;
    }
  // Against ZB-H1 and 1F1B on the same work (a stage = two chunks), T_F =
  // T_B = T_W: 1F1B's bubble is (p − 1)·3T, ZB-H1's (p − 1)·T (the paper's
  // third), ZB-V's (p − 1)·T/2 (stage times: T = 2 chunk times).
  for (int pp = 2; pp <= 8; ++pp)
    for (int m : {2 * pp - 1, 2 * pp, 4 * pp}) {
      const double t = 1.0;  // a chunk's F, B and W; a stage's are 2t
      const PipelineSim v = simulate_pipeline(zb_v(pp, m), t, t, t, ChunkPlacement::V);
      const PipelineSim h1 = simulate_pipeline(whole_pipeline(&schedule_zb_h1, pp, m), 2 * t, 2 * t, 2 * t);
      const PipelineSim one = simulate_pipeline(whole_pipeline(&schedule_1f1b, pp, m), 2 * t, 4 * t);
      EXPECT_NEAR(one.makespan - 6.0 * m * t, (pp - 1) * 6 * t, 1e-9);
      EXPECT_NEAR(h1.makespan - 6.0 * m * t, (pp - 1) * 2 * t, 1e-9);
      EXPECT_NEAR(v.makespan - 6.0 * m * t, (pp - 1) * t, 1e-9);
    }
}

TEST(ScheduleZbV, BubbleSplitAndUnevenCosts) {
  // The head on the last global chunk (rank 0 in the V) at 3× a chunk:
  // fill/drain is the balanced schedule's, the rest is imbalance; W a fifth
  // of the backward (the planner's H100 profile): still below ZB-H1 and
  // 1F1B on the same stages.
  for (int pp : {2, 4, 8})
    for (int m : {2 * pp, 4 * pp}) {
      const size_t n = size_t(2 * pp);
      StageCosts c{std::vector<double>(n, 1.0), std::vector<double>(n, 2.5), 0.05, std::vector<double>(n, 0.5)};
      const PipelineSim even = simulate_pipeline(zb_v(pp, m), c, ChunkPlacement::V);
      c.fwd.back() *= 3;
      c.bwd.back() *= 3;
      c.bwd_weight.back() *= 3;
      const PipelineSim sim = simulate_pipeline(zb_v(pp, m), c, ChunkPlacement::V);
      EXPECT_GT(sim.bubble_imbalance, 0.0) << "pp=" << pp << " m=" << m;
      EXPECT_NEAR(sim.bubble_fill_drain + sim.bubble_imbalance, sim.bubble_fraction, 1e-15);
      EXPECT_GT(sim.makespan, even.makespan);
      // The same work as pp stages of two chunks each.
      StageCosts st{std::vector<double>(size_t(pp), 2.0), std::vector<double>(size_t(pp), 5.0), 0.05,
                    std::vector<double>(size_t(pp), 1.0)};
      const PipelineSim h1 = simulate_pipeline(whole_pipeline(&schedule_zb_h1, pp, m), st);
      const PipelineSim one = simulate_pipeline(whole_pipeline(&schedule_1f1b, pp, m), st);
      EXPECT_LT(even.makespan, h1.makespan) << "pp=" << pp << " m=" << m;
      EXPECT_LT(h1.makespan, one.makespan) << "pp=" << pp << " m=" << m;
    }
}
