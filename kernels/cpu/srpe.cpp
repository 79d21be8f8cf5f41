// SRPE (docs/model.md §2): rotate-half pairs (j, j + dh/2) of every head by the
// per-position (c, s) of the table; the inverse uses (c, -s) (the transpose,
// = the backward pass).
#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"

namespace wiola::cpu {

template <class T>
void srpe_apply(T* x, int B, int Tn, int nh, int dh, const T* table,
                bool inverse) {
  const int half = dh / 2;
  const T sign = inverse ? T(-1) : T(1);
  const long rows = long(B) * Tn;
#pragma omp parallel for schedule(static) if (size_t(rows) * nh * dh >= kParallelMin)
  for (long r = 0; r < rows; ++r) {
    const T* tab = table + size_t(r % Tn) * size_t(dh);
    for (int h = 0; h < nh; ++h) {
      T* lo = x + (size_t(r) * nh + h) * dh;
      T* hi = lo + half;
#pragma omp simd
      for (int j = 0; j < half; ++j) {
        const T c = tab[2 * j], s = sign * tab[2 * j + 1];
        const T a = lo[j], b = hi[j];
        lo[j] = a * c - b * s;
        hi[j] = a * s + b * c;
      }
    }
  }
}

template void srpe_apply<float>(float*, int, int, int, int, const float*, bool);
template void srpe_apply<double>(double*, int, int, int, int, const double*,
                                 bool);

}  // namespace wiola::cpu
