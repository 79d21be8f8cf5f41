// Single-process training loop: loader -> micro-batches -> forward/backward
// (gradients accumulate) -> AdamW (dist::DistAdamW, one rank) with the SPEC
// §4 schedule, progress lines, RUN_DIR/metrics.jsonl, optional numerics dumps.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dist/optimizer.h"
#include "model/params.h"
#include "train/run_config.h"

namespace wiola {

struct TrainOptions {
  std::vector<std::pair<int64_t, std::string>> dumps;  // (step, path)
  bool quiet = false;                                 // no progress lines
};

struct TrainSummary {
  int64_t steps = 0, t_max = 0, skipped = 0;
  double first_loss = 0, last_loss = 0;
  double val_loss = -1;       // last validation loss (-1: none)
  double tokens_per_s = 0;    // whole run, wall clock of the steps
};

// AdamW segments of a parameter layout: decay per SPEC §4, each tensor in
// the norm once (single process).
std::vector<dist::ParamSegment> optimizer_segments(const ParamLayout& layout);

TrainSummary run_training(const RunConfig& rc, const TrainOptions& opt);

}  // namespace wiola
