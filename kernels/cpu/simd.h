// Run-time SIMD dispatch of the CPU kernels (docs/cpu.md). The float kernels
// are compiled for several x86 targets (Highway) and run on the best one this
// CPU supports, or on the one WIOLA_SIMD names (sse4, avx2, avx512). Results
// are deterministic for a fixed target and thread count.
#pragma once

#include <string>
#include <vector>

namespace wiola::cpu {

// ---- attention primitives (float, the target in use) -----------------------
// max of x[0..n); -inf for n == 0.
float simd_row_max(const float* x, int n);
// x[j] = exp(x[j] - m) in place (exp(-inf) = 0; m = -inf, a row with nothing
// visible, counts as m = 0 so that the row becomes zeros); returns sum_j x[j],
// accumulated in float lanes in a fixed order.
float simd_exp_sub_sum(float* x, int n, float m);
// p[j] = exp(p[j] - L); ds[j] = p[j] * (ds[j] - D).
void simd_softmax_bwd_row(float* p, float* ds, int n, float L, float D);
// The same three for rows with room: x (p, ds) may be read and written up to
// the next multiple of kRowRoom elements past n. Lanes past n are ignored
// (max) or set to 0 (the others). The results are those of the functions
// above, bit for bit; the last partial vector is masked instead of copied
// through a buffer (the attention kernel's score rows, whose leading
// dimension is a multiple of kRowRoom).
inline constexpr int kRowRoom = 16;
float simd_row_max_padded(const float* x, int n);
float simd_exp_sub_sum_padded(float* x, int n, float m);
void simd_softmax_bwd_row_padded(float* p, float* ds, int n, float L, float D);
// sum_j a[j] b[j], the products and their sum in double lanes (a fixed order
// for a fixed target).
double simd_dot_wide(const float* a, const float* b, int n);

// ---- targets -------------------------------------------------------------------
// Applies WIOLA_SIMD once (the CPU backend's constructor calls it): an unknown
// name, a target not compiled in or one this CPU cannot run is a wiola::Error
// that lists the usable targets, every time it is called.
void simd_init();
// The target the kernels run on (lower case: sse4, avx2, avx512).
const char* simd_target_name();
// Targets compiled into this binary, best first.
std::vector<std::string> simd_compiled_targets();
// Compiled targets this CPU can run, best first.
std::vector<std::string> simd_supported_targets();
// -march of the build (the baseline every other file is compiled for).
const char* simd_build_march();
// "model name" of /proc/cpuinfo, else the CPUID brand string, else
// "unknown x86-64 CPU".
std::string cpu_model_name();

// Tests and benchmarks: run the kernels on `name` from now on (same checks as
// WIOLA_SIMD); simd_reset_target() goes back to WIOLA_SIMD or the best
// target. Not safe while kernels run on other threads.
void simd_use_target(const std::string& name);
void simd_reset_target();

}  // namespace wiola::cpu
