// WiolaRMSNorm (docs/model.md §2): z = x + delta; y = gamma * z * rstd,
// rstd = 1 / sqrt(mean(z^2) + eps). Backward per row:
//   dz = rstd * (gamma*dy - z * rstd^2 * mean(gamma*dy*z)),
//   dgamma += sum_n dy*z*rstd, ddelta += sum_n dz, dx = dres + dz
//   (dres null: dx = dz).
// add_rmsnorm_fwd first adds the residual branch: x = a + b, written out.
// float: Highway, dispatched at run time (row sums in double); double: the
// scalar templates.
#include <cstddef>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/norm.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace wiola::cpu::HWY_NAMESPACE {

// sum_j (double(x_j) + double(delta_j))^2 of one row.
double RowSumSqF(const float* x, const float* delta, size_t d) {
  const DF df;
  VD lo = hn::Zero(DD()), hi = lo;
  ForEach(df, d, [&](size_t j, auto t) HWY_ATTR {
    const VF xv = In(df, x + j, t), dv = In(df, delta + j, t);
    const VD a = hn::Add(PromoteLo(xv), PromoteLo(dv)), b = hn::Add(PromoteHi(xv), PromoteHi(dv));
    lo = hn::MulAdd(a, a, lo);
    hi = hn::MulAdd(b, b, hi);
  });
  return SumLanes(hn::Add(lo, hi));
}

// s = a + b of one row (s may be a or b), then RowSumSqF(s, delta): the same
// vectors, so the same bits as an add followed by the norm.
double AddRowSumSqF(const float* a, const float* b, float* s, const float* delta, size_t d) {
  const DF df;
  VD lo = hn::Zero(DD()), hi = lo;
  ForEach(df, d, [&](size_t j, auto t) HWY_ATTR {
    const VF xv = hn::Add(In(df, a + j, t), In(df, b + j, t)), dv = In(df, delta + j, t);
    Out(df, xv, s + j, t);
    const VD p = hn::Add(PromoteLo(xv), PromoteLo(dv)), q = hn::Add(PromoteHi(xv), PromoteHi(dv));
    lo = hn::MulAdd(p, p, lo);
    hi = hn::MulAdd(q, q, hi);
  });
  return SumLanes(hn::Add(lo, hi));
}

// y = gamma * ((x + delta) * r) of one row.
void RowScaleF(const float* x, const float* gamma, const float* delta, float r, size_t d,
               float* y) {
  const DF df;
  const VF vr = hn::Set(df, r);
  ForEach(df, d, [&](size_t j, auto t) HWY_ATTR {
    const VF z = hn::Add(In(df, x + j, t), In(df, delta + j, t));
    Out(df, hn::Mul(In(df, gamma + j, t), hn::Mul(z, vr)), y + j, t);
  });
}

// Rows [i0, i1) of the backward; parameter gradients into this thread's
// double partials pg (gamma) and pd (delta).
void BwdRowsF(const float* x, const float* gamma, const float* delta, const float* rstd,
              const float* dy, int i0, int i1, size_t d, const float* dres, float* dx,
              double* pg, double* pd) {
  const DF df;
  for (int i = i0; i < i1; ++i) {
    const float* xi = x + size_t(i) * d;
    const float* gi = dy + size_t(i) * d;
    const float* ri = dres ? dres + size_t(i) * d : nullptr;
    float* dxi = dx + size_t(i) * d;
    // c = sum_j double(gamma*dy) * double(x + delta)
    VD lo = hn::Zero(DD()), hi = lo;
    ForEach(df, d, [&](size_t j, auto t) HWY_ATTR {
      const VF gd = hn::Mul(In(df, gamma + j, t), In(df, gi + j, t));
      const VF z = hn::Add(In(df, xi + j, t), In(df, delta + j, t));
      lo = hn::MulAdd(PromoteLo(gd), PromoteLo(z), lo);
      hi = hn::MulAdd(PromoteHi(gd), PromoteHi(z), hi);
    });
    const double c = SumLanes(hn::Add(lo, hi));
    const double r = double(rstd[i]);
    const VF cr = hn::Set(df, float(c * r * r / double(d)));
    const VF rt = hn::Set(df, float(r));
    ForEach(df, d, [&](size_t j, auto t) HWY_ATTR {
      const VF g = In(df, gi + j, t);
      const VF z = hn::Add(In(df, xi + j, t), In(df, delta + j, t));
      const VF dz = hn::Mul(rt, hn::Sub(hn::Mul(In(df, gamma + j, t), g), hn::Mul(z, cr)));
      Out(df, ri ? hn::Add(In(df, ri + j, t), dz) : dz, dxi + j, t);
      AddWideTo(pg + j, hn::Mul(hn::Mul(g, z), rt), t);
      AddWideTo(pd + j, dz, t);
    });
  }
}

}  // namespace wiola::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd_dispatch.h"

