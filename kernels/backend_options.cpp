// Backend options: see backend_options.h.
#include "kernels/backend_options.h"

#include <cstdlib>
#include <vector>

#include "util/env.h"
#include "util/error.h"

namespace wiola {
namespace {

struct Switch {
  const char* field;    // as recorded
  const char* key;      // the config key
  const char* flag;     // the benchmarks' flag
  const char* old_env;  // the environment variable it replaced, or nullptr
  std::vector<std::string> values;
  std::string BackendOptions::*member;
};

const std::vector<Switch>& switches() {
  static const std::vector<Switch> s = {
      {"attention", "train.cuda_attention", "--attention", "WIOLA_CUDA_ATTENTION", {"tc", "fa2", "rows"},
       &BackendOptions::attention},
      {"attention_bwd", "train.cuda_attention_bwd", "--attention-bwd", "WIOLA_CUDA_ATTENTION_BWD",
       {"v1", "v2", "fa2"}, &BackendOptions::attention_bwd},
      {"gemm", "train.cuda_gemm", "--gemm", nullptr, {"cublas", "cublaslt", "auto"}, &BackendOptions::gemm},
      {"attention_tile", "train.cuda_attention_tile", "--attention-tile", nullptr,
       {"64x64", "64x128", "128x64", "128x128"}, &BackendOptions::attention_tile},
      {"attention_bwd_tile", "train.cuda_attention_bwd_tile", "--attention-bwd-tile", nullptr,
       {"64x64", "64x128", "128x64", "128x128"}, &BackendOptions::attention_bwd_tile},
      {"attention_heads_per_block", "train.cuda_attention_heads_per_block", "--attention-heads-per-block", nullptr,
       {"1", "2", "4"}, &BackendOptions::attention_heads_per_block},
      {"cuda_graphs", "train.cuda_graphs", "--cuda-graphs", nullptr, {"off", "layers"}, &BackendOptions::cuda_graphs},
  };
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i == 0 ? "" : i + 1 == v.size() ? " or " : ", ") + v[i];
  return s;
}

}  // namespace

void check_backend_options(const BackendOptions& o) {
  for (const Switch& s : switches()) {
    const std::string& v = o.*s.member;
    bool known = false;
    for (const auto& x : s.values) known = known || x == v;
    WIOLA_CHECK(known, s.key, " (", s.flag, ") must be ", join(s.values), " (got \"", v, "\")");
  }
}

void check_attention_heads_per_block(const BackendOptions& o, int H, int Hkv) {
  const int hp = o.attention_heads_per_block == "2" ? 2 : o.attention_heads_per_block == "4" ? 4 : 1;
  WIOLA_CHECK(hp == 1 || (Hkv > 0 && H % Hkv == 0 && H / Hkv % hp == 0),
              "train.cuda_attention_heads_per_block (--attention-heads-per-block) must be 1 or divide the query "
              "heads of a KV group, model.n_heads / model.n_kv_heads = ", H, " / ", Hkv, " (got ", hp, ")");
}

void refuse_backend_env() {
  for (const Switch& s : switches()) {
    const std::optional<std::string> set = s.old_env ? env_value(s.old_env) : std::nullopt;
    if (!set) continue;
    const char* v = set->c_str();
    fail(s.old_env, "=", v, " is no longer read: the switch is the backend option ", s.key,
         " (wiola train --set ", s.key, "=", *v ? v : s.values[0].c_str(), "; ", s.flag,
         " of wiola_gpu_bench and wiola_kernel_bench), recorded in the run report and the checkpoint manifest; "
         "unset ",
         s.old_env);
  }
}

std::map<std::string, std::string> backend_option_fields(const BackendOptions& o) {
  std::map<std::string, std::string> f;
  for (const Switch& s : switches()) f[s.field] = o.*s.member;
  return f;
}

}  // namespace wiola
