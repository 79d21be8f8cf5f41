// Vocab-parallel embedding and cross-entropy (ops.h "embedding",
// "cross-entropy"): this rank holds vocabulary rows/columns [v0, v0+V_local).
// The float cross-entropy rows run on Highway, dispatched at run time (exp in
// float, sums in double); embeddings (copies) and double are scalar.
#include <cstddef>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/vocab.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace wiola::cpu::HWY_NAMESPACE {

// sum_j exp(l_j - m) of one row, exp in float, the sum in double.
double SumExpF(const float* l, size_t V, float m) {
  const DF d;
  const VF vm = hn::Set(d, m);
  VD lo = hn::Zero(DD()), hi = lo;
  ForEach(d, V, [&](size_t j, auto t) HWY_ATTR {
    // Padding lanes: exp(-inf) = 0.
    AddWide(Exp(d, hn::Sub(In(d, l + j, t, -std::numeric_limits<float>::infinity()), vm)), lo, hi);
  });
  return SumLanes(hn::Add(lo, hi));
}

// l_j = f exp(l_j - m) of one row.
void GradRowF(float* l, size_t V, float m, float f) {
  const DF d;
  const VF vm = hn::Set(d, m), vf = hn::Set(d, f);
  ForEach(d, V,
          [&](size_t j, auto t) HWY_ATTR { Out(d, hn::Mul(vf, Exp(d, hn::Sub(In(d, l + j, t), vm))), l + j, t); });
}

}  // namespace wiola::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/simd_dispatch.h"

