#include "model/flops.h"

namespace wiola {

double attention_step_flops(const ModelConfig& c, int B) {
  const double N = double(B) * c.T;
  return 3 * c.L * N * c.H * 4.0 * c.dh() * (c.T + 1) / 2.0;
}

namespace {
// Weights of one layer (its GEMMs' K x N summed).
double layer_weights(const ModelConfig& c) {
  const double d = c.d, hd = double(c.H) * c.dh(), kvd = double(c.Hkv) * c.dh();
  return 2 * d * hd + hd * d + 4 * d * kvd + 3 * d * c.dA + 2 * d * c.dB + 2 * d * d;
}
}  // namespace

double layer_weight_grad_flops(const ModelConfig& c, int B, int) {
  return 2 * (double(B) * c.T) * layer_weights(c);
}

double head_weight_grad_flops(const ModelConfig& c, int B) { return 2 * double(B) * c.T * double(c.V) * c.d; }

double layer_step_flops(const ModelConfig& c, int B, int l) {
  const double N = double(B) * c.T;
  const double w_layer = layer_weights(c);
  const double fwd = 2 * N * w_layer + N * c.H * 4.0 * c.dh() * c.n_ctx(l);
  return 3 * fwd + attention_step_flops(c, B) / c.L;
}

double head_step_flops(const ModelConfig& c, int B) {
  return 3 * 2 * double(B) * c.T * double(c.V) * c.d;
}

double train_step_flops(const ModelConfig& c, int B) {
  double f = head_step_flops(c, B);
  for (int l = 0; l < c.L; ++l) f += layer_step_flops(c, B, l);
  return f;
}

}  // namespace wiola
