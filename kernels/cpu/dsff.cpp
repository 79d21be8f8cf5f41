// DSFF pieces (docs/model.md §2 "DSFF"): SwiGLU of stream A, exact-erf GELU of stream
// B, and the sigmoid fusion of the two streams. float: Highway, dispatched at
// run time (the same formulas, lane by lane); double: the scalar templates.
#include <cstddef>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/dsff.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace wiola::cpu::HWY_NAMESPACE {

void SwigluFwdF(const float* g, const float* u, size_t n, float* h) {
  const DF d;
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR {
    const VF gv = In(d, g + i, t);
    Out(d, hn::Mul(hn::Mul(gv, Sigmoid(d, gv)), In(d, u + i, t)), h + i, t);
  });
}

void SwigluBwdF(const float* g, const float* u, const float* dh, size_t n, float* dg, float* du) {
  const DF d;
  const VF one = hn::Set(d, 1.0f);
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR {
    const VF gv = In(d, g + i, t), uv = In(d, u + i, t), dhv = In(d, dh + i, t);
    VF s, c;
    Sigmoid2(d, gv, s, c);
    Out(d, hn::Mul(hn::Mul(hn::Mul(dhv, uv), s), hn::Add(one, hn::Mul(gv, c))), dg + i, t);
    Out(d, hn::Mul(hn::Mul(dhv, gv), s), du + i, t);
  });
}

void GeluFwdF(const float* x, size_t n, float* y) {
  const DF d;
  const VF half = hn::Set(d, 0.5f), one = hn::Set(d, 1.0f), r2 = hn::Set(d, 0.70710678118654752440f);
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR {
    const VF v = In(d, x + i, t);
    Out(d, hn::Mul(hn::Mul(half, v), hn::Add(one, Erf(d, hn::Mul(v, r2)))), y + i, t);
  });
}

void GeluBwdF(const float* x, const float* dy, size_t n, float* dx) {
  const DF d;
  const VF half = hn::Set(d, 0.5f), one = hn::Set(d, 1.0f), mhalf = hn::Set(d, -0.5f),
           r2 = hn::Set(d, 0.70710678118654752440f),
           rpi = hn::Set(d, 0.39894228040143267794f);  // 1/sqrt(2 pi)
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR {
    const VF v = In(d, x + i, t);
    const VF cdf = hn::Mul(half, hn::Add(one, Erf(d, hn::Mul(v, r2))));
    const VF pdf = hn::Mul(hn::Mul(v, rpi), Exp(d, hn::Mul(hn::Mul(mhalf, v), v)));
    Out(d, hn::Mul(In(d, dy + i, t), hn::Add(cdf, pdf)), dx + i, t);
  });
}

// res null: no residual (two loops, so the common case tests nothing per vector).
void FusionFwdF(const float* pre, const float* a, const float* b, const float* res, size_t n,
                float* out) {
  const DF d;
  const auto fused = [&](size_t i, auto t) HWY_ATTR {
    VF s, c;
    Sigmoid2(d, In(d, pre + i, t), s, c);
    return hn::Add(hn::Mul(s, In(d, a + i, t)), hn::Mul(c, In(d, b + i, t)));
  };
  if (res)
    ForEach(d, n, [&](size_t i, auto t) HWY_ATTR { Out(d, hn::Add(In(d, res + i, t), fused(i, t)), out + i, t); });
  else
    ForEach(d, n, [&](size_t i, auto t) HWY_ATTR { Out(d, fused(i, t), out + i, t); });
}

void FusionBwdF(const float* pre, const float* a, const float* b, const float* dout, size_t n,
                float* dpre, float* da, float* db) {
  const DF d;
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR {
    VF s, c;
    Sigmoid2(d, In(d, pre + i, t), s, c);
    const VF g = In(d, dout + i, t);
    const VF diff = hn::Sub(In(d, a + i, t), In(d, b + i, t));
    Out(d, hn::Mul(hn::Mul(hn::Mul(g, diff), s), c), dpre + i, t);
    Out(d, hn::Mul(g, s), da + i, t);
    Out(d, hn::Mul(g, c), db + i, t);
  });
}

}  // namespace wiola::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd_dispatch.h"

namespace wiola::cpu {

HWY_EXPORT(SwigluFwdF);
HWY_EXPORT(SwigluBwdF);
HWY_EXPORT(GeluFwdF);
HWY_EXPORT(GeluBwdF);
HWY_EXPORT(FusionFwdF);
HWY_EXPORT(FusionBwdF);

// h = SiLU(g) * u, SiLU(g) = g sigma(g)
template <class T>
void swiglu_fwd(const T* g, const T* u, size_t n, T* h) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
}
template <>
void swiglu_fwd<float>(const float* g, const float* u, size_t n, float* h) {
  const auto fn = WIOLA_DISPATCH(SwigluFwdF);
  parallel_ranges(n, [&](size_t i0, size_t i1) { fn(g + i0, u + i0, i1 - i0, h + i0); });
}

