// The host CPU, the CPU kernels' SIMD target and the BLAS kernels, by name,
// for run reports and banners above kernels/ (which includes no kernels/cpu/
// header, docs/architecture.md). The CPU backend implements them
// (kernels/cpu/cpu_info.cpp): they are kernels/cpu/simd.h's and
// kernels/cpu/blas.h's, docs/cpu.md.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace wiola {

// "model name" of /proc/cpuinfo, else the CPUID brand string, else
// "unknown x86-64 CPU".
std::string host_cpu_model();
// The target the CPU kernels run on (lower case: sse4, avx2, avx512); applies
// WIOLA_SIMD on first use, so it may throw wiola::Error.
const char* cpu_simd_target();
// Targets compiled into this binary, best first.
std::vector<std::string> cpu_simd_compiled_targets();
// -march of the build (the baseline every other file is compiled for).
const char* cpu_build_march();

// The fp32 FMA peak of `cores` cores of this CPU, an upper bound on what
// any kernel reaches: cores x clock x 2 FMA units x fp32 lanes x 2 FLOPs.
// The clock is the highest this host names: cpufreq's cpuinfo_max_freq,
// /proc/cpuinfo's "cpu MHz" (any core) or the "@ x.xxGHz" of the model
// name; the lanes those of the widest vectors the CPU has (16 with
// AVX-512F, 8 with AVX, else 4), whichever the kernels use; two FMA units
// per core, the most an x86 core has. 0 flops when no clock is found.
struct CpuFmaPeak {
  double flops = 0;
  int cores = 0, lanes = 0, fma_units = 2;
  double ghz = 0;
  std::string clock_source;  // where the clock came from
};
CpuFmaPeak cpu_fma_peak(int cores);

// The BLAS the CPU backend's matrix products run on (docs/cpu.md, "BLAS
// kernels"); the first call selects the kernels (kernels/cpu/blas.h), so it
// may throw wiola::Error. Call it for CPU backends only.
struct CpuBlasInfo {
  std::string library;         // "OpenBLAS"
  std::string version;         // "0.3.21"
  std::string kernels;         // the kernel set in use: "SkylakeX"
  std::string chosen_by;       // "library", "environment" (OPENBLAS_CORETYPE) or "wiola"
  std::string library_choice;  // the library's own kernels where wiola replaced them, else ""
  std::string cpu_kernels;     // the kernels that match this CPU's features ("" below AVX2)
  bool below_cpu = false;      // the kernels in use are below what this CPU runs
  std::string note;            // why better kernels are not in use, else ""
  // One line: "OpenBLAS 0.3.21, SkylakeX kernels (selected by wiola: the library chose Prescott)"
  std::string summary;
};
CpuBlasInfo cpu_blas();
// The same as JSON (report.json, checkpoint manifests, bench output).
nlohmann::json cpu_blas_json();

}  // namespace wiola
