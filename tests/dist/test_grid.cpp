// Grid arithmetic for every layout with world <= 8, validation messages and
// stage layer ranges. No MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "dist/grid.h"
#include "dist/placement.h"
#include "tests/util/error_of.h"
#include "util/error.h"

using namespace wiola::dist;

namespace {
std::vector<GridConfig> all_layouts(int max_world) {
  std::vector<GridConfig> out;
  for (int tp = 1; tp <= max_world; ++tp)
    for (int pp = 1; tp * pp <= max_world; ++pp)
      for (int dp = 1; tp * pp * dp <= max_world; ++dp) out.push_back({tp, pp, dp});
  return out;
}

using wiola::test::error_of;
}  // namespace

TEST(Grid, RankFormulaAndCoordinates) {
  for (const GridConfig& g : all_layouts(8)) {
    std::set<std::tuple<int, int, int>> seen;
    for (int r = 0; r < g.world(); ++r) {
      const GridCoord c = grid_coord(g, r);
      ASSERT_GE(c.tp, 0);
      ASSERT_LT(c.tp, g.tp);
      ASSERT_GE(c.pp, 0);
      ASSERT_LT(c.pp, g.pp);
      ASSERT_GE(c.dp, 0);
      ASSERT_LT(c.dp, g.dp);
      EXPECT_EQ(r, c.pp * (g.dp * g.tp) + c.dp * g.tp + c.tp);  // docs/model.md §5
      EXPECT_EQ(grid_rank(g, c), r);
      seen.insert({c.tp, c.pp, c.dp});
    }
    EXPECT_EQ(int(seen.size()), g.world());
  }
}

TEST(Grid, GroupMembership) {
  for (const GridConfig& g : all_layouts(8)) {
    for (int r = 0; r < g.world(); ++r) {
      const GridCoord c = grid_coord(g, r);
      const auto tp = group_ranks(g, r, GroupKind::Tp);
      const auto pp = group_ranks(g, r, GroupKind::Pp);
      const auto dp = group_ranks(g, r, GroupKind::Dp);
      const auto em = group_ranks(g, r, GroupKind::Embed);
      const auto mp = group_ranks(g, r, GroupKind::Mp);
      ASSERT_EQ(int(tp.size()), g.tp);
      ASSERT_EQ(int(pp.size()), g.pp);
      ASSERT_EQ(int(dp.size()), g.dp);
      ASSERT_EQ(int(mp.size()), g.tp * g.pp);
      // Each group contains r at the position of its own coordinate.
      EXPECT_EQ(tp[c.tp], r);
      EXPECT_EQ(pp[c.pp], r);
      EXPECT_EQ(dp[c.dp], r);
      EXPECT_TRUE(std::is_sorted(mp.begin(), mp.end()));
      EXPECT_NE(std::find(mp.begin(), mp.end(), r), mp.end());
      // Members differ from r only in the group's own coordinate.
      for (int q : tp) {
        const GridCoord d = grid_coord(g, q);
        EXPECT_EQ(d.pp, c.pp);
        EXPECT_EQ(d.dp, c.dp);
      }
      for (int q : pp) {
        const GridCoord d = grid_coord(g, q);
        EXPECT_EQ(d.tp, c.tp);
        EXPECT_EQ(d.dp, c.dp);
      }
      for (int q : dp) {
        const GridCoord d = grid_coord(g, q);
        EXPECT_EQ(d.tp, c.tp);
        EXPECT_EQ(d.pp, c.pp);
      }
      for (int q : mp) EXPECT_EQ(grid_coord(g, q).dp, c.dp);
      // TP innermost: a TP group is a run of consecutive ranks.
      for (int t = 1; t < g.tp; ++t) EXPECT_EQ(tp[t], tp[0] + t);
      // Embedding group: first and last stage of the same (tp, dp).
      const bool end = c.pp == 0 || c.pp == g.pp - 1;
      if (!end) {
        EXPECT_EQ(em, std::vector<int>{r});
      } else if (g.pp == 1) {
        EXPECT_EQ(em, std::vector<int>{r});
      } else {
        ASSERT_EQ(em.size(), 2u);
        EXPECT_EQ(em[0], grid_rank(g, {c.tp, 0, c.dp}));
        EXPECT_EQ(em[1], grid_rank(g, {c.tp, g.pp - 1, c.dp}));
      }
      EXPECT_EQ(int(group_ranks(g, r, GroupKind::World).size()), g.world());
    }
  }
}

