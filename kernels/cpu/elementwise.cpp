// Vector arithmetic and the deterministic reductions (ops.h "elementwise and
// reductions").
#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"

namespace wiola::cpu {

template <class T>
void add(const T* a, const T* b, T* out, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void axpy(T alpha, const T* x, T* y, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

template <class T>
void scale(T* x, T s, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}

template <class T>
double sum_squares(const T* x, size_t n) {
  return chunked_sum(n, [x](size_t i0, size_t i1) {
    return lane_sum(i0, i1, [x](size_t i) { return double(x[i]) * double(x[i]); });
  });
}

template <class T>
double sum(const T* x, size_t n) {
  return chunked_sum(n, [x](size_t i0, size_t i1) {
    return lane_sum(i0, i1, [x](size_t i) { return double(x[i]); });
  });
}

#define WIOLA_INST(T)                                             \
  template void add<T>(const T*, const T*, T*, size_t);           \
  template void axpy<T>(T, const T*, T*, size_t);                 \
  template void scale<T>(T*, T, size_t);                          \
  template double sum_squares<T>(const T*, size_t);               \
  template double sum<T>(const T*, size_t);
WIOLA_INST(float)
WIOLA_INST(double)
#undef WIOLA_INST

}  // namespace wiola::cpu
