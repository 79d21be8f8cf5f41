#include "kernels/cpu_info.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/simd.h"

namespace wiola {
namespace {

// The highest clock this host names, GHz, and where it came from.
std::pair<double, std::string> max_clock_ghz() {
  double ghz = 0;
  std::string from;
  const auto take = [&](double g, const std::string& where) {
    if (g > ghz) ghz = g, from = where;
  };
  for (unsigned c = 0;; ++c) {
    std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(c) + "/cpufreq/cpuinfo_max_freq");
    double khz = 0;
    if (!(f >> khz)) break;
    take(khz / 1e6, "cpufreq cpuinfo_max_freq");
  }
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (line.rfind("cpu MHz", 0) == 0) take(std::atof(line.c_str() + colon + 1) / 1e3, "/proc/cpuinfo cpu MHz");
    const auto at = line.find("@ ");
    if (line.rfind("model name", 0) == 0 && at != std::string::npos && line.find("GHz", at) != std::string::npos)
      take(std::atof(line.c_str() + at + 2), "the model name's clock");
  }
  return {ghz, from};
}

}  // namespace

std::string host_cpu_model() { return cpu::cpu_model_name(); }
const char* cpu_simd_target() { return cpu::simd_target_name(); }
std::vector<std::string> cpu_simd_compiled_targets() { return cpu::simd_compiled_targets(); }
const char* cpu_build_march() { return cpu::simd_build_march(); }

CpuFmaPeak cpu_fma_peak(int cores) {
  CpuFmaPeak p;
  p.cores = cores;
  p.lanes = __builtin_cpu_supports("avx512f") ? 16 : __builtin_cpu_supports("avx") ? 8 : 4;
  std::tie(p.ghz, p.clock_source) = max_clock_ghz();
  p.flops = double(cores) * p.ghz * 1e9 * p.fma_units * p.lanes * 2.0;
  return p;
}

CpuBlasInfo cpu_blas() {
  const cpu::BlasState& s = cpu::blas_state();
  const char* by = s.chosen_by == cpu::BlasChooser::Wiola         ? "wiola"
                   : s.chosen_by == cpu::BlasChooser::Environment ? "environment"
                                                                  : "library";
  return {s.library, s.version, s.kernels, by, s.library_choice, s.cpu_kernels, s.below_cpu(), s.note, s.summary()};
}

nlohmann::json cpu_blas_json() {
  const CpuBlasInfo b = cpu_blas();
  return {{"library", b.library},
          {"version", b.version},
          {"kernels", b.kernels},
          {"chosen_by", b.chosen_by},
          {"library_choice", b.library_choice},
          {"cpu_kernels", b.cpu_kernels},
          {"below_cpu", b.below_cpu},
          {"note", b.note},
          {"summary", b.summary}};
}

}  // namespace wiola
