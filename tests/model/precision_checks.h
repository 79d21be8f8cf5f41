// Model-level checks of a backend's precision mode, shared by the cuda
// backend's tests (tests/gpu/cuda_model_test.cpp, on a GPU) and the cpu-bf16
// debug backend's (tests/model/test_bf16_storage.cpp, in CI): a short
// training run's losses, cached decoding against the full forward, and ATM's
// decisions after one step. Header-only: the GPU tests link neither MPI nor
// the trainer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dist/optimizer.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace wiola::checks {

using MakeOps = std::function<std::unique_ptr<Ops<float>>()>;

// AdamW segments (decay as docs/model.md §4), every tensor in the norm, the
// layout's padding as padding segments.
inline std::vector<dist::ParamSegment> segments(const ParamLayout& layout) {
  std::vector<dist::ParamSegment> s;
  for (const ParamEntry& e : layout.entries()) {
    s.push_back({e.offset, e.size(), e.decay, true});
    if (e.span > e.size()) s.push_back({e.offset + e.size(), e.span - e.size(), false, false, true});
  }
  return s;
}

// Per-token losses of `steps` AdamW steps (lr 3e-3) from init seed 1, step s
// on micro-batch s of `tok` ([steps][B][T + 1]).
inline std::vector<double> training_losses(const MakeOps& make, const ModelConfig& c, int B, int steps,
                                           const std::vector<int32_t>& tok) {
  auto ops = make();
  Model<float> m(*ops, c, ModelShard{}, nullptr, ModelOptions{B, false, false});
  m.init(1);
  dist::DistAdamW adam(*ops, m.params(), m.grads(), m.n_params(), segments(m.layout()), dist::AdamWConfig{}, nullptr,
                       nullptr);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    m.zero_grads();
    losses.push_back(m.train_micro_step(tok.data() + size_t(s) * B * (c.T + 1), 1.0 / (B * c.T)) / (B * c.T));
    if (!adam.step(3e-3, adam.applied_steps() + 1).skipped) m.refresh_weights();
  }
  return losses;
}

// Largest |logit difference| between the full forward of one sequence and
// decoding it through a KV cache in chunks of 5 (init seed 2); *max_logit
// gets the largest |logit|.
inline double cached_decoding_diff(Ops<float>& ops, const ModelConfig& c, double* max_logit) {
  Model<float> m(ops, c, ModelShard{}, nullptr, ModelOptions{1, false, false});
  m.init(2);
  std::vector<int32_t> ids(c.T);
  for (int t = 0; t < c.T; ++t) ids[t] = (t * 37 + 5) % c.V;
  const auto full = m.forward_logits(ids.data(), false);
  auto cache = m.make_cache(c.T);
  std::vector<float> inc;
  for (int t = 0; t < c.T;) {
    const int n = std::min(5, c.T - t);
    const auto part = m.forward_cached(ids.data() + t, n, cache);
    inc.insert(inc.end(), part.begin(), part.end());
    t += n;
  }
  double d = inc.size() == full.size() ? 0 : INFINITY, mag = 0;
  for (size_t i = 0; i < std::min(full.size(), inc.size()); ++i) {
    d = std::max(d, std::abs(double(full[i]) - double(inc[i])));
    mag = std::max(mag, std::abs(double(full[i])));
  }
  if (max_logit) *max_logit = mag;
  return d;
}

// ATM's merge decisions of every layer after one training micro-step (init
// seed 3) on `tok` ([B][T + 1]).
inline std::vector<std::vector<uint8_t>> atm_decisions(const MakeOps& make, const ModelConfig& c, int B,
                                                       const std::vector<int32_t>& tok) {
  auto ops = make();
  Model<float> m(*ops, c, ModelShard{}, nullptr, ModelOptions{B, false, false});
  m.init(3);
  m.zero_grads();
  m.train_micro_step(tok.data(), 1.0 / (B * c.T));
  std::vector<std::vector<uint8_t>> d;
  for (int l = 0; l < c.L; ++l) d.push_back(m.atm_open(l));
  return d;
}

struct Flips {
  size_t flips = 0, total = 0, merges = 0;  // merges: decisions `a` opened
  bool same_shape = true;
};
inline Flips count_flips(const std::vector<std::vector<uint8_t>>& a, const std::vector<std::vector<uint8_t>>& b) {
  Flips f;
  f.same_shape = a.size() == b.size();
  for (size_t l = 0; f.same_shape && l < a.size(); ++l) {
    if (a[l].size() != b[l].size()) {
      f.same_shape = false;
      break;
    }
    for (size_t i = 0; i < a[l].size(); ++i) {
      f.flips += a[l][i] != b[l][i];
      f.merges += a[l][i] != 0;
      ++f.total;
    }
  }
  return f;
}

}  // namespace wiola::checks
