// WiolaRMSNorm (docs/model.md §2): z = x + delta; y = gamma * z * rstd,
// rstd = 1 / sqrt(mean(z^2) + eps). Backward per row:
//   dz = rstd * (gamma*dy - z * rstd^2 * mean(gamma*dy*z)),
//   dgamma += sum_n dy*z*rstd, ddelta += sum_n dz, dx += dz.
#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"

namespace wiola::cpu {

template <class T>
void rmsnorm_fwd(const T* x, const T* gamma, const T* delta, int N, int d,
                 double eps, T* y, T* rstd) {
#pragma omp parallel for schedule(static) if (size_t(N) * d >= kParallelMin)
  for (int i = 0; i < N; ++i) {
    const T* xi = x + size_t(i) * d;
    T* yi = y + size_t(i) * d;
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

// Parameter gradients: each thread sums its rows into its own double
// partials; partials are added in thread order (deterministic for a fixed
// thread count).
template <class T>
void rmsnorm_bwd(const T* x, const T* gamma, const T* delta, const T* rstd,
                 const T* dy, int N, int d, T* dx, T* dgamma, T* ddelta) {
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
    double* pd = pg + d;
    const int i0 = int(part_begin(size_t(N), tid, n_threads));
    const int i1 = int(part_begin(size_t(N), tid + 1, n_threads));
    for (int i = i0; i < i1; ++i) {
      const T* xi = x + size_t(i) * d;
      const T* gi = dy + size_t(i) * d;
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
        dxi[j] += dz;
        pg[j] += double(gi[j] * z * rt);
        pd[j] += double(dz);
      }
    }
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

#define WIOLA_INST(T)                                                      \
  template void rmsnorm_fwd<T>(const T*, const T*, const T*, int, int,     \
                               double, T*, T*);                            \
  template void rmsnorm_bwd<T>(const T*, const T*, const T*, const T*,     \
                               const T*, int, int, T*, T*, T*);
WIOLA_INST(float)
WIOLA_INST(double)
#undef WIOLA_INST

}  // namespace wiola::cpu
