// What the model needs from tensor parallelism: sums and maxima over the TP
// group at the points where row-parallel outputs or column-parallel input
// gradients meet (SPEC §5). `dist/` implements it over MPI or NCCL; the model
// never knows which. nullptr means one TP rank (no communication).
#pragma once

#include <cstddef>

namespace wiola {

template <class T>
class TpCollectives {
 public:
  virtual ~TpCollectives() = default;
  virtual void all_reduce_sum(T* x, size_t n) = 0;
  virtual void all_reduce_max(T* x, size_t n) = 0;
  // A host scalar summed over the group (the TP-partial dφ).
  virtual double sum_scalar(double x) = 0;
};

template <class T>
inline void tp_sum(TpCollectives<T>* tp, T* x, size_t n) {
  if (tp) tp->all_reduce_sum(x, n);
}
template <class T>
inline double tp_sum_scalar(TpCollectives<T>* tp, double x) {
  return tp ? tp->sum_scalar(x) : x;
}
template <class T>
inline void tp_max(TpCollectives<T>* tp, T* x, size_t n) {
  if (tp) tp->all_reduce_max(x, n);
}

}  // namespace wiola