TEST(Grid, ValidationErrorsNameTheProblem) {
  EXPECT_NE(error_of([] { validate_grid({2, 2, 1}, 8); }).find("tp*pp*dp = 2*2*1 = 4"), std::string::npos);
  EXPECT_NE(error_of([] { validate_grid({0, 1, 1}, 1); }).find(">= 1"), std::string::npos);
  EXPECT_NE(error_of([] { validate_grid({1, -1, 1}, 1); }).find(">= 1"), std::string::npos);
  EXPECT_NO_THROW(validate_grid({2, 2, 2}, 8));

  // wiola-360m: L=16 H=16 H_kv=4 d_A=1024 d_B=4096 V=32000.
  auto layout = [](GridConfig g, int world, int gb, int mb, int m) {
    validate_layout(g, world, 16, 4, 16, 1024, 4096, 32000, gb, mb, m);
  };
  EXPECT_NO_THROW(layout({4, 2, 1}, 8, 8, 1, 8));
  EXPECT_NO_THROW(layout({2, 2, 2}, 8, 16, 2, 4));
  EXPECT_NE(error_of([&] { layout({8, 1, 1}, 8, 8, 1, 8); }).find("divide the number of KV heads"), std::string::npos);
  EXPECT_NE(error_of([&] { layout({1, 17, 1}, 17, 8, 1, 8); }).find("exceeds the number of layers"), std::string::npos);
  EXPECT_NE(error_of([&] {
              layout({1, 1, 2}, 2, 10, 2, 3);
            }).find("differs from the global batch 10"),
            std::string::npos);
  EXPECT_NE(error_of([&] { layout({1, 1, 2}, 4, 8, 2, 2); }).find("job has 4 ranks"), std::string::npos);
  EXPECT_NE(error_of([] {
              validate_layout({2, 1, 1}, 2, 4, 2, 4, 64, 256, 511, 2, 1, 2);
            }).find("vocabulary"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              validate_layout({2, 1, 1}, 2, 4, 2, 4, 63, 256, 512, 2, 1, 2);
            }).find("d_A"),
            std::string::npos);
}

TEST(Grid, StageLayersContiguousBalanced) {
  for (int L = 1; L <= 30; ++L)
    for (int pp = 1; pp <= L; ++pp) {
      int next = 0, mn = L, mx = 0;
      for (int s = 0; s < pp; ++s) {
        const auto [a, b] = stage_layers(L, pp, s);
        EXPECT_EQ(a, next);
        EXPECT_GT(b, a);
        next = b;
        mn = std::min(mn, b - a);
        mx = std::max(mx, b - a);
        // The extra layers go to the first L % pp stages.
        EXPECT_EQ(b - a, L / pp + (s < L % pp ? 1 : 0));
      }
      EXPECT_EQ(next, L);
      EXPECT_LE(mx - mn, 1);
    }
  EXPECT_EQ(stage_layers(28, 3, 0), std::make_pair(0, 10));
  EXPECT_EQ(stage_layers(28, 3, 1), std::make_pair(10, 19));
  EXPECT_EQ(stage_layers(28, 3, 2), std::make_pair(19, 28));
  EXPECT_THROW(stage_layers(4, 5, 0), wiola::Error);
  EXPECT_THROW(stage_layers(4, 2, 2), wiola::Error);
}

