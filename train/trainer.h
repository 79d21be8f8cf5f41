// The training loop, for any process layout (SPEC §5): one rank of a
// TP × PP × DP grid (a single process is the 1 × 1 × 1 grid). Per step: the
// loader's DP slice -> the pipeline schedule (1F1B or GPipe) over the
// micro-batches, forwarding hidden states and GCLA summaries between stages
// -> tied-embedding gradient sum between first and last stage -> ZeRO AdamW
// over DP (reduction overlapped with the last backward) with the SPEC §4
// schedule; progress lines and RUN_DIR/metrics.jsonl from world rank 0,
// numerics dumps gathered to full tensors.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dist/comm.h"
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

// AdamW segments of a parameter layout: decay per SPEC §4. A tensor counts
// in the gradient norm on exactly one rank: TP-replicated tensors only on
// tp rank 0, and the tied embedding only where embed_in_norm (the first
// stage; the last stage holds a copy when pp > 1).
std::vector<dist::ParamSegment> optimizer_segments(const ParamLayout& layout, int tp_rank = 0,
                                                   bool embed_in_norm = true);

// Collective over `world` (size tp·pp·dp of rc.parallel). Throws
// wiola::Error on a bad config or input; the caller ends the job.
TrainSummary run_training(const RunConfig& rc, const TrainOptions& opt, dist::Comm& world);

}  // namespace wiola
