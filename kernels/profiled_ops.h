// ProfiledOps: any backend behind the op interface, with the time of each op
// measured in the backend's own order of execution (Ops::make_timeline: the
// host clock on the CPU, events on a GPU stream) and summed per op and per op
// class. Benchmarks put it between the model and the backend:
//
//   auto cuda = make_cuda_ops(...);
//   ProfiledOps<float> ops(*cuda);      // the model and optimizer use `ops`
//   ops.enable(true); <one step>; OpProfile p = ops.profile();
//
// While disabled it only forwards (a few virtual calls more per op). Enabled, it
// takes two marks per op: on a GPU those are two event records per launch,
// so a profiled step is measured apart from the timed ones. Time between ops
// (host work, launch gaps, waits for other streams) belongs to no op; the
// caller compares the profile's total with the step's wall time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/forwarding_ops.h"

namespace wiola {

struct OpTime {
  std::string name;
  double seconds = 0;
  long calls = 0;
};

struct OpProfile {
  std::vector<OpTime> ops;                             // by op, costliest first
  std::vector<OpTime> classes;                         // by op class (gemm, attention, ...), costliest first
  double seconds = 0;                                  // inside ops, all together
  double class_seconds(const std::string& cls) const;  // 0 if absent
};

// A table of the classes' time per step, each with its share of `wall_s`
// (the profiled steps' wall time, `steps` of them), the rest as "between
// ops"; lines start with `indent`.
std::string format_op_profile(const OpProfile& p, double wall_s, int steps, const std::string& indent);

// The class an op is reported under ("gemm", "attention", "norm", ...: its
// entry in kernels/op_list.h); the op names are the Ops member functions'.
// Throws wiola::Error for a name that is no op.
const char* op_class_of(const std::string& op);

template <class T>
class ProfiledOps final : public ForwardingOps<T> {
 public:
  explicit ProfiledOps(Ops<T>& inner);
  ~ProfiledOps() override;
  void enable(bool on) { on_ = on; }
  bool enabled() const { return on_; }
  // Synchronises the backend, then sums every op timed since the last reset.
  OpProfile profile();
  void reset();
  // While enabled, body runs op by op (each op timed; a graph would hide
  // them), else as the inner backend runs graphs.
  void graph(const GraphKey& key, const std::function<void()>& body) override {
    if (on_) body();
    else ForwardingOps<T>::graph(key, body);
  }

 protected:
  void op_begin(OpId op) override;
  void op_end(OpId op) noexcept override;

 private:
  struct Span {
    OpId op;
    int from, to;
  };
  std::unique_ptr<OpTimeline> timeline_;
  std::vector<Span> spans_;
  int from_ = -1;  // the open op's first mark while enabled, else -1
  bool on_ = false;
};

extern template class ProfiledOps<float>;
extern template class ProfiledOps<double>;

}  // namespace wiola