TEST(Grid, BalancedStages) {
  // Uniform costs, no extras: the same as stage_layers.
  for (int L = 1; L <= 12; ++L)
    for (int pp = 1; pp <= L; ++pp) {
      const auto st = balanced_stages(std::vector<double>(size_t(L), 1.0), 0, 0, pp);
      ASSERT_EQ(int(st.size()), pp);
      int max_layers = 0;
      for (int s = 0; s < pp; ++s) {
        EXPECT_EQ(st[size_t(s)].first, s == 0 ? 0 : st[size_t(s) - 1].second);
        EXPECT_GT(st[size_t(s)].second, st[size_t(s)].first);
        max_layers = std::max(max_layers, st[size_t(s)].second - st[size_t(s)].first);
      }
      EXPECT_EQ(st.back().second, L);
      EXPECT_EQ(max_layers, (L + pp - 1) / pp);
    }
  // A head worth 2.8 layers on the last of 4 stages of 12 layers: [4,4,3,1]
  // (max cost 4) instead of [3,3,3,3] (last stage 5.8).
  const auto st = balanced_stages(std::vector<double>(12, 1.0), 0.0, 2.8, 4);
  const std::vector<std::pair<int, int>> want = {{0, 4}, {4, 8}, {8, 11}, {11, 12}};
  EXPECT_EQ(st, want);
  // A head heavier than all layers: the last stage keeps one layer.
  EXPECT_EQ(balanced_stages(std::vector<double>(6, 1.0), 0.0, 13.0, 2).back(), std::make_pair(5, 6));
  EXPECT_THROW(balanced_stages(std::vector<double>(3, 1.0), 0, 0, 4), wiola::Error);
}

// Which groups cross nodes (docs/launch.md "Several nodes"): two ranks a node
// in rank order keep TP inside a node; DP or PP then crosses.
TEST(Placement, LinksOfEachDimension) {
  using wiola::dist::LinkKind;
  const std::vector<std::string> two_a_node{"n1", "n1", "n2", "n2"};
  const auto tp_dp = wiola::dist::placement_of({2, 1, 2}, two_a_node);
  EXPECT_EQ(tp_dp.tp, LinkKind::Intra);
  EXPECT_EQ(tp_dp.dp, LinkKind::Inter);
  EXPECT_EQ(tp_dp.pp, LinkKind::None);
  EXPECT_TRUE(tp_dp.tp_across.empty());
  EXPECT_EQ(tp_dp.nodes_summary(), "n1 ranks 0-1; n2 ranks 2-3");
  EXPECT_EQ(tp_dp.dp_flows, 2);  // both DP groups leave each node at once
  EXPECT_EQ(tp_dp.tp_flows, 0);
  EXPECT_EQ(wiola::dist::placement_of({1, 1, 4}, two_a_node).dp_flows, 1);  // one ring over both nodes
  const auto tp_pp = wiola::dist::placement_of({2, 2, 1}, two_a_node);
  EXPECT_EQ(tp_pp.pp, LinkKind::Inter);
  EXPECT_EQ(tp_pp.dp, LinkKind::None);
  // Round-robin placement: every TP group spans the nodes, DP stays inside.
  const auto rr = wiola::dist::placement_of({2, 1, 2}, {"n1", "n2", "n1", "n2"});
  EXPECT_EQ(rr.tp, LinkKind::Inter);
  EXPECT_EQ(rr.dp, LinkKind::Intra);
  EXPECT_EQ(rr.tp_across, (std::vector<int>{0, 1}));
  EXPECT_EQ(rr.tp_flows, 2);
  EXPECT_EQ(rr.nodes_summary(), "n1 ranks 0,2; n2 ranks 1,3");
  // One node: everything intra.
  const auto one = wiola::dist::placement_of({2, 2, 1}, {"a", "a", "a", "a"});
  EXPECT_EQ(one.tp, LinkKind::Intra);
  EXPECT_EQ(one.pp, LinkKind::Intra);
  EXPECT_EQ(one.nodes.size(), 1u);
}
