#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/blas.h"
#include "kernels/ops.h"

namespace wiola {

void set_cpu_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
  openblas_set_num_threads(1);  // GEMMs are split over OpenMP threads (cpu_ops.cpp)
}

int cpu_threads() { return omp_get_max_threads(); }

double openblas_sgemm_gflops(int n, int reps) {
  // OpenBLAS's own threading on all cpu_threads(), as a user would call it,
  // on the kernels the CPU backend runs.
  cpu::blas_init();
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = float((i * 2654435761u) % 1000) * 1e-3f;
  openblas_set_num_threads(cpu_threads());
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.f, a.data(), n, b.data(), n,
                0.f, c.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  openblas_set_num_threads(1);
  return 2.0 * n * double(n) * n / best / 1e9;
}

}  // namespace wiola
