// Vocab-parallel embedding and cross-entropy (ops.h "embedding",
// "cross-entropy"): this rank holds vocabulary rows/columns [v0, v0+V_local).
#include <limits>

#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"

namespace wiola::cpu {

template <class T>
void embedding_fwd(const int32_t* ids, int N, const T* E, int v0, int V_local,
                   int d, T* out) {
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
void embedding_bwd(const int32_t* ids, int N, const T* dout, int v0,
                   int V_local, int d, T* dE) {
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

template <class T>
void ce_sumexp_target(const T* logits, const int32_t* targets, int N,
                      int V_local, int v0, const T* row_max, T* sumexp,
                      T* tgt) {
#pragma omp parallel for schedule(static) if (size_t(N) * V_local >= kParallelMin)
  for (int i = 0; i < N; ++i) {
    const T* l = logits + size_t(i) * V_local;
    const T m = row_max[i];
    sumexp[i] = T(lane_sum(0, size_t(V_local), [l, m](size_t j) {
      return double(texp(l[j] - m));
    }));
    const long c = long(targets[i]) - v0;
    tgt[i] = (c >= 0 && c < V_local) ? l[c] : T(0);
  }
}

template <class T>
void ce_loss_grad(T* logits, const int32_t* targets, int N, int V_local,
                  int v0, const T* row_max, const T* sumexp, const T* tgt,
                  double scale, T* loss) {
#pragma omp parallel for schedule(static) if (size_t(N) * V_local >= kParallelMin)
  for (int i = 0; i < N; ++i) {
    T* l = logits + size_t(i) * V_local;
    const T m = row_max[i];
    loss[i] = T(std::log(double(sumexp[i])) + double(m) - double(tgt[i]));
    const T f = T(scale / double(sumexp[i]));
#pragma omp simd
    for (int j = 0; j < V_local; ++j) l[j] = f * texp(l[j] - m);
    const long c = long(targets[i]) - v0;
    if (c >= 0 && c < V_local) l[c] -= T(scale);
  }
}

template <class T>
void ce_loss(const T* logits, const int32_t* targets, int N, int V_local,
             int v0, const T* row_max, const T* sumexp, const T* tgt,
             T* loss) {
  for (int i = 0; i < N; ++i)
    loss[i] = T(std::log(double(sumexp[i])) + double(row_max[i]) -
                double(tgt[i]));
}

#define WIOLA_INST(T)                                                        \
  template void embedding_fwd<T>(const int32_t*, int, const T*, int, int,    \
                                 int, T*);                                   \
  template void embedding_bwd<T>(const int32_t*, int, const T*, int, int,    \
                                 int, T*);                                   \
  template void ce_row_max<T>(const T*, int, int, T*);                       \
  template void ce_sumexp_target<T>(const T*, const int32_t*, int, int, int, \
                                    const T*, T*, T*);                       \
  template void ce_loss_grad<T>(T*, const int32_t*, int, int, int, const T*, \
                                const T*, const T*, double, T*);             \
  template void ce_loss<T>(const T*, const int32_t*, int, int, int,          \
                           const T*, const T*, const T*, T*);
WIOLA_INST(float)
WIOLA_INST(double)
#undef WIOLA_INST

}  // namespace wiola::cpu
