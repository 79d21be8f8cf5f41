#include "train/stage_layers.h"

#include "perf/cost_model.h"

namespace wiola {

StageLayers cut_stage_layers(const RunConfig& rc, int stage) {
  const perf::Layout lay = rc.layout();
  const int pp = rc.parallel.pp;
  StageLayers s;
  s.v = perf::chunks_per_rank(lay);
  s.placement = perf::chunk_placement(lay);
  s.chunk_cuts = perf::chunk_cuts(rc.model, lay);
  for (int r = 0; r < pp; ++r) s.stages.push_back(perf::rank_chunks(rc.model, lay, r));
  s.chunk_layers = s.stages[size_t(stage)];
  const int head_rank = dist::chunk_rank(pp, pp * s.v - 1, s.placement);
  const int first_rank = dist::chunk_rank(pp, 0, s.placement);
  s.first = stage == first_rank;
  s.last = stage == head_rank;
  s.embed_split = head_rank != first_rank;
  return s;
}

}  // namespace wiola
