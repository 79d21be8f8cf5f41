#include "kernels/cpu_info.h"

#include "kernels/cpu/simd.h"

namespace wiola {

std::string host_cpu_model() { return cpu::cpu_model_name(); }
const char* cpu_simd_target() { return cpu::simd_target_name(); }
std::vector<std::string> cpu_simd_compiled_targets() { return cpu::simd_compiled_targets(); }
const char* cpu_build_march() { return cpu::simd_build_march(); }

}  // namespace wiola
