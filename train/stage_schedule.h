// This rank's part of a step's pipeline schedule (dist/schedule.h): its
// actions on its v model chunks, where the neighbouring global chunks live,
// and the activation and weight-operand slots each chunk needs. Pure logic:
// the schedule runner (train/schedule_runner.h) walks it, the model chunks
// are sized by it, the reports read it.
#pragma once

#include <string>
#include <vector>

#include "dist/schedule.h"

namespace wiola {

struct StageSchedule {
  int pp = 1, stage = 0;  // pipeline ranks; this rank's
  int m = 1;              // micro-batches per step
  // The model in p·v global chunks, v per rank (1 for 1f1b, gpipe and
  // zb-h1; parallel.virtual_stages for interleaved; 2 for zb-v), placed by
  // `placement`.
  int v = 1;
  dist::ChunkPlacement placement = dist::ChunkPlacement::Interleaved;
  std::vector<dist::Action> actions;    // this stage's, in order
  std::vector<int> chunk_slots;         // activation slots each chunk needs
  std::vector<int> chunk_weight_slots;  // W operand sets each chunk needs (split backward)
  int slots = 1;                        // the most any chunk needs (reports)

  // Chunk c of this rank: its global index, and the rank of global chunk g.
  int global_chunk(int c) const { return dist::global_chunk(pp, stage, c, placement); }
  int chunk_rank(int g) const { return dist::chunk_rank(pp, g, placement); }
  int n_global_chunks() const { return pp * v; }
};

// The schedule `name` (parallel.schedule, dist::Schedule) of stage `stage` of pp with m micro-batches and v
// chunks per rank placed by `placement` (perf::chunks_per_rank and
// perf::chunk_placement of the run's layout).
StageSchedule make_stage_schedule(dist::Schedule name, int pp, int stage, int m, int v, dist::ChunkPlacement placement);

// Forwards only (evaluation): each of m micro-batches through this rank's
// chunks of `train`'s layout in order, one activation slot each.
StageSchedule make_forward_schedule(const StageSchedule& train, int m);

}  // namespace wiola
