// The host CPU and the CPU kernels' SIMD target, by name, for run reports and
// banners above kernels/ (which includes no kernels/cpu/ header,
// docs/architecture.md). The CPU backend implements them
// (kernels/cpu/cpu_info.cpp): they are kernels/cpu/simd.h's, docs/cpu.md.
#pragma once

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

}  // namespace wiola
