// Shared helpers of the CPU op files: loop partitioning, the deterministic
// chunked reduction, and scalar math written so that loops over it vectorise
// (the double kernels; the float kernels use the vector versions of the same
// formulas in simd-inl.h).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include <omp.h>

namespace wiola::cpu {

// Below this many elements a loop runs on one thread (fork/join costs more).
inline constexpr size_t kParallelMin = size_t(1) << 14;

// [begin, end) of part `i` of `parts` equal parts of n.
inline size_t part_begin(size_t n, int i, int parts) {
  return n * size_t(i) / size_t(parts);
}

// f(i0, i1) on one contiguous range of [0, n) per OpenMP thread (one call
// for small n). Range starts are multiples of 64 elements; the dispatched
// kernels compute an element the same wherever it falls, so the split never
// changes results.
template <class F>
void parallel_ranges(size_t n, F f) {
  if (n < kParallelMin) {
    if (n) f(size_t(0), n);
    return;
  }
  const size_t blocks = (n + 63) / 64;
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t i0 = std::min(n, part_begin(blocks, t, nt) * 64);
    const size_t i1 = std::min(n, part_begin(blocks, t + 1, nt) * 64);
    if (i1 > i0) f(i0, i1);
  }
}

// sum_{i0 <= i < i1} term(i) in double over 16 fixed lanes (vectorises; the
// order is fixed by the code, not by the compiler).
template <class F>
double lane_sum(size_t i0, size_t i1, F term) {
  constexpr int kLanes = 16;
  double lane[kLanes] = {};
  size_t i = i0;
  for (; i + kLanes <= i1; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += term(i + l);
  for (int l = 0; i < i1; ++i, ++l) lane[l] += term(i);
  double s = 0;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  return s;
}

// Sum over [0, n) of f(i0, i1) -> double on fixed chunks of kSumChunk
// elements, chunk partials added serially in chunk order: the result does not
// depend on the number of threads.
inline constexpr size_t kSumChunk = 8192;
template <class F>
double chunked_sum(size_t n, F f) {
  const size_t chunks = (n + kSumChunk - 1) / kSumChunk;
  if (chunks <= 1) return n ? f(size_t(0), n) : 0.0;
  std::vector<double> part(chunks);
  const long nc = long(chunks);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (long c = 0; c < nc; ++c) {
    const size_t i0 = size_t(c) * kSumChunk;
    part[size_t(c)] = f(i0, std::min(n, i0 + kSumChunk));
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

// exp(x) for float as a polynomial so that loops vectorise (relative error a
// few ulp); 0 below -87, +inf above 88 (callers use x <= 0). Double uses
// std::exp.
inline float exp_poly(float x) {
  const float xc = std::min(std::max(x, -87.0f), 88.0f);
  // n = round(x / ln 2) via the 1.5*2^23 trick; r = x - n ln 2 (two parts).
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (xc - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale =
      std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  const float y = p * scale;
  return x < -87.0f ? 0.0f : (x > 88.0f ? HUGE_VALF : y);
}

// erf(x) for float as the rational approximation of Eigen/XLA (clamped to
// [-4, 4]; absolute error ~1e-7) so that loops vectorise. Double: std::erf.
inline float erf_poly(float a) {
  const float x = std::min(std::max(a, -4.0f), 4.0f);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 - 2.10102402082508e-06f;
  p = p * x2 - 5.69250639462346e-05f;
  p = p * x2 - 7.34990630326855e-04f;
  p = p * x2 - 2.95459980854025e-03f;
  p = p * x2 - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 - 2.13374055278905e-04f;
  q = q * x2 - 1.68282697438203e-03f;
  q = q * x2 - 7.37332916720468e-03f;
  q = q * x2 - 1.42647390514189e-02f;
  return x * p / q;
}

template <class T>
inline T terf(T x) {
  if constexpr (sizeof(T) == 4)
    return erf_poly(x);
  else
    return std::erf(x);
}

// sqrt(v) for v >= 0 in double without a libm call (std::sqrt keeps loops
// scalar under -fmath-errno): bit-trick 1/sqrt estimate, four Newton steps
// (relative error ~1e-16), times v. sqrt(0) = 0.
inline double sqrt_newton(double v) {
  double y = std::bit_cast<double>(0x5FE6EB50C7B537A9ull -
                                   (std::bit_cast<uint64_t>(v) >> 1));
  for (int it = 0; it < 4; ++it) y = y * (1.5 - 0.5 * v * y * y);
  return v * y;
}

template <class T>
inline T texp(T x) {
  if constexpr (sizeof(T) == 4)
    return exp_poly(x);
  else
    return std::exp(x);
}

// sigma(x) and 1 - sigma(x) from one exp(-|x|): no overflow, and 1 - sigma
// keeps its relative precision for large x.
template <class T>
inline void sigmoid2(T x, T& s, T& one_minus_s) {
  const T e = texp(-std::abs(x));
  const T inv = T(1) / (T(1) + e);
  s = x >= T(0) ? inv : e * inv;
  one_minus_s = x >= T(0) ? e * inv : inv;
}

template <class T>
inline T sigmoid(T x) {
  T s, c;
  sigmoid2(x, s, c);
  return s;
}

}  // namespace wiola::cpu
