// Backend options: see backend_options.h.
#include "kernels/backend_options.h"

#include <optional>
#include <vector>

#include "util/env.h"
#include "util/error.h"

namespace wiola {
namespace {

struct Switch {
  const char* field;    // as recorded
  std::string key;      // the config key
  const char* flag;     // the benchmarks' flag
  const char* old_env;  // the environment variable it replaced, or nullptr
  std::string_view default_value;
  std::string (*value)(const BackendOptions&);
};

const std::vector<Switch>& switches() {
#define WIOLA_BACKEND_OPTION_SWITCH(field, type, key, flag, old_env, doc) \
  {#field,  std::string("train.") + key, flag, \
   old_env, to_string(type{}),           [](const BackendOptions& o) { return std::string(to_string(o.field)); }},
  static const std::vector<Switch> s = {WIOLA_BACKEND_OPTIONS(WIOLA_BACKEND_OPTION_SWITCH)};
#undef WIOLA_BACKEND_OPTION_SWITCH
  return s;
}

}  // namespace

void check_attention_heads_per_block(const BackendOptions& o, int H, int Hkv) {
  const int hp = heads_per_block(o.attention_heads_per_block);
  WIOLA_CHECK(hp == 1 || (Hkv > 0 && H % Hkv == 0 && H / Hkv % hp == 0),
              "train.cuda_attention_heads_per_block (--attention-heads-per-block) must be 1 or divide the query "
              "heads of a KV group, model.n_heads / model.n_kv_heads = ",
              H, " / ", Hkv, " (got ", hp, ")");
}

void refuse_backend_env() {
  for (const Switch& s : switches()) {
    const std::optional<std::string> set = s.old_env ? env_value(s.old_env) : std::nullopt;
    if (!set) continue;
    const std::string v = set->empty() ? std::string(s.default_value) : *set;
    fail(s.old_env, "=", *set, " is no longer read: the switch is the backend option ", s.key, " (wiola train --set ",
         s.key, "=", v, "; ", s.flag,
         " of wiola_gpu_bench and wiola_kernel_bench), recorded in the run report and the checkpoint manifest; "
         "unset ",
         s.old_env);
  }
}

std::map<std::string, std::string> backend_option_fields(const BackendOptions& o) {
  std::map<std::string, std::string> f;
  for (const Switch& s : switches()) f[s.field] = s.value(o);
  return f;
}

}  // namespace wiola
