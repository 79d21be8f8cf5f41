#include "kernels/cpu_info.h"

#include <nlohmann/json.hpp>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/simd.h"

namespace wiola {

std::string host_cpu_model() { return cpu::cpu_model_name(); }
const char* cpu_simd_target() { return cpu::simd_target_name(); }
std::vector<std::string> cpu_simd_compiled_targets() { return cpu::simd_compiled_targets(); }
const char* cpu_build_march() { return cpu::simd_build_march(); }

CpuBlasInfo cpu_blas() {
  const cpu::BlasState& s = cpu::blas_state();
  const char* by = s.chosen_by == cpu::BlasChooser::Wiola         ? "wiola"
                   : s.chosen_by == cpu::BlasChooser::Environment ? "environment"
                                                                  : "library";
  return {s.library, s.version, s.kernels, by, s.library_choice, s.cpu_kernels, s.below_cpu(), s.note, s.summary()};
}

nlohmann::json cpu_blas_json() {
  const CpuBlasInfo b = cpu_blas();
  return {{"library", b.library}, {"version", b.version}, {"kernels", b.kernels}, {"chosen_by", b.chosen_by},
          {"library_choice", b.library_choice}, {"cpu_kernels", b.cpu_kernels}, {"below_cpu", b.below_cpu},
          {"note", b.note}, {"summary", b.summary}};
}

}  // namespace wiola
