// Scalar reference formulas of docs/model.md §2 and §4, written once for the
// host and for device kernels (WIOLA_HD). The CUDA kernels compute with them
// directly; the CPU kernels have vectorised versions of their own, and the
// tests check both backends against these. Arithmetic in double unless the
// formula says otherwise.
#pragma once

#include <cmath>

#include "kernels/hd.h"

namespace wiola::ref {

WIOLA_HD double sigmoid(double x) {
  // From exp(-|x|): no overflow either way.
  const double e = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

// SwiGLU stream: h = SiLU(g) * u = g σ(g) u; and its partial derivatives.
WIOLA_HD double swiglu(double g, double u) { return g * sigmoid(g) * u; }
WIOLA_HD double swiglu_dg(double g, double u) {
  const double s = sigmoid(g);
  return u * s * (1.0 + g * (1.0 - s));
}
WIOLA_HD double swiglu_du(double g) { return g * sigmoid(g); }

// GELU, the exact erf form: x Φ(x); derivative Φ(x) + x φ(x).
WIOLA_HD double gelu(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)); }
WIOLA_HD double gelu_dx(double x) {
  const double cdf = 0.5 * (1.0 + erf(x * 0.70710678118654752440));
  const double pdf = 0.39894228040143267794 * exp(-0.5 * x * x);
  return cdf + x * pdf;
}

// Fusion gate: out = α a + (1-α) b, α = σ(pre).
WIOLA_HD double fusion(double pre, double a, double b) {
  const double al = sigmoid(pre);
  return al * a + (1.0 - al) * b;
}

// WiolaRMSNorm of one element given the row's reciprocal RMS of z = x + δ:
// y = γ (x + δ) rstd, rstd = 1 / sqrt(mean(z²) + ε).
WIOLA_HD double rmsnorm(double x, double gamma, double delta, double rstd) {
  return gamma * (x + delta) * rstd;
}

// SRPE rotate-half pair (q_j, q_{j+dh/2}) by (c, s); inverse: the transpose.
WIOLA_HD void srpe_pair(double& a, double& b, double c, double s, bool inverse) {
  const double x = a, y = b;
  if (!inverse) {
    a = x * c - y * s;
    b = x * s + y * c;
  } else {
    a = x * c + y * s;
    b = -x * s + y * c;
  }
}

// One AdamW element exactly as PyTorch (docs/model.md §4): decoupled decay,
// moments, bias corrections bc1 = 1 - β1^t, bc2 = 1 - β2^t.
WIOLA_HD void adamw(double& p, double g, double& m, double& v, double lr, double beta1,
                    double beta2, double eps, double wd, double bc1, double bc2) {
  m = beta1 * m + (1.0 - beta1) * g;
  v = beta2 * v + (1.0 - beta2) * g * g;
  p = p * (1.0 - lr * wd) - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps);
}

}  // namespace wiola::ref
