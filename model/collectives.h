// What the model needs from tensor parallelism: sums and maxima over the TP
// group at the points where row-parallel outputs or column-parallel input
// gradients meet (docs/model.md §5). The buffers are backend memory: this is
// the data plane, which `dist/` implements over MPI (host memory, or staged
// through the host) or NCCL; the model never knows which. nullptr means one
// TP rank (no communication).
#pragma once

#include <cstddef>
#include <functional>
#include <utility>

#include "kernels/ptr.h"

namespace wiola {

// A TP sum in flight: its buffer may be read only after finish() (the
// destructor finishes too). A layer starts a reduction, computes what does
// not depend on it, then finishes it, so the communication hides behind
// that work where the data plane runs on its own (NCCL streams).
class TpInFlight {
 public:
  TpInFlight() = default;
  explicit TpInFlight(std::function<void()> finish) : finish_(std::move(finish)) {}
  TpInFlight(TpInFlight&& o) noexcept : finish_(std::exchange(o.finish_, nullptr)) {}
  TpInFlight& operator=(TpInFlight&&) = delete;
  TpInFlight(const TpInFlight&) = delete;
  TpInFlight& operator=(const TpInFlight&) = delete;
  ~TpInFlight() { finish(); }
  void finish() {
    if (auto f = std::exchange(finish_, nullptr)) f();
  }

 private:
  std::function<void()> finish_;
};

class TpCollectives {
 public:
  virtual ~TpCollectives() = default;
  virtual void all_reduce_sum(Ptr x, size_t n) = 0;
  // Starts the sum of x over the group; the default finishes at once.
  virtual TpInFlight start_sum(Ptr x, size_t n) {
    all_reduce_sum(x, n);
    return {};
  }
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
inline TpInFlight tp_start_sum(TpCollectives* tp, Ptr x, size_t n) {
  return tp ? tp->start_sum(x, n) : TpInFlight{};
}
inline void tp_max(TpCollectives* tp, Ptr x, size_t n) {
  if (tp) tp->all_reduce_max(x, n);
}

}  // namespace wiola
