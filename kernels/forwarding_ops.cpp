// ForwardingOps (kernels/forwarding_ops.h): every op of kernels/op_list.h
// forwards to the inner backend inside op_begin/op_end, its buffer arguments
// through arg().
#include "kernels/forwarding_ops.h"

namespace wiola {

#define WIOLA_OP(name, cls, params, args) \
  template <class T> \
  void ForwardingOps<T>::name params { \
    const Call c(*this, OpId::name); \
    forward(&Ops<T>::name, WIOLA_OP_ARGS args); \
  }
#include "kernels/op_list.h"

template class ForwardingOps<float>;
template class ForwardingOps<double>;

}  // namespace wiola
