// What the model needs from tensor parallelism: sums and maxima over the TP
// group at the points where row-parallel outputs or column-parallel input
// gradients meet (docs/model.md §5). The buffers are backend memory: this is
// the data plane, which `dist/` implements over MPI (host memory, or staged
// through the host) or NCCL; the model never knows which. nullptr means one
// TP rank (no communication).
#pragma once

#include <cstddef>

#include "kernels/ptr.h"

namespace wiola {

class TpCollectives {
 public:
  virtual ~TpCollectives() = default;
  virtual void all_reduce_sum(Ptr x, size_t n) = 0;
  virtual void all_reduce_max(Ptr x, size_t n) = 0;
  // Backend doubles (the TP-partial dL/dφ of a layer).
  virtual void all_reduce_sum(double* x, size_t n) = 0;
};

inline void tp_sum(TpCollectives* tp, Ptr x, size_t n) {
  if (tp) tp->all_reduce_sum(x, n);
}
inline void tp_sum(TpCollectives* tp, double* x, size_t n) {
  if (tp) tp->all_reduce_sum(x, n);
}
inline void tp_max(TpCollectives* tp, Ptr x, size_t n) {
  if (tp) tp->all_reduce_max(x, n);
}

}  // namespace wiola
