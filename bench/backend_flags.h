// The CUDA backend's options (kernels/backend_options.h) as command-line
// flags of the GPU kit's programs (wiola_gpu_bench, wiola_kernel_bench):
// --attention, --attention-bwd, --gemm, --attention-tile, --attention-bwd-tile,
// --attention-heads-per-block, --cuda-graphs, each taking its enum's names
// (a name it does not know is refused by CLI11 with the list).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/backend_options.h"

namespace wiola {

// --flag NAME for an enum field: its names, the key that documents it.
template <NamedEnum E>
void add_enum_flag(CLI::App& app, const char* flag, E& field, const char* key) {
  std::vector<std::string> names;
  for (const std::string_view n : enum_names(E{})) names.emplace_back(n);
  app.add_option_function<std::string>(
         flag, [&field](const std::string& name) { field = *parse_enum<E>(name); },
         enum_choices<E>() + " (train." + key + ", docs/config.md)")
      ->check(CLI::IsMember(names))
      ->default_str(std::string(wiola::to_string(field)));
}

inline void add_backend_flags(CLI::App& app, BackendOptions& o) {
#define WIOLA_BACKEND_OPTION_FLAG(field, type, key, flag, old_env, doc) add_enum_flag(app, flag, o.field, key);
  WIOLA_BACKEND_OPTIONS(WIOLA_BACKEND_OPTION_FLAG)
#undef WIOLA_BACKEND_OPTION_FLAG
}

}  // namespace wiola
