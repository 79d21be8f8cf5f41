// The model's TP hook (model/collectives.h) implemented over the data-plane
// communicator of the TP group, so the model sees only TpCollectives and
// never the communicator.
#pragma once

#include <memory>

#include "dist/comm.h"
#include "model/collectives.h"

namespace wiola::dist {

class CommTpCollectives final : public TpCollectives {
 public:
  explicit CommTpCollectives(Comm& tp_data) : tp_(tp_data) {}
  void all_reduce_sum(Ptr x, size_t n) override {
    tp_.all_reduce(x.raw(), x.raw(), n, x.dtype(), ReduceOp::Sum);
  }
  TpInFlight start_sum(Ptr x, size_t n) override {
    auto r = std::make_shared<Request>(tp_.iall_reduce(x.raw(), x.raw(), n, x.dtype(), ReduceOp::Sum));
    return TpInFlight([r] { r->wait(); });
  }
  void all_reduce_max(Ptr x, size_t n) override {
    tp_.all_reduce(x.raw(), x.raw(), n, x.dtype(), ReduceOp::Max);
  }
  void all_reduce_sum(double* x, size_t n) override {
    tp_.all_reduce(x, x, n, DType::F64, ReduceOp::Sum);
  }

 private:
  Comm& tp_;
};

}  // namespace wiola::dist
