// DSFF pieces (docs/model.md §2 "DSFF"): SwiGLU of stream A, exact-erf GELU of stream
// B, and the sigmoid fusion of the two streams.
#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"

namespace wiola::cpu {

// h = SiLU(g) * u, SiLU(g) = g sigma(g)
template <class T>
void swiglu_fwd(const T* g, const T* u, size_t n, T* h) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
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

// GELU(x) = 0.5 x (1 + erf(x / sqrt 2))   (float: erf_poly, common.h)
template <class T>
void gelu_fwd(const T* x, size_t n, T* y) {
  const T r2 = T(0.70710678118654752440);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i)
    y[i] = T(0.5) * x[i] * (T(1) + terf(x[i] * r2));
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

// out = alpha a + (1 - alpha) b, alpha = sigma(pre)
template <class T>
void fusion_fwd(const T* pre, const T* a, const T* b, size_t n, T* out) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) {
    T s, c;
    sigmoid2(pre[i], s, c);
    out[i] = s * a[i] + c * b[i];
  }
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

#define WIOLA_INST(T)                                                        \
  template void swiglu_fwd<T>(const T*, const T*, size_t, T*);               \
  template void swiglu_bwd<T>(const T*, const T*, const T*, size_t, T*, T*); \
  template void gelu_fwd<T>(const T*, size_t, T*);                           \
  template void gelu_bwd<T>(const T*, const T*, size_t, T*);                 \
  template void fusion_fwd<T>(const T*, const T*, const T*, size_t, T*);     \
  template void fusion_bwd<T>(const T*, const T*, const T*, const T*,        \
                              size_t, T*, T*, T*);
WIOLA_INST(float)
WIOLA_INST(double)
#undef WIOLA_INST

}  // namespace wiola::cpu
