// The model's TP hook (model/collectives.h) implemented over a dist::Comm, so
// the model sees only TpCollectives<T> and never the communicator.
#pragma once

#include "dist/comm.h"
#include "model/collectives.h"

namespace wiola::dist {

template <class T>
class CommTpCollectives final : public TpCollectives<T> {
 public:
  explicit CommTpCollectives(Comm& tp) : tp_(tp) {}
  void all_reduce_sum(T* x, size_t n) override {
    tp_.all_reduce(x, x, n, dtype_of<T>(), ReduceOp::Sum);
  }
  void all_reduce_max(T* x, size_t n) override {
    tp_.all_reduce(x, x, n, dtype_of<T>(), ReduceOp::Max);
  }
  double sum_scalar(double x) override {
    return tp_.all_reduce_value(x, ReduceOp::Sum);
  }

 private:
  Comm& tp_;
};

}  // namespace wiola::dist
