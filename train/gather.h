// Dump steps (docs/model.md §7) gather host copies of per-rank state into
// full, unsharded tensors on world rank 0, over the control plane.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "dist/grid.h"
#include "model/config.h"
#include "model/params.h"
#include "train/dump.h"

namespace wiola {

// The single-process layout of the whole model with `mine`'s alignment: what
// gather_full returns is laid out by it.
ParamLayout full_layout(const ModelConfig& cfg, const ParamLayout& mine);

// Per-rank flat host buffers (each in its own shard's layout, all with
// mine's alignment) into full_layout(cfg, mine) on world rank 0 (empty
// elsewhere; padding zero). Contributors: the dp == 0 ranks; stages: every
// pipeline stage's layer ranges (one per chunk it holds).
std::vector<float> gather_full(dist::Grid& grid, const ModelConfig& cfg, const ParamLayout& mine,
                               const std::vector<float>& local,
                               const std::vector<LayerRanges>& stages);

// Throws unless every TP rank of this stage made the same ATM decisions.
void check_atm_agrees_over_tp(dist::Grid& grid, const std::vector<uint8_t>& atm_flat, int64_t step);

// The global batch's tokens and every ATM layer's decisions into `dump` on
// world rank 0. atm_flat: this rank's ATM layers in order, each `each`
// elements ([local batch, T]).
void gather_tokens_and_atm(dist::Grid& grid, const ModelConfig& cfg,
                           const std::vector<LayerRanges>& stages, const std::vector<int32_t>& batch,
                           const std::vector<uint8_t>& atm_flat, size_t each, StepDump& dump);

}  // namespace wiola
