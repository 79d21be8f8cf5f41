// Loss and perplexity of a model over token windows (ATM off). A window is
// up to T + 1 consecutive tokens: the first n - 1 are inputs, the last
// n - 1 targets (the loader's samples, docs/model.md §6). Full windows go
// through the model's own loss (Model::eval_loss, as the trainer's
// validation does); a shorter tail window through the logits, with its
// cross-entropy taken on the host in double.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"

namespace wiola::infer {

struct EvalTotals {
  double loss_sum = 0;  // sum of the targets' cross-entropies (nats)
  int64_t targets = 0, windows = 0;
  double mean() const { return targets ? loss_sum / double(targets) : 0.0; }
  double perplexity() const;
};

// Produces window i into out (up to T + 1 ids); returns its length.
using WindowSource = std::function<int(int64_t i, int32_t* out)>;
// Called after each batch with the totals so far.
using EvalProgress = std::function<void(const EvalTotals&)>;

// Windows 0..count-1 in order, in batches of the model's micro-batch.
// Within a batch every window but a tail one must be full (T + 1 ids).
EvalTotals evaluate_windows(Model<float>& model, int64_t count, const WindowSource& window,
                            const EvalProgress& progress = {});

// Cross-entropy of each target of one sequence from its logits [n, V]
// (double log-sum-exp).
double cross_entropy_sum(const float* logits, const int32_t* targets, int n, int V);

// A .npy file (numpy format 1.0) of float32 or int32 values with `shape`,
// written through a temporary name.
void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
void write_npy(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape);

}  // namespace wiola::infer
