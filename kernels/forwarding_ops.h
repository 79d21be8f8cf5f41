// ForwardingOps: a backend in front of another that forwards every op to
// it: the base of the wrappers that watch or adapt a backend's ops
// (ProfiledOps times them, kernels/profiled_ops.h; Bf16StorageOps gives the
// CPU kernels the GPU's bf16 storage, kernels/cpu/bf16_storage_ops.h). Two
// hooks: op_begin/op_end around each forwarded op (memory management and the
// backend's properties are forwarded without them), and arg(), through which
// every floating-point buffer argument passes on its way to the inner op.
#pragma once

#include <memory>
#include <string>

#include "kernels/op_info.h"
#include "kernels/ops.h"

namespace wiola {

template <class T>
class ForwardingOps : public Ops<T> {
 public:
  explicit ForwardingOps(Ops<T>& inner) : inner_(inner) {}
  Ops<T>& inner() { return inner_; }

  const char* name() const override { return inner_.name(); }
  void* alloc_bytes(size_t bytes) override { return inner_.alloc_bytes(bytes); }
  void free_bytes(void* p) override { inner_.free_bytes(p); }
  void synchronize() override { inner_.synchronize(); }
  bool host_accessible() const override { return inner_.host_accessible(); }
  std::string device_name() const override { return inner_.device_name(); }
  void* device_stream() const override { return inner_.device_stream(); }
  std::string device_identity() const override { return inner_.device_identity(); }
  size_t peak_bytes() const override { return inner_.peak_bytes(); }
  Precision precision() const override { return inner_.precision(); }
  std::unique_ptr<OpTimeline> make_timeline() override { return inner_.make_timeline(); }
  std::string gemm_tuning() const override { return inner_.gemm_tuning(); }
  void adopt_gemm_tuning(const std::string& table_json) override { inner_.adopt_gemm_tuning(table_json); }
  // body issues this wrapper's ops, which reach the inner backend through it.
  void graph(const GraphKey& key, const std::function<void()>& body) override { inner_.graph(key, body); }
  void forget_graphs(const void* owner) override { inner_.forget_graphs(owner); }

  // Every op of kernels/op_list.h: op_begin, the inner op on arg() of each
  // buffer argument, op_end.
#define WIOLA_OP(name, cls, params, args) void name params override;
#include "kernels/op_list.h"

 protected:
  // Around one forwarded op (kernels/op_info.h names it). op_end also runs
  // when the inner op throws.
  virtual void op_begin(OpId /*op*/) {}
  virtual void op_end(OpId /*op*/) noexcept {}
  // A buffer argument as the inner op receives it; every other argument
  // passes as it is.
  virtual CPtr arg(CPtr p) { return p; }
  virtual Ptr arg(Ptr p) { return p; }
  template <class A>
  static A arg(A a) {
    return a;
  }

  Ops<T>& inner_;

 private:
  // The inner backend's op on arg() of each argument.
  template <class... P, class... A>
  void forward(void (Ops<T>::*op)(P...), A&... a) {
    (inner_.*op)(arg(a)...);
  }
  class Call {
   public:
    Call(ForwardingOps& o, OpId op) : o_(o), op_(op) { o_.op_begin(op_); }
    ~Call() { o_.op_end(op_); }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    ForwardingOps& o_;
    OpId op_;
  };
};

extern template class ForwardingOps<float>;
extern template class ForwardingOps<double>;

}  // namespace wiola