namespace wiola::cpu {

HWY_EXPORT(SumExpF);
HWY_EXPORT(GradRowF);

template <class T>
void embedding_fwd(const int32_t* ids, int N, const T* E, int v0, int V_local, int d, T* out) {
#pragma omp parallel for schedule(static) if (size_t(N) * d >= kParallelMin)
  for (int i = 0; i < N; ++i) {
    const long r = long(ids[i]) - v0;
    T* o = out + size_t(i) * d;
    if (r >= 0 && r < V_local) {
      const T* e = E + size_t(r) * d;
      for (int j = 0; j < d; ++j) o[j] = e[j];
    } else {
      for (int j = 0; j < d; ++j) o[j] = T(0);
    }
  }
}

// Tokens sharing an id add into the same row, so threads split the columns
// and each walks all tokens in order (race-free, deterministic).
template <class T>
void embedding_bwd(const int32_t* ids, int N, const T* dout, int v0, int V_local, int d, T* dE) {
#pragma omp parallel if (size_t(N) * d >= kParallelMin)
  {
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    const int j0 = int(part_begin(size_t(d), tid, nt));
    const int j1 = int(part_begin(size_t(d), tid + 1, nt));
    for (int i = 0; i < N; ++i) {
      const long r = long(ids[i]) - v0;
      if (r < 0 || r >= V_local) continue;
      T* e = dE + size_t(r) * d;
      const T* g = dout + size_t(i) * d;
      for (int j = j0; j < j1; ++j) e[j] += g[j];
    }
  }
}

template <class T>
void ce_row_max(const T* logits, int N, int V_local, T* row_max) {
#pragma omp parallel for schedule(static) if (size_t(N) * V_local >= kParallelMin)
  for (int i = 0; i < N; ++i) {
    const T* l = logits + size_t(i) * V_local;
    T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
    for (int j = 0; j < V_local; ++j) m = std::max(m, l[j]);
    row_max[i] = m;
  }
}
template <>
void ce_row_max<float>(const float* logits, int N, int V_local, float* row_max) {
  simd_init();  // may throw: not inside the parallel region
#pragma omp parallel for schedule(static) if (size_t(N) * V_local >= kParallelMin)
  for (int i = 0; i < N; ++i) row_max[i] = simd_row_max(logits + size_t(i) * V_local, V_local);
}

template <class T>
void ce_sumexp_target(const T* logits, const int32_t* targets, int N, int V_local, int v0, const T* row_max, T* sumexp,
                      T* tgt) {
#pragma omp parallel for schedule(static) if (size_t(N) * V_local >= kParallelMin)
  for (int i = 0; i < N; ++i) {
    const T* l = logits + size_t(i) * V_local;
    const T m = row_max[i];
    sumexp[i] = T(lane_sum(0, size_t(V_local), [l, m](size_t j) { return double(texp(l[j] - m)); }));
    const long c = long(targets[i]) - v0;
    tgt[i] = (c >= 0 && c < V_local) ? l[c] : T(0);
  }
}
template <>
void ce_sumexp_target<float>(const float* logits, const int32_t* targets, int N, int V_local, int v0,
                             const float* row_max, float* sumexp, float* tgt) {
  const auto fn = WIOLA_DISPATCH(SumExpF);
#pragma omp parallel for schedule(static) if (size_t(N) * V_local >= kParallelMin)
  for (int i = 0; i < N; ++i) {
    const float* l = logits + size_t(i) * V_local;
    sumexp[i] = float(fn(l, size_t(V_local), row_max[i]));
    const long c = long(targets[i]) - v0;
    tgt[i] = (c >= 0 && c < V_local) ? l[c] : 0.0f;
  }
}

// Phase 3 of the training cross-entropy, with z-loss where zloss is set:
// each counted row's CE (and z lse^2), and its logits made the gradient
// scale * ((1 + 2 z lse) softmax - onehot). Without z-loss the factor is
// scale / sumexp, computed as it always was (the default path's bits).
template <class T, class Row>
void ce_grad_rows(T* logits, const int32_t* targets, int N, int V_local, int v0, const T* row_max, const T* sumexp,
                  const T* tgt, double scale, double z, T* loss, T* zloss, Row row) {
#pragma omp parallel for schedule(static) if (size_t(N) * V_local >= kParallelMin)
  for (int i = 0; i < N; ++i) {
    T* l = logits + size_t(i) * V_local;
    if (targets[i] < 0) {  // masked (documents): no loss, no gradient
      loss[i] = T(0);
      if (zloss) zloss[i] = T(0);
      std::fill_n(l, V_local, T(0));
      continue;
    }
    const double lg = std::log(double(sumexp[i]));
    loss[i] = T(lg + double(row_max[i]) - double(tgt[i]));
    double f = scale / double(sumexp[i]);
    if (zloss) {
      const double lse = lg + double(row_max[i]);
      zloss[i] = T(z * lse * lse);
      f = scale * (1.0 + 2.0 * z * lse) / double(sumexp[i]);
    }
    row(l, V_local, row_max[i], T(f));
    const long c = long(targets[i]) - v0;
    if (c >= 0 && c < V_local) l[c] -= T(scale);
  }
}

// l_j = f exp(l_j - m) of one row: Highway for float, scalar otherwise.
template <class T>
auto grad_row() {
  return [](T* l, int V, T m, T f) {
#pragma omp simd
    for (int j = 0; j < V; ++j) l[j] = f * texp(l[j] - m);
  };
}
template <>
auto grad_row<float>() {
  const auto fn = WIOLA_DISPATCH(GradRowF);
  return [fn](float* l, int V, float m, float f) { fn(l, size_t(V), m, f); };
}

template <class T>
void ce_loss_grad(T* logits, const int32_t* targets, int N, int V_local, int v0, const T* row_max, const T* sumexp,
                  const T* tgt, double scale, T* loss) {
  ce_grad_rows<T>(logits, targets, N, V_local, v0, row_max, sumexp, tgt, scale, 0.0, loss, nullptr, grad_row<T>());
}

template <class T>
void ce_loss_grad_z(T* logits, const int32_t* targets, int N, int V_local, int v0, const T* row_max, const T* sumexp,
                    const T* tgt, double scale, double z, T* loss, T* zloss) {
  ce_grad_rows<T>(logits, targets, N, V_local, v0, row_max, sumexp, tgt, scale, z, loss, zloss, grad_row<T>());
}

template <class T>
void ce_loss(const T* logits, const int32_t* targets, int N, int V_local, int v0, const T* row_max, const T* sumexp,
             const T* tgt, T* loss) {
  for (int i = 0; i < N; ++i)
    loss[i] = targets[i] < 0 ? T(0)  // masked (documents)
                             : T(std::log(double(sumexp[i])) + double(row_max[i]) - double(tgt[i]));
}

#define WIOLA_INST(T) \
  template void embedding_fwd<T>(const int32_t*, int, const T*, int, int, int, T*); \
  template void embedding_bwd<T>(const int32_t*, int, const T*, int, int, int, T*); \
  template void ce_loss<T>(const T*, const int32_t*, int, int, int, const T*, const T*, const T*, T*); \
  template void ce_loss_grad<T>(T*, const int32_t*, int, int, int, const T*, const T*, const T*, double, T*); \
  template void ce_loss_grad_z<T>(T*, const int32_t*, int, int, int, const T*, const T*, const T*, double, double, T*, \
                                  T*);
WIOLA_INST(float)
WIOLA_INST(double)
#undef WIOLA_INST
template void ce_row_max<double>(const double*, int, int, double*);
template void ce_sumexp_target<double>(const double*, const int32_t*, int, int, int, const double*, double*, double*);

}  // namespace wiola::cpu
#endif  // HWY_ONCE
