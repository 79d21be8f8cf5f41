// Each op's name and profile class, from the list of ops (kernels/op_list.h):
// OpId numbers the ops, op_info() names them as profiles and traces show
// them. An op's class is part of its list entry, so an op without one, or
// with a class not named here, fails to compile.
#pragma once

#include <string>

namespace wiola {

// The classes profiles sum ops into (kernels/profiled_ops.h).
enum class OpClass {
  gemm,
  attention,
  context_attention,
  atm,
  norm,
  cross_entropy,
  optimizer,
  copies,
  embedding,
  elementwise,
};
// "gemm", "attention", "context attention", "ATM", "cross-entropy", ...
const char* op_class_name(OpClass c);

enum class OpId {
#define WIOLA_OP(name, cls, params, args) name,
#include "kernels/op_list.h"
};

struct OpInfo {
  const char* name;  // the Ops member's name
  OpClass cls;
};
const OpInfo& op_info(OpId op);
// The op of this name; throws wiola::Error for a name that is no op.
OpId op_named(const std::string& name);

// The arguments of an op's list entry, without their parentheses (for the
// code made from the list: `inner.NAME(WIOLA_OP_ARGS args)`).
#define WIOLA_OP_ARGS(...) __VA_ARGS__

}  // namespace wiola
