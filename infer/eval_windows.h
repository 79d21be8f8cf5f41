// Which windows `wiola eval` scores (docs/inference.md): a data split's
// samples and the tail they leave, the training run's own validation windows
// (--as-training), or a text's windows; and the first window's logits for
// comparisons with other implementations. infer/evaluate.h scores them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "infer/evaluate.h"
#include "model/model.h"

namespace wiola::infer {

// The windows to score and how to read them.
struct WindowPlan {
  int64_t count = 0;
  WindowSource window;
  std::string what;  // for the report: "the whole split", ...
};

// What a training run's validation used (its manifest's recorded config):
// the first eval_batches global batches of the split in index order (no
// shuffle), in micro-batches of train.micro_batch. `where` names the
// manifest in errors (a run without validation, or one on a blend).
struct TrainingEval {
  int64_t samples = 0;
  int micro_batch = 1;
  std::string split_source;
};
TrainingEval training_eval(const nlohmann::json& manifest, const std::string& where);

// A split's windows: with `training_samples` > 0 the loader's first samples,
// wrapping into the next epoch as training did; otherwise every sample, then
// the tail they leave (every token but the first is a target once). The plan
// reads through `loader`, which must outlive it.
WindowPlan split_windows(const TokenLoader& loader, int T, int64_t training_samples);
// A text's windows of T + 1 tokens overlapping by one; `ids` must outlive
// the plan.
WindowPlan text_windows(const std::vector<int32_t>& ids, int T);

// The logits of the first window's inputs as float32 .npy [n, V] and its ids
// as int32 .npy [n] (either path may be empty: not written).
void save_first_window(Model<float>& model, const std::vector<int32_t>& ids, const std::string& logits_npy,
                       const std::string& ids_npy);

}  // namespace wiola::infer