namespace wiola::cpu {

HWY_EXPORT(RowSumSqF);
HWY_EXPORT(AddRowSumSqF);
HWY_EXPORT(RowScaleF);
HWY_EXPORT(BwdRowsF);

// The norm of rows x (b null) or of s = a + b (a in x), row by row: the sum
// is written and normed while its row is in cache.
template <class T>
void rmsnorm_rows(const T* x, const T* b, T* s, const T* gamma, const T* delta, int N, int d,
                  double eps, T* y, T* rstd) {
#pragma omp parallel for schedule(static) if (size_t(N) * d >= kParallelMin)
  for (int i = 0; i < N; ++i) {
    const size_t o = size_t(i) * d;
    const T* xi = x + o;
    if (b) {
#pragma omp simd
      for (int j = 0; j < d; ++j) s[o + j] = x[o + j] + b[o + j];
      xi = s + o;
    }
    T* yi = y + o;
    const double ss = lane_sum(0, size_t(d), [xi, delta](size_t j) {
      const double z = double(xi[j]) + double(delta[j]);
      return z * z;
    });
    const T r = T(1.0 / std::sqrt(ss / d + eps));
    rstd[i] = r;
#pragma omp simd
    for (int j = 0; j < d; ++j) yi[j] = gamma[j] * ((xi[j] + delta[j]) * r);
  }
}
template <>
void rmsnorm_rows<float>(const float* x, const float* b, float* s, const float* gamma,
                         const float* delta, int N, int d, double eps, float* y, float* rstd) {
  const auto sumsq = WIOLA_DISPATCH(RowSumSqF);
  const auto add_sumsq = WIOLA_DISPATCH(AddRowSumSqF);
  const auto apply = WIOLA_DISPATCH(RowScaleF);
#pragma omp parallel for schedule(static) if (size_t(N) * d >= kParallelMin)
  for (int i = 0; i < N; ++i) {
    const size_t o = size_t(i) * d;
    const double ss = b ? add_sumsq(x + o, b + o, s + o, delta, size_t(d))
                        : sumsq(x + o, delta, size_t(d));
    const float r = float(1.0 / std::sqrt(ss / d + eps));
    rstd[i] = r;
    apply((b ? s : x) + o, gamma, delta, r, size_t(d), y + o);
  }
}

template <class T>
void rmsnorm_fwd(const T* x, const T* gamma, const T* delta, int N, int d,
                 double eps, T* y, T* rstd) {
  rmsnorm_rows<T>(x, nullptr, nullptr, gamma, delta, N, d, eps, y, rstd);
}
template <class T>
void add_rmsnorm_fwd(const T* a, const T* b, T* s, const T* gamma, const T* delta, int N,
                     int d, double eps, T* y, T* rstd) {
  rmsnorm_rows<T>(a, b, s, gamma, delta, N, d, eps, y, rstd);
}

// Parameter gradients: each thread sums its rows (rows(i0, i1, pg, pd)) into
// its own double partials; partials are added in thread order (deterministic
// for a fixed thread count).
template <class T, class Rows>
void rmsnorm_bwd_partials(int N, int d, T* dgamma, T* ddelta, Rows rows) {
  const bool par = size_t(N) * d >= kParallelMin;
  const int nt = par ? omp_get_max_threads() : 1;
  std::vector<double> part(size_t(nt) * 2 * d, 0.0);
  int used = 1;
#pragma omp parallel num_threads(nt) if (par)
  {
    const int tid = omp_get_thread_num(), n_threads = omp_get_num_threads();
#pragma omp single
    used = n_threads;
    double* pg = part.data() + size_t(tid) * 2 * d;
    rows(int(part_begin(size_t(N), tid, n_threads)), int(part_begin(size_t(N), tid + 1, n_threads)),
         pg, pg + d);
  }
  for (int j = 0; j < d; ++j) {
    double g = 0, dd = 0;
    for (int t = 0; t < used; ++t) {
      g += part[size_t(t) * 2 * d + j];
      dd += part[size_t(t) * 2 * d + d + j];
    }
    dgamma[j] += T(g);
    ddelta[j] += T(dd);
  }
}

template <class T>
void rmsnorm_bwd(const T* x, const T* gamma, const T* delta, const T* rstd,
                 const T* dy, int N, int d, const T* dres, T* dx, T* dgamma, T* ddelta) {
  rmsnorm_bwd_partials(N, d, dgamma, ddelta, [&](int i0, int i1, double* pg, double* pd) {
    for (int i = i0; i < i1; ++i) {
      const T* xi = x + size_t(i) * d;
      const T* gi = dy + size_t(i) * d;
      const T* ri = dres ? dres + size_t(i) * d : nullptr;
      T* dxi = dx + size_t(i) * d;
      const double r = double(rstd[i]);
      const double c = lane_sum(0, size_t(d), [=](size_t j) {
        return double(gamma[j] * gi[j]) * double(xi[j] + delta[j]);
      });
      const T cr = T(c * r * r / d);
      const T rt = T(r);
#pragma omp simd
      for (int j = 0; j < d; ++j) {
        const T z = xi[j] + delta[j];
        const T dz = rt * (gamma[j] * gi[j] - z * cr);
        dxi[j] = ri ? ri[j] + dz : dz;
        pg[j] += double(gi[j] * z * rt);
        pd[j] += double(dz);
      }
    }
  });
}
template <>
void rmsnorm_bwd<float>(const float* x, const float* gamma, const float* delta,
                        const float* rstd, const float* dy, int N, int d, const float* dres,
                        float* dx, float* dgamma, float* ddelta) {
  const auto fn = WIOLA_DISPATCH(BwdRowsF);
  rmsnorm_bwd_partials(N, d, dgamma, ddelta, [&](int i0, int i1, double* pg, double* pd) {
    fn(x, gamma, delta, rstd, dy, i0, i1, size_t(d), dres, dx, pg, pd);
  });
}

template void rmsnorm_fwd<float>(const float*, const float*, const float*, int, int, double,
                                 float*, float*);
template void rmsnorm_fwd<double>(const double*, const double*, const double*, int, int, double,
                                  double*, double*);
template void add_rmsnorm_fwd<float>(const float*, const float*, float*, const float*,
                                     const float*, int, int, double, float*, float*);
template void add_rmsnorm_fwd<double>(const double*, const double*, double*, const double*,
                                      const double*, int, int, double, double*, double*);
template void rmsnorm_bwd<double>(const double*, const double*, const double*, const double*,
                                  const double*, int, int, const double*, double*, double*,
                                  double*);

}  // namespace wiola::cpu
#endif  // HWY_ONCE
