#include <cblas.h>
#include <omp.h>

#include "kernels/ops.h"

namespace wiola {

void set_cpu_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int cpu_threads() { return omp_get_max_threads(); }

}  // namespace wiola
