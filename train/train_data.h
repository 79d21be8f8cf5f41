// The training data of this rank: the loader of its DP rank and its slice
// of the step's global batch (m micro-batches of B sequences of T + 1
// tokens, one after the other).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/loader.h"

namespace wiola {

struct RunSettings;

struct TrainData {
  std::unique_ptr<TokenLoader> loader;
  std::vector<int32_t> batch;

  // The loader of this DP rank (inside the setup agreement); the Trainer
  // sizes `batch` after the agreement.
  void open(const RunSettings& run, uint64_t data_seed);
};

}  // namespace wiola
