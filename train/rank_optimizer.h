// This rank's optimizer: DistAdamW (dist/optimizer.h) on the rank model's
// flat parameters, with ZeRO over DP and the DP reduction overlapped with
// the last micro-batch's backward.
#pragma once

#include <cstddef>
#include <memory>

#include "dist/optimizer.h"

namespace wiola {

struct RunSettings;
struct RankComms;
struct RankModel;

struct RankOptimizer {
  std::unique_ptr<dist::DistAdamW> adam;
  bool zero = false;     // optimizer state sharded over DP
  bool overlap = false;  // DP reduction starts during the backward (grad-ready reports)
  int dp = 1;            // DP ranks

  // On `model`'s parameters; `first`: this rank holds the model's first chunk.
  void build(const RunSettings& run, RankComms& comms, RankModel& model, bool first);
  // The flat length DP reduces (ZeRO pads buckets to a multiple of DP).
  size_t padded_params(const RankModel& model) const;
};

}  // namespace wiola
