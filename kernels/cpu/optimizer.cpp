// AdamW exactly as PyTorch's (docs/model.md §4), in double per element:
//   p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)   (PyTorch's order;
// sqrt_newton, not std::sqrt, so that the loop vectorises).
#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"

namespace wiola::cpu {

template <class T>
void adamw(T* p, const T* g, T* m, T* v, size_t n, double lr, double beta1,
           double beta2, double eps, double wd, double bc1, double bc2) {
  const double decay = 1.0 - lr * wd;
  const double step = lr / bc1, rsbc2 = 1.0 / std::sqrt(bc2);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    const double gi = double(g[i]);
    const double mi = beta1 * double(m[i]) + (1.0 - beta1) * gi;
    const double vi = beta2 * double(v[i]) + (1.0 - beta2) * gi * gi;
    m[i] = T(mi);
    v[i] = T(vi);
    p[i] = T(double(p[i]) * decay - step * mi / (sqrt_newton(vi) * rsbc2 + eps));
  }
}

template void adamw<float>(float*, const float*, float*, float*, size_t,
                           double, double, double, double, double, double,
                           double);
template void adamw<double>(double*, const double*, double*, double*, size_t,
                            double, double, double, double, double, double,
                            double);

}  // namespace wiola::cpu