// dSiLU/dg = sigma (1 + g (1 - sigma))
template <class T>
void swiglu_bwd(const T* g, const T* u, const T* dh, size_t n, T* dg, T* du) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    T s, c;
    sigmoid2(g[i], s, c);
    dg[i] = dh[i] * u[i] * s * (T(1) + g[i] * c);
    du[i] = dh[i] * g[i] * s;
  }
}
template <>
void swiglu_bwd<float>(const float* g, const float* u, const float* dh, size_t n, float* dg,
                       float* du) {
  const auto fn = WIOLA_DISPATCH(SwigluBwdF);
  parallel_ranges(n, [&](size_t i0, size_t i1) {
    fn(g + i0, u + i0, dh + i0, i1 - i0, dg + i0, du + i0);
  });
}

// GELU(x) = 0.5 x (1 + erf(x / sqrt 2))   (float: erf_poly, common.h)
template <class T>
void gelu_fwd(const T* x, size_t n, T* y) {
  const T r2 = T(0.70710678118654752440);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i)
    y[i] = T(0.5) * x[i] * (T(1) + terf(x[i] * r2));
}
template <>
void gelu_fwd<float>(const float* x, size_t n, float* y) {
  const auto fn = WIOLA_DISPATCH(GeluFwdF);
  parallel_ranges(n, [&](size_t i0, size_t i1) { fn(x + i0, i1 - i0, y + i0); });
}

// GELU'(x) = 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2/2) / sqrt(2 pi)
template <class T>
void gelu_bwd(const T* x, const T* dy, size_t n, T* dx) {
  const T r2 = T(0.70710678118654752440);
  const T rpi = T(0.39894228040143267794);  // 1/sqrt(2 pi)
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T d = T(0.5) * (T(1) + terf(v * r2)) +
                v * rpi * texp(T(-0.5) * v * v);
    dx[i] = dy[i] * d;
  }
}
template <>
void gelu_bwd<float>(const float* x, const float* dy, size_t n, float* dx) {
  const auto fn = WIOLA_DISPATCH(GeluBwdF);
  parallel_ranges(n, [&](size_t i0, size_t i1) { fn(x + i0, dy + i0, i1 - i0, dx + i0); });
}

// out = res + alpha a + (1 - alpha) b, alpha = sigma(pre); res may be null
template <class T>
void fusion_fwd(const T* pre, const T* a, const T* b, const T* res, size_t n, T* out) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    T s, c;
    sigmoid2(pre[i], s, c);
    const T f = s * a[i] + c * b[i];
    out[i] = res ? res[i] + f : f;
  }
}
template <>
void fusion_fwd<float>(const float* pre, const float* a, const float* b, const float* res,
                       size_t n, float* out) {
  const auto fn = WIOLA_DISPATCH(FusionFwdF);
  parallel_ranges(n, [&](size_t i0, size_t i1) {
    fn(pre + i0, a + i0, b + i0, res ? res + i0 : nullptr, i1 - i0, out + i0);
  });
}

template <class T>
void fusion_bwd(const T* pre, const T* a, const T* b, const T* dout, size_t n,
                T* dpre, T* da, T* db) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    T s, c;
    sigmoid2(pre[i], s, c);
    dpre[i] = dout[i] * (a[i] - b[i]) * s * c;
    da[i] = dout[i] * s;
    db[i] = dout[i] * c;
  }
}
template <>
void fusion_bwd<float>(const float* pre, const float* a, const float* b, const float* dout,
                       size_t n, float* dpre, float* da, float* db) {
  const auto fn = WIOLA_DISPATCH(FusionBwdF);
  parallel_ranges(n, [&](size_t i0, size_t i1) {
    fn(pre + i0, a + i0, b + i0, dout + i0, i1 - i0, dpre + i0, da + i0, db + i0);
  });
}

template void swiglu_fwd<double>(const double*, const double*, size_t, double*);
template void swiglu_bwd<double>(const double*, const double*, const double*, size_t, double*,
                                 double*);
template void gelu_fwd<double>(const double*, size_t, double*);
template void gelu_bwd<double>(const double*, const double*, size_t, double*);
template void fusion_fwd<double>(const double*, const double*, const double*, const double*,
                                 size_t, double*);
template void fusion_bwd<double>(const double*, const double*, const double*, const double*,
                                 size_t, double*, double*, double*);

}  // namespace wiola::cpu
#endif  // HWY_ONCE
