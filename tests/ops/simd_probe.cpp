// ctest helper: exit 0 when this build and CPU can run SIMD target argv[1];
// otherwise print why and exit 77, which the ops_simd_* entries report as
// skipped.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cpu/simd.h"

namespace {
std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}
}  // namespace

int main(int argc, char** argv) {
  namespace c = wiola::cpu;
  if (argc != 2) {
    std::fprintf(stderr, "usage: wiola_simd_probe TARGET\n");
    return 2;
  }
  const std::string t = argv[1];
  const auto compiled = c::simd_compiled_targets(), ok = c::simd_supported_targets();
  if (std::find(compiled.begin(), compiled.end(), t) == compiled.end()) {
    std::printf("SKIP: SIMD target %s is not compiled into this build (compiled: %s)\n", t.c_str(),
                joined(compiled).c_str());
    return 77;
  }
  if (std::find(ok.begin(), ok.end(), t) == ok.end()) {
    std::printf("SKIP: this CPU (%s) cannot run SIMD target %s (it runs: %s)\n",
                c::cpu_model_name().c_str(), t.c_str(), joined(ok).c_str());
    return 77;
  }
  return 0;
}
