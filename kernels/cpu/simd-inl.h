// Per-target building blocks of the dispatched CPU kernels (Highway): the
// float exp, erf and sigmoid of common.h as vector functions, and loops whose
// last, partial vector goes through a padded buffer. A dispatched file
// includes this once per target (hwy/foreach_target.h), hence the toggled
// include guard instead of #pragma once.
#if defined(WIOLA_KERNELS_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef WIOLA_KERNELS_CPU_SIMD_INL_H_
#undef WIOLA_KERNELS_CPU_SIMD_INL_H_
#else
#define WIOLA_KERNELS_CPU_SIMD_INL_H_
#endif

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "hwy/highway.h"

#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
#error "wiola's CPU kernels need at least -march=x86-64-v2 (WIOLA_MARCH): no one-lane fallback is compiled"
#endif

HWY_BEFORE_NAMESPACE();
namespace wiola::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DH = hn::Half<DF>;                // the halves of a float vector ...
using DD = hn::Repartition<double, DF>;  // ... that PromoteTo widens to double
using VD = hn::Vec<DD>;

// ---- loops: whole vectors, then one partial vector -------------------------
// The partial vector is copied into a padded buffer, computed with the same
// code and copied back, so an element's result never depends on its position
// (nor, hence, on how a range was split among threads), and no load reaches
// past the end of an array.
struct Full {};
struct Part {
  size_t n;  // valid lanes, 0 < n < Lanes
};

template <class D, class T = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> In(D d, const T* p, Full, T = T(0)) {
  return hn::LoadU(d, p);
}
template <class D, class T = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> In(D d, const T* p, Part t, T pad = T(0)) {
  HWY_ALIGN T buf[HWY_MAX_BYTES / sizeof(T)];
  for (size_t i = 0; i < hn::Lanes(d); ++i) buf[i] = pad;
  std::memcpy(buf, p, t.n * sizeof(T));
  return hn::Load(d, buf);
}
template <class D, class T = hn::TFromD<D>>
HWY_INLINE void Out(D d, hn::Vec<D> v, T* p, Full) {
  hn::StoreU(v, d, p);
}
template <class D, class T = hn::TFromD<D>>
HWY_INLINE void Out(D d, hn::Vec<D> v, T* p, Part t) {
  HWY_ALIGN T buf[HWY_MAX_BYTES / sizeof(T)];
  hn::Store(v, d, buf);
  std::memcpy(p, buf, t.n * sizeof(T));
}

// body(i, Full()) for each whole vector at i, then body(i, Part{..}) once.
template <class D, class Body>
HWY_INLINE void ForEach(D d, size_t n, const Body& body) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) body(i, Full());
  if (i < n) body(i, Part{n - i});
}

// The last partial vector of a row that has room up to the next whole vector:
// loaded and stored in place, the lanes past the row's end masked (loads give
// `pad`, stores write 0). Lane for lane the same values as Part, without the
// copies through a buffer.
template <class M>
struct Masked {
  M m;
};
template <class D, class M, class T = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> In(D d, const T* p, Masked<M> t, T pad = T(0)) {
  return hn::IfThenElse(t.m, hn::LoadU(d, p), hn::Set(d, pad));
}
template <class D, class M, class T = hn::TFromD<D>>
HWY_INLINE void Out(D d, hn::Vec<D> v, T* p, Masked<M> t) {
  hn::StoreU(hn::IfThenElseZero(t.m, v), d, p);
}

// ForEach over such a row: reads and writes whole vectors up to the next
// multiple of Lanes(d) past n.
template <class D, class Body>
HWY_INLINE void ForEachPadded(D d, size_t n, const Body& body) {
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) body(i, Full());
  if (i < n) body(i, Masked<hn::Mask<D>>{hn::FirstN(d, n - i)});
}

// ForEach, or ForEachPadded where the caller promises the room.
template <bool kPadded, class D, class Body>
HWY_INLINE void ForEachRow(D d, size_t n, const Body& body) {
  if constexpr (kPadded)
    ForEachPadded(d, n, body);
  else
    ForEach(d, n, body);
}

// ---- double accumulation of float vectors -----------------------------------
HWY_INLINE VD PromoteLo(VF v) { return hn::PromoteTo(DD(), hn::LowerHalf(DH(), v)); }
HWY_INLINE VD PromoteHi(VF v) { return hn::PromoteTo(DD(), hn::UpperHalf(DH(), v)); }

// lo/hi += the two halves of v, in double.
HWY_INLINE void AddWide(VF v, VD& lo, VD& hi) {
  lo = hn::Add(lo, PromoteLo(v));
  hi = hn::Add(hi, PromoteHi(v));
}

