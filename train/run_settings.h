// What every part of the Trainer reads of the run, fixed at its start: the
// config and options, the backend and the world, the step budget, the
// batch's shape, and this rank's place in the grid. Nothing here changes
// after construction; the backend and the world are the run's to use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "config/run_config.h"
#include "dist/comm.h"
#include "dist/grid.h"
#include "kernels/ops.h"
#include "train/trainer.h"

namespace wiola {

struct RunSettings {
  const RunConfig& rc;
  TrainOptions opt;
  Ops<float>& ops;
  dist::Comm& world;
  StepBudget budget;
  int B, T, m;         // micro-batch, sequence length, micro-batches per step
  int64_t GB;          // global batch (sequences)
  dist::GridCoord me;  // this rank's (tp, pp, dp)
  // data.documents (docs/model.md §2 "Documents"): the shards' EOS id, set
  // once the data is open; -1: off.
  int32_t documents_eos = -1;

  RunSettings(const RunConfig& r, const TrainOptions& o, Ops<float>& b, dist::Comm& w)
      : rc(r),
        opt(o),
        ops(b),
        world(w),
        budget(StepBudget::of(r)),
        B(r.train.micro_batch),
        T(r.model.T),
        m(r.train.grad_accum),
        GB(r.global_batch()),
        me(dist::grid_coord(dist::GridConfig{r.parallel.tp, r.parallel.pp, r.parallel.dp}, w.rank())) {}
  bool root() const { return world.rank() == 0; }
  size_t mb_tokens() const { return size_t(B) * (T + 1); }
  std::string step_context(int64_t t) const { return "stage " + std::to_string(me.pp) + " step " + std::to_string(t); }
};

}  // namespace wiola
