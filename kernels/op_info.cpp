// The op table (kernels/op_info.h), and the compile-time check that every
// entry of kernels/op_list.h names its arguments as its parameters, in order.
#include "kernels/op_info.h"

#include <cstddef>
#include <string_view>

#include "util/error.h"

namespace wiola {
namespace {

constexpr bool is_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// The i-th comma-separated item of "(a, b, c)", blanks trimmed.
constexpr std::string_view item(std::string_view list, size_t i) {
  list = list.substr(1, list.size() - 2);
  for (; i > 0; --i) {
    const size_t comma = list.find(',');
    if (comma == std::string_view::npos) return {};
    list = list.substr(comma + 1);
  }
  list = list.substr(0, list.find(','));
  while (!list.empty() && !is_ident(list.front())) list.remove_prefix(1);
  while (!list.empty() && !is_ident(list.back())) list.remove_suffix(1);
  return list;
}

// The last identifier of a parameter ("const AttnShape& s" -> "s").
constexpr std::string_view param_name(std::string_view param) {
  size_t b = param.size();
  while (b > 0 && is_ident(param[b - 1])) --b;
  return param.substr(b);
}

// params "(CPtr x, int n)" and args "(x, n)": the same names, in order.
constexpr bool args_name_params(std::string_view params, std::string_view args) {
  for (size_t i = 0;; ++i) {
    const std::string_view p = item(params, i), a = item(args, i);
    if (p.empty() || a.empty()) return p.empty() && a.empty();
    if (param_name(p) != a) return false;
  }
}

#define WIOLA_OP(name, cls, params, args) \
  static_assert(args_name_params(#params, #args), \
                "kernels/op_list.h: the arguments of " #name " are not its parameters' names, in order");
#include "kernels/op_list.h"

constexpr OpInfo kOps[] = {
#define WIOLA_OP(name, cls, params, args) {#name, OpClass::cls},
#include "kernels/op_list.h"
};

}  // namespace

const char* op_class_name(OpClass c) {
  switch (c) {
    case OpClass::gemm: return "gemm";
    case OpClass::attention: return "attention";
    case OpClass::context_attention: return "context attention";
    case OpClass::atm: return "ATM";
    case OpClass::norm: return "norm";
    case OpClass::cross_entropy: return "cross-entropy";
    case OpClass::optimizer: return "optimizer";
    case OpClass::copies: return "copies";
    case OpClass::embedding: return "embedding";
    case OpClass::elementwise: return "elementwise";
  }
  return "?";
}

const OpInfo& op_info(OpId op) { return kOps[static_cast<size_t>(op)]; }

OpId op_named(const std::string& name) {
  for (size_t i = 0; i < std::size(kOps); ++i)
    if (name == kOps[i].name) return static_cast<OpId>(i);
  fail("no op named '", name, "' (kernels/op_list.h)");
}

}  // namespace wiola
