#include "dist/grid.h"

#include <algorithm>

#include "util/error.h"

namespace wiola::dist {

const char* group_name(GroupKind k) {
  switch (k) {
    case GroupKind::Tp: return "tp";
    case GroupKind::Pp: return "pp";
    case GroupKind::Dp: return "dp";
    case GroupKind::Embed: return "embed";
    case GroupKind::Mp: return "mp";
    case GroupKind::World: return "world";
  }
  return "?";
}

void validate_grid(const GridConfig& g, int world_size) {
  WIOLA_CHECK(g.tp >= 1 && g.pp >= 1 && g.dp >= 1,
              "parallel layout: tp, pp and dp must be >= 1 (got tp=", g.tp,
              " pp=", g.pp, " dp=", g.dp, ")");
  WIOLA_CHECK(long(g.tp) * g.pp * g.dp == world_size,
              "parallel layout: tp*pp*dp = ", g.tp, "*", g.pp, "*", g.dp, " = ",
              long(g.tp) * g.pp * g.dp, " but the job has ", world_size,
              " ranks; start ", long(g.tp) * g.pp * g.dp,
              " ranks or change tp/pp/dp");
}

GridCoord grid_coord(const GridConfig& g, int rank) {
  GridCoord c;
  c.tp = rank % g.tp;
  c.dp = (rank / g.tp) % g.dp;
  c.pp = rank / (g.tp * g.dp);
  return c;
}

int grid_rank(const GridConfig& g, const GridCoord& c) {
  return c.pp * (g.dp * g.tp) + c.dp * g.tp + c.tp;
}

std::vector<int> group_ranks(const GridConfig& g, int rank, GroupKind kind) {
  const GridCoord c = grid_coord(g, rank);
  std::vector<int> out;
  switch (kind) {
    case GroupKind::Tp:
      for (int t = 0; t < g.tp; ++t) out.push_back(grid_rank(g, {t, c.pp, c.dp}));
      break;
    case GroupKind::Pp:
      for (int p = 0; p < g.pp; ++p) out.push_back(grid_rank(g, {c.tp, p, c.dp}));
      break;
    case GroupKind::Dp:
      for (int d = 0; d < g.dp; ++d) out.push_back(grid_rank(g, {c.tp, c.pp, d}));
      break;
    case GroupKind::Embed:
      if (c.pp == 0 || c.pp == g.pp - 1) {
        out.push_back(grid_rank(g, {c.tp, 0, c.dp}));
        if (g.pp > 1) out.push_back(grid_rank(g, {c.tp, g.pp - 1, c.dp}));
      } else {
        out.push_back(rank);
      }
      break;
    case GroupKind::Mp:
      for (int p = 0; p < g.pp; ++p)
        for (int t = 0; t < g.tp; ++t) out.push_back(grid_rank(g, {t, p, c.dp}));
      break;
    case GroupKind::World:
      for (int r = 0; r < g.world(); ++r) out.push_back(r);
      break;
  }
  return out;
}

void validate_layout(const GridConfig& g, int world_size, int n_layers,
                     int n_kv_heads, int n_heads, int d_a, int d_b, int vocab,
                     int global_batch, int micro_batch, int micro_batches) {
  validate_grid(g, world_size);
  WIOLA_CHECK(n_kv_heads >= 1 && n_heads % n_kv_heads == 0,
              "parallel layout: H_kv=", n_kv_heads, " must divide H=", n_heads);
  WIOLA_CHECK(n_kv_heads % g.tp == 0, "parallel layout: tp=", g.tp,
              " must divide the number of KV heads H_kv=", n_kv_heads,
              "; choose tp from the divisors of ", n_kv_heads);
  WIOLA_CHECK(d_a % g.tp == 0, "parallel layout: tp=", g.tp,
              " must divide d_A=", d_a, " (stream A is column-parallel)");
  WIOLA_CHECK(d_b % g.tp == 0, "parallel layout: tp=", g.tp,
              " must divide d_B=", d_b, " (stream B is column-parallel)");
  WIOLA_CHECK(vocab % g.tp == 0, "parallel layout: tp=", g.tp,
              " must divide the vocabulary V=", vocab,
              " (vocab-parallel embedding); change tp or pad the vocabulary");
  WIOLA_CHECK(g.pp <= n_layers, "parallel layout: pp=", g.pp,
              " exceeds the number of layers L=", n_layers,
              "; every stage needs at least one layer");
  WIOLA_CHECK(micro_batch >= 1 && micro_batches >= 1,
              "batch: micro_batch (", micro_batch, ") and micro_batches (",
              micro_batches, ") must be >= 1");
  WIOLA_CHECK(long(micro_batch) * micro_batches * g.dp == global_batch,
              "batch: micro_batch*micro_batches*dp = ", micro_batch, "*",
              micro_batches, "*", g.dp, " = ",
              long(micro_batch) * micro_batches * g.dp,
              " differs from the global batch ", global_batch,
              "; change micro_batch or micro_batches so the product matches");
}

std::pair<int, int> stage_layers(int n_layers, int pp, int stage) {
  WIOLA_CHECK(pp >= 1 && pp <= n_layers && stage >= 0 && stage < pp,
              "stage_layers: need 1 <= pp <= L and 0 <= stage < pp (L=",
              n_layers, " pp=", pp, " stage=", stage, ")");
  const int q = n_layers / pp, r = n_layers % pp;
  const int first = stage * q + std::min(stage, r);
  return {first, first + q + (stage < r ? 1 : 0)};
}

std::vector<std::pair<int, int>> balanced_stages(const std::vector<double>& layer_cost,
                                                 double first_extra, double last_extra, int pp) {
  const int L = int(layer_cost.size());
  WIOLA_CHECK(pp >= 1 && pp <= L, "balanced_stages: need 1 <= pp <= L (L=", L, " pp=", pp, ")");
  std::vector<double> prefix(size_t(L) + 1, 0.0);
  for (int l = 0; l < L; ++l) prefix[size_t(l) + 1] = prefix[size_t(l)] + layer_cost[size_t(l)];
  auto cost = [&](int s, int a, int b) {
    return prefix[size_t(b)] - prefix[size_t(a)] + (s == 0 ? first_extra : 0.0) +
           (s == pp - 1 ? last_extra : 0.0);
  };
  // best[s][a]: smallest max cost of stages s..pp-1 covering layers [a, L).
  const double inf = 1e300;
  std::vector<std::vector<double>> best(size_t(pp) + 1, std::vector<double>(size_t(L) + 1, inf));
  std::vector<std::vector<int>> cut(size_t(pp), std::vector<int>(size_t(L) + 1, -1));
  best[size_t(pp)][size_t(L)] = 0.0;
  for (int s = pp - 1; s >= 0; --s)
    for (int a = s; a <= L - (pp - s); ++a)
      for (int b = L - (pp - s - 1); b > a; --b) {  // larger stages first: ties keep them
        const double rest = best[size_t(s) + 1][size_t(b)];
        if (rest >= inf) continue;
        const double v = std::max(cost(s, a, b), rest);
        if (v < best[size_t(s)][size_t(a)] * (1 - 1e-12)) {
          best[size_t(s)][size_t(a)] = v;
          cut[size_t(s)][size_t(a)] = b;
        }
      }
  std::vector<std::pair<int, int>> out;
  for (int s = 0, a = 0; s < pp; ++s) {
    const int b = cut[size_t(s)][size_t(a)];
    out.emplace_back(a, b);
    a = b;
  }
  return out;
}

Grid::Grid(const GridConfig& cfg, Comm& world, const DataPlaneFactory& data_plane)
    : cfg_(cfg), rank_(world.rank()), world_(&world) {
  validate_grid(cfg, world.size());
  coord_ = grid_coord(cfg, rank_);
  const GridCoord& c = coord_;
  tp_ = world.split(c.pp * cfg.dp + c.dp, c.tp, "tp");
  pp_ = world.split(c.dp * cfg.tp + c.tp, c.pp, "pp");
  dp_ = world.split(c.pp * cfg.tp + c.tp, c.dp, "dp");
  const bool ends = c.pp == 0 || c.pp == cfg.pp - 1;
  embed_ = world.split(ends ? c.dp * cfg.tp + c.tp : cfg.dp * cfg.tp + rank_,
                       c.pp, "embed");
  mp_ = world.split(c.dp, rank_, "mp");
  if (data_plane)
    for (GroupKind k : {GroupKind::Tp, GroupKind::Pp, GroupKind::Dp, GroupKind::Embed, GroupKind::Mp,
                        GroupKind::World})
      data_[int(k)] = data_plane(group(k));
}

Comm& Grid::data(GroupKind k) {
  return data_[int(k)] ? *data_[int(k)] : group(k);
}

CommTraffic Grid::traffic(GroupKind k) {
  CommTraffic t = group(k).traffic();
  if (data_[int(k)]) {  // a data plane that counts its own traffic (NCCL)
    data_[int(k)]->settle_traffic();
    const CommTraffic& d = data_[int(k)]->traffic();
    t.ops += d.ops;
    t.payload_bytes += d.payload_bytes;
    t.wire_bytes += d.wire_bytes;
    t.wait_s += d.wait_s;
    t.busy_s += d.busy_s;
  }
  return t;
}

Comm& Grid::group(GroupKind k) {
  switch (k) {
    case GroupKind::Tp: return *tp_;
    case GroupKind::Pp: return *pp_;
    case GroupKind::Dp: return *dp_;
    case GroupKind::Embed: return *embed_;
    case GroupKind::Mp: return *mp_;
    case GroupKind::World: return *world_;
  }
  return *world_;
}

}  // namespace wiola::dist
