// Numerics dump of one training step (docs/model.md §7) for cross-checking with other
// implementations (tests/reference/compare_dump.py): config attributes, the
// global batch, full unsharded parameters / gradients / AdamW state, loss,
// gradient norm, ATM merge decisions and the logits.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/params.h"

namespace wiola {

struct StepDump {
  ModelConfig cfg;
  std::map<std::string, double> float_attrs;       // lr, lr_max, beta1, ...
  std::map<std::string, int64_t> int_attrs;        // step, t_max, warmup
  int B = 0;                                       // global batch
  std::vector<int32_t> tokens;                     // [B, T+1]
  std::vector<float> params, grads, params_after;  // flat, layout order
  std::vector<float> m, v;                         // empty: no /optim (step 1)
  double loss = 0, grad_norm = 0;
  std::map<int, std::vector<uint8_t>> atm;  // layer -> open [B, T]
  std::vector<float> logits;                // [B, T, V] or empty
  std::vector<int32_t> doc_start;           // [B, T] documents' first positions, or empty
};

// Writes `path` atomically (temporary name, then rename). `layout` must be
// the single-process layout (tp_size 1, all layers): tensors are unsharded.
void write_step_dump(const std::string& path, const ParamLayout& layout, const StepDump& d);

}  // namespace wiola
