// Model hyper-parameters (docs/model.md §1) and the slice of the model one process
// owns (TP rank, pipeline layer range).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace wiola {

struct ModelConfig {
  std::string name = "custom";
  int d = 64;          // hidden size
  int L = 6;           // layers
  int H = 4;           // query heads
  int Hkv = 2;         // KV groups; query head h uses group h % Hkv
  int dA = 64;         // DSFF stream A width
  int dB = 256;        // DSFF stream B width
  int V = 512;         // vocabulary
  int T = 32;          // sequence length (training window)
  double theta0 = 10000.0;  // SRPE base
  double k_s = 8.0;         // SRPE spiral divisor
  double a_s = 0.1;         // SRPE radial amplitude
  double f_s = 0.01;        // SRPE radial frequency
  double tau = 0.92;        // ATM merge threshold (strict >)
  bool atm = true;          // ATM in training (never in eval/generation)
  int Lambda = 2;           // cross-layer look-back
  double eps = 1e-6;        // RMSNorm epsilon
  double init_std = 0.02;
  double phi_init = -3.0;

  int dh() const { return d / H; }
  // ATM acts in layers floor(L/3) <= l < floor(2L/3).
  bool atm_layer(int l) const { return atm && l >= L / 3 && l < (2 * L) / 3; }
  // Context rows of layer l: min(Lambda, l+1).
  int n_ctx(int l) const { return l + 1 < Lambda ? l + 1 : Lambda; }
  // Throws wiola::Error naming the first inconsistent field.
  void validate() const;
  // Exact parameter count (docs/model.md §1 formula).
  int64_t param_count() const;
};

// Named presets: wiola-120m, wiola-360m, wiola-700m, wiola-1.5b and small
// test/bench sizes (wiola-tiny, wiola-small, wiola-bench). Throws on unknown.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

// What one process holds. Single process: tp_size = 1, all layers.
struct ModelShard {
  int tp_rank = 0, tp_size = 1;
  int layer_begin = 0, layer_end = -1;  // [begin, end); -1 = L
  bool first_stage() const { return layer_begin == 0; }
  bool last_stage(const ModelConfig& c) const { return end(c) == c.L; }
  int end(const ModelConfig& c) const { return layer_end < 0 ? c.L : layer_end; }
};

// Layer ranges [begin, end) a rank holds: one per pipeline chunk.
using LayerRanges = std::vector<std::pair<int, int>>;

// Pipeline messages of a stage: [B,T,d] tensors into it and out of it per
// micro-batch (the residual stream plus the summaries the next stage reads
// but cannot compute; docs/model.md §5). 0 on the first / last stage.
int boundary_tensors_in(const ModelConfig& c, const ModelShard& s);
int boundary_tensors_out(const ModelConfig& c, const ModelShard& s);

// Local (per TP rank) sizes.
struct LocalDims {
  int H, Hkv, dh, dA, dB, V, v0;
  LocalDims(const ModelConfig& c, const ModelShard& s);
};

}  // namespace wiola
