// Which layers this rank's model chunks hold: the model in p·v global
// chunks of layers, v per rank, placed by `placement` (dist/schedule.h), as
// the cost model cuts them (perf::chunk_cuts: the stage balancer over p·v
// stages, "compute" leaving the head's chunk fewer layers).
#pragma once

#include <utility>
#include <vector>

#include "config/run_config.h"
#include "dist/schedule.h"
#include "model/config.h"

namespace wiola {

struct StageLayers {
  int v = 1;  // chunks per rank (1 for 1f1b, gpipe and zb-h1; parallel.virtual_stages for interleaved; 2 for zb-v)
  dist::ChunkPlacement placement = dist::ChunkPlacement::Interleaved;
  std::vector<std::pair<int, int>> chunk_cuts;  // the layer range of every global chunk
  std::vector<LayerRanges> stages;              // every rank's ranges, by its chunk index
  LayerRanges chunk_layers;                     // this rank's
  bool first = true, last = true;               // holds the model's first chunk / its last (the head)
  bool embed_split = false;                     // the embedding's two ends on two ranks (summed between them)
};

// The layers of pipeline rank `stage` of the run `rc`.
StageLayers cut_stage_layers(const RunConfig& rc, int stage);

}  // namespace wiola
