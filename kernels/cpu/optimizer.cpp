// AdamW exactly as PyTorch's (docs/model.md §4), in double per element:
//   p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)   (PyTorch's order).
// float storage: Highway double vectors, dispatched at run time (hn::Sqrt);
// double: the scalar template (sqrt_newton, not std::sqrt, so that the loop
// vectorises). Fused with the passes after an update (kernels/ops.h): w (may
// be null) gets the new p, and with zero_grad g is zeroed once read.
#include <cstddef>

#ifndef WIOLA_KERNELS_CPU_ADAM_CONSTS_
#define WIOLA_KERNELS_CPU_ADAM_CONSTS_  // this file is included once per target
namespace wiola::cpu {
struct AdamConsts {
  double decay, step, rsbc2, eps, b1, b2;
};
}  // namespace wiola::cpu
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/optimizer.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace wiola::cpu::HWY_NAMESPACE {

void AdamwF(float* p, float* g, float* m, float* v, float* w, bool zero_grad, size_t n, const AdamConsts& k) {
  const DD dd;
  const hn::Rebind<float, DD> df;  // as many floats as dd has doubles
  const VD decay = hn::Set(dd, k.decay), step = hn::Set(dd, k.step), rsbc2 = hn::Set(dd, k.rsbc2),
           eps = hn::Set(dd, k.eps), b1 = hn::Set(dd, k.b1), b2 = hn::Set(dd, k.b2),
           c1 = hn::Set(dd, 1.0 - k.b1), c2 = hn::Set(dd, 1.0 - k.b2);
  ForEach(dd, n, [&](size_t i, auto t) HWY_ATTR {
    const VD gi = hn::PromoteTo(dd, In(df, g + i, t));
    const VD mi = hn::Add(hn::Mul(b1, hn::PromoteTo(dd, In(df, m + i, t))), hn::Mul(c1, gi));
    const VD vi =
        hn::Add(hn::Mul(b2, hn::PromoteTo(dd, In(df, v + i, t))), hn::Mul(hn::Mul(c2, gi), gi));
    const VD pi = hn::Sub(hn::Mul(hn::PromoteTo(dd, In(df, p + i, t)), decay),
                          hn::Div(hn::Mul(step, mi), hn::Add(hn::Mul(hn::Sqrt(vi), rsbc2), eps)));
    Out(df, hn::DemoteTo(df, mi), m + i, t);
    Out(df, hn::DemoteTo(df, vi), v + i, t);
    const auto pf = hn::DemoteTo(df, pi);
    Out(df, pf, p + i, t);
    if (w) Out(df, pf, w + i, t);
    if (zero_grad) Out(df, hn::Zero(df), g + i, t);
  });
}

}  // namespace wiola::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd_dispatch.h"

namespace wiola::cpu {

HWY_EXPORT(AdamwF);

template <class T>
void adamw(T* p, T* g, T* m, T* v, size_t n, double lr, double beta1,
           double beta2, double eps, double wd, double bc1, double bc2, T* w,
           bool zero_grad) {
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
    if (w) w[i] = p[i];
    if (zero_grad) g[i] = T(0);
  }
}
template <>
void adamw<float>(float* p, float* g, float* m, float* v, size_t n, double lr,
                  double beta1, double beta2, double eps, double wd, double bc1, double bc2,
                  float* w, bool zero_grad) {
  const AdamConsts k{1.0 - lr * wd, lr / bc1, 1.0 / std::sqrt(bc2), eps, beta1, beta2};
  const auto fn = WIOLA_DISPATCH(AdamwF);
  parallel_ranges(n, [&](size_t i0, size_t i1) {
    fn(p + i0, g + i0, m + i0, v + i0, w ? w + i0 : nullptr, zero_grad, i1 - i0, k);
  });
}

template void adamw<double>(double*, double*, double*, double*, size_t,
                            double, double, double, double, double, double,
                            double, double*, bool);

}  // namespace wiola::cpu
#endif  // HWY_ONCE
