#include "train/gather.h"

#include <algorithm>

#include "util/error.h"

namespace wiola {

using dist::Comm;
using dist::DType;

ParamLayout full_layout(const ModelConfig& cfg, const ParamLayout& mine) {
  return ParamLayout(cfg, ModelShard{}, mine.alignment());
}

// Gathers per-rank flat buffers (each in its own shard's layout) into the
// single-process layout on world rank 0. Contributors: the dp == 0 ranks;
// rank 0 rebuilds every contributor's ParamLayout to map its elements to
// global indices (the tied embedding arrives twice with pp > 1: same values).
std::vector<float> gather_full(dist::Grid& grid, const ModelConfig& cfg, const ParamLayout& mine,
                               const std::vector<float>& local, const std::vector<LayerRanges>& stages) {
  Comm& world = grid.world();
  const auto& g = grid.config();
  const bool root = world.rank() == 0;
  const int tag = 7001;
  if (!root) {
    if (grid.coord().dp == 0) world.isend(local.data(), local.size(), DType::F32, 0, tag).wait();
    return {};
  }
  const ParamLayout full = full_layout(cfg, mine);
  std::vector<float> out(full.total(), 0.0f);
  auto scatter = [&](const ParamLayout& lay, const std::vector<float>& buf) {
    for (const ParamEntry& e : lay.entries()) {
      const ParamEntry& fe = full.find(e.name);
      for (int64_t r = 0; r < e.rows; ++r)
        for (int64_t c = 0; c < e.cols; ++c)
          out[fe.offset + size_t(e.global_index(r, c))] = buf[e.offset + size_t(r * e.cols + c)];
    }
  };
  scatter(mine, local);
  std::vector<float> buf;
  for (int r = 1; r < world.size(); ++r) {
    const dist::GridCoord c = dist::grid_coord(g, r);
    if (c.dp != 0) continue;
    const ParamLayout lay(cfg, c.tp, g.tp, stages[size_t(c.pp)], mine.alignment());
    buf.resize(lay.total());
    world.irecv(buf.data(), buf.size(), DType::F32, r, tag).wait();
    scatter(lay, buf);
  }
  return out;
}

// ATM decisions must be identical on the TP ranks (each computes them from
// its own copy of X-tilde): compare fingerprints of this rank's decisions.
void check_atm_agrees_over_tp(dist::Grid& grid, const std::vector<uint8_t>& atm_flat, int64_t step) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (uint8_t b : atm_flat) h = (h ^ b) * 1099511628211ull;
  const int64_t mine = int64_t(h >> 1);
  std::vector<int64_t> all(size_t(grid.tp().size()));
  grid.tp().all_gather(&mine, all.data(), 1, DType::I64);
  for (int64_t v : all)
    WIOLA_CHECK(v == mine, "ATM merge decisions differ between the TP ranks of stage ", grid.coord().pp,
                " at step ", step);
}

// Dump steps: the global batch's tokens (DP slices in order, from tp 0 of
// stage 0) and every ATM layer's decisions [B_global, T] (from tp 0 of the
// layer's stage), into `dump` on world rank 0. atm_flat: this rank's ATM
// layers in order, each [local batch, T] (`each` elements).
void gather_tokens_and_atm(dist::Grid& grid, const ModelConfig& cfg,
                           const std::vector<LayerRanges>& stages, const std::vector<int32_t>& batch,
                           const std::vector<uint8_t>& atm_flat, size_t each, StepDump& dump) {
  Comm& world = grid.world();
  const dist::GridConfig& gc = grid.config();
  const dist::GridCoord me = grid.coord();
  const int tag = 7002;
  if (world.rank() != 0) {
    if (me.tp == 0 && me.pp == 0) world.isend(batch.data(), batch.size(), DType::I32, 0, tag).wait();
    if (me.tp == 0 && !atm_flat.empty())
      world.isend(atm_flat.data(), atm_flat.size(), DType::U8, 0, tag + 1).wait();
    return;
  }
  dump.tokens.resize(batch.size() * size_t(gc.dp));
  std::vector<std::vector<uint8_t>> atm(size_t(cfg.L));
  std::vector<uint8_t> got;
  for (int r = 0; r < gc.dp; ++r) {
    int32_t* dst = dump.tokens.data() + size_t(r) * batch.size();
    const int src = dist::grid_rank(gc, {0, 0, r});
    if (src == 0) std::copy(batch.begin(), batch.end(), dst);
    else world.irecv(dst, batch.size(), DType::I32, src, tag).wait();
    for (int s = 0; s < gc.pp; ++s) {
      std::vector<int> layers;  // the stage's ATM layers in order, whatever its chunks' order
      for (const auto& [a0, a1] : stages[size_t(s)])
        for (int l = a0; l < a1; ++l)
          if (cfg.atm_layer(l)) layers.push_back(l);
      std::sort(layers.begin(), layers.end());
      if (layers.empty()) continue;
      const int from = dist::grid_rank(gc, {0, s, r});
      got.resize(each * layers.size());
      if (from == 0) got = atm_flat;
      else world.irecv(got.data(), got.size(), DType::U8, from, tag + 1).wait();
      for (size_t j = 0; j < layers.size(); ++j)
        atm[size_t(layers[j])].insert(atm[size_t(layers[j])].end(), got.begin() + long(j * each),
                                      got.begin() + long((j + 1) * each));
    }
  }
  for (int l = 0; l < cfg.L; ++l)
    if (!atm[size_t(l)].empty()) dump.atm[l] = std::move(atm[size_t(l)]);
}

}  // namespace wiola