// p[0..n) += v[0..n) in double (p is a double array, n <= Lanes(DF)); the
// scalar tail adds exactly as the vector lanes do.
template <class Tail>
HWY_INLINE void AddWideTo(double* p, VF v, Tail t) {
  if constexpr (std::is_same_v<Tail, Full>) {
    const DD dd;
    const size_t h = hn::Lanes(dd);
    hn::StoreU(hn::Add(hn::LoadU(dd, p), PromoteLo(v)), dd, p);
    hn::StoreU(hn::Add(hn::LoadU(dd, p + h), PromoteHi(v)), dd, p + h);
  } else {
    HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)];
    hn::Store(v, DF(), buf);
    for (size_t i = 0; i < t.n; ++i) p[i] += double(buf[i]);
  }
}

HWY_INLINE double SumLanes(VD v) { return hn::GetLane(hn::SumOfLanes(DD(), v)); }

// ---- math: the formulas of common.h, lane by lane ---------------------------
// Clamp x to [lo, hi]. x86 min/max return their second operand when one is
// NaN, so NaN passes through as it does through std::min/std::max.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Clamp(D d, V x, float lo, float hi) {
  return hn::Min(hn::Set(d, hi), hn::Max(hn::Set(d, lo), x));
}

// exp_poly: n = round(x / ln 2), r = x - n ln 2 (two parts), a degree-7
// polynomial, times 2^n. 0 below -87 (-inf included), +inf above 88, NaN
// stays NaN.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Exp(D d, V x) {
  const hn::RebindToSigned<D> di;
  const V xc = Clamp(d, x, -87.0f, 88.0f);
  const V shift = hn::Set(d, 12582912.0f);  // 1.5 * 2^23: rounds to an integer
  const V n = hn::Sub(hn::MulAdd(xc, hn::Set(d, 1.44269504088896341f), shift), shift);
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693145751953125f), xc);
  r = hn::NegMulAdd(n, hn::Set(d, 1.428606765330187e-06f), r);
  V p = hn::Set(d, 1.0f / 5040.0f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f / 720.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f / 120.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f / 24.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f / 6.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  const V scale =
      hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127))));
  const V y = hn::Mul(p, scale);
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.0f)),
                            hn::IfThenElse(hn::Gt(x, hn::Set(d, 88.0f)), hn::Inf(d), y));
}

// erf_poly: Eigen/XLA's rational approximation on [-4, 4].
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Erf(D d, V a) {
  const V x = Clamp(d, a, -4.0f, 4.0f);
  const V x2 = hn::Mul(x, x);
  V p = hn::Set(d, -2.72614225801306e-10f);
  p = hn::MulAdd(p, x2, hn::Set(d, 2.77068142495902e-08f));
  p = hn::MulAdd(p, x2, hn::Set(d, -2.10102402082508e-06f));
  p = hn::MulAdd(p, x2, hn::Set(d, -5.69250639462346e-05f));
  p = hn::MulAdd(p, x2, hn::Set(d, -7.34990630326855e-04f));
  p = hn::MulAdd(p, x2, hn::Set(d, -2.95459980854025e-03f));
  p = hn::MulAdd(p, x2, hn::Set(d, -1.60960333262415e-02f));
  V q = hn::Set(d, -1.45660718464996e-05f);
  q = hn::MulAdd(q, x2, hn::Set(d, -2.13374055278905e-04f));
  q = hn::MulAdd(q, x2, hn::Set(d, -1.68282697438203e-03f));
  q = hn::MulAdd(q, x2, hn::Set(d, -7.37332916720468e-03f));
  q = hn::MulAdd(q, x2, hn::Set(d, -1.42647390514189e-02f));
  return hn::Div(hn::Mul(x, p), q);
}

// sigmoid2: sigma(x) and 1 - sigma(x) from one exp(-|x|) (no overflow, and
// 1 - sigma keeps its relative precision for large x).
template <class D, class V = hn::Vec<D>>
HWY_INLINE void Sigmoid2(D d, V x, V& s, V& one_minus_s) {
  const V e = Exp(d, hn::Neg(hn::Abs(x)));
  const V inv = hn::Div(hn::Set(d, 1.0f), hn::Add(hn::Set(d, 1.0f), e));
  const V einv = hn::Mul(e, inv);
  const auto pos = hn::Ge(x, hn::Zero(d));
  s = hn::IfThenElse(pos, inv, einv);
  one_minus_s = hn::IfThenElse(pos, einv, inv);
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE V Sigmoid(D d, V x) {
  V s, c;
  Sigmoid2(d, x, s, c);
  return s;
}

}  // namespace wiola::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggled include guard
