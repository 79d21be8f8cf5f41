// Vector arithmetic and the deterministic reductions (ops.h "elementwise and
// reductions"). float: Highway, dispatched at run time; double: the scalar
// templates (the float64 test backend).
#include <cstddef>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/elementwise.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace wiola::cpu::HWY_NAMESPACE {

void AddF(const float* a, const float* b, float* out, size_t n) {
  const DF d;
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR {
    Out(d, hn::Add(In(d, a + i, t), In(d, b + i, t)), out + i, t);
  });
}

void AxpyF(float alpha, const float* x, float* y, size_t n) {
  const DF d;
  const VF va = hn::Set(d, alpha);
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR {
    Out(d, hn::MulAdd(va, In(d, x + i, t), In(d, y + i, t)), y + i, t);
  });
}

void ScaleF(float* x, float s, size_t n) {
  const DF d;
  const VF vs = hn::Set(d, s);
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR { Out(d, hn::Mul(In(d, x + i, t), vs), x + i, t); });
}

// Sums of one chunk in double: four lanes-wide partial sums, added in a fixed
// order (padding lanes are 0).
double SumF(const float* x, size_t n) {
  const DF d;
  VD lo = hn::Zero(DD()), hi = lo;
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR { AddWide(In(d, x + i, t), lo, hi); });
  return SumLanes(hn::Add(lo, hi));
}

double SumSquaresF(const float* x, size_t n) {
  const DF d;
  VD lo = hn::Zero(DD()), hi = lo;
  ForEach(d, n, [&](size_t i, auto t) HWY_ATTR {
    const VF v = In(d, x + i, t);
    const VD a = PromoteLo(v), b = PromoteHi(v);
    lo = hn::MulAdd(a, a, lo);  // a*a is exact in double: fused or not, the same
    hi = hn::MulAdd(b, b, hi);
  });
  return SumLanes(hn::Add(lo, hi));
}

}  // namespace wiola::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd_dispatch.h"

namespace wiola::cpu {

HWY_EXPORT(AddF);
HWY_EXPORT(AxpyF);
HWY_EXPORT(ScaleF);
HWY_EXPORT(SumF);
HWY_EXPORT(SumSquaresF);

template <class T>
void add(const T* a, const T* b, T* out, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
template <>
void add<float>(const float* a, const float* b, float* out, size_t n) {
  const auto fn = WIOLA_DISPATCH(AddF);
  parallel_ranges(n, [&](size_t i0, size_t i1) { fn(a + i0, b + i0, out + i0, i1 - i0); });
}

template <class T>
void axpy(T alpha, const T* x, T* y, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}
template <>
void axpy<float>(float alpha, const float* x, float* y, size_t n) {
  const auto fn = WIOLA_DISPATCH(AxpyF);
  parallel_ranges(n, [&](size_t i0, size_t i1) { fn(alpha, x + i0, y + i0, i1 - i0); });
}

template <class T>
void scale(T* x, T s, size_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}
template <>
void scale<float>(float* x, float s, size_t n) {
  const auto fn = WIOLA_DISPATCH(ScaleF);
  parallel_ranges(n, [&](size_t i0, size_t i1) { fn(x + i0, s, i1 - i0); });
}

// Chunks of kSumChunk elements (a multiple of every vector width) summed
// separately, the partials in chunk order: independent of the thread count.
template <class T>
double sum_squares(const T* x, size_t n) {
  return chunked_sum(n, [x](size_t i0, size_t i1) {
    return lane_sum(i0, i1, [x](size_t i) { return double(x[i]) * double(x[i]); });
  });
}
template <>
double sum_squares<float>(const float* x, size_t n) {
  const auto fn = WIOLA_DISPATCH(SumSquaresF);
  return chunked_sum(n, [&](size_t i0, size_t i1) { return fn(x + i0, i1 - i0); });
}

template <class T>
double sum(const T* x, size_t n) {
  return chunked_sum(n, [x](size_t i0, size_t i1) {
    return lane_sum(i0, i1, [x](size_t i) { return double(x[i]); });
  });
}
template <>
double sum<float>(const float* x, size_t n) {
  const auto fn = WIOLA_DISPATCH(SumF);
  return chunked_sum(n, [&](size_t i0, size_t i1) { return fn(x + i0, i1 - i0); });
}

template void add<double>(const double*, const double*, double*, size_t);
template void axpy<double>(double, const double*, double*, size_t);
template void scale<double>(double*, double, size_t);
template double sum_squares<double>(const double*, size_t);
template double sum<double>(const double*, size_t);

}  // namespace wiola::cpu
#endif  // HWY_ONCE
