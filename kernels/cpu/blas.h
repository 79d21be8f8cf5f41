// The CPU backend's BLAS (docs/cpu.md, "BLAS kernels"): which library and
// which of its kernel sets the matrix products run on, who chose them, and
// the selection of the kernel set that matches the CPU where the library fell
// back to a generic one.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks a "core" (a kernel set:
// Prescott, Haswell, SkylakeX, ...) when it loads, by the CPU's vendor,
// family and model. A model it does not know can land on the SSE3 Prescott
// core: Debian's 0.3.21 does that on Intel family 6 models with an extended
// model above 10 (Emerald Rapids and later Xeons), whose AVX-512 then goes
// unused and every GEMM runs 4-7x slower. blas_init() finds the level the
// CPU runs from CPUID (features, not model numbers) and, where the library's
// core is below it and no OPENBLAS_CORETYPE chose it, re-runs OpenBLAS's own
// core selection with the matching core named, before any BLAS call. A core
// is used only if no known bug of that OpenBLAS release is held against it
// and the products pass gemm_self_check() on this host; otherwise the
// library's choice stays, with a warning that says why.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace wiola::cpu {

// What a kernel set needs of the CPU, and what a CPU offers (CPUID features
// and the registers the OS saves): SSE only, AVX, AVX2 with FMA, AVX-512
// (F, CD, BW, DQ, VL).
enum class IsaLevel { Sse, Avx, Avx2, Avx512 };
const char* isa_level_name(IsaLevel level);  // "sse", "avx", "avx2", "avx512"

// The level this CPU and OS run.
IsaLevel cpu_isa_level();
// The level of an OpenBLAS x86-64 core's kernels, by the name
// openblas_get_corename() gives (any case); nullopt for a name this table
// does not know (a newer release's core: never replaced).
std::optional<IsaLevel> openblas_core_level(std::string_view core);
// The core wiola selects for a CPU of `level`: SkylakeX (AVX-512), Haswell
// (AVX2 + FMA); nullptr below AVX2.
const char* openblas_core_for(IsaLevel level);
// Why `core` of OpenBLAS `version` ("0.3.21") must not be selected (a
// release whose AVX-512 kernels compute wrong results, with the upstream
// issue), or "" when nothing is known against it.
std::string openblas_known_bad(std::string_view version, std::string_view core);

// A row-major GEMM as cblas_?gemm computes it: C = alpha op(A) op(B) + beta C.
template <class T>
using GemmFn = void (*)(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* A, int lda,
                        const T* B, int ldb, T beta, T* C, int ldc);
// The linked BLAS's sgemm and dgemm as GemmFns.
void blas_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* A, int lda,
                const float* B, int ldb, float beta, float* C, int ldc);
void blas_dgemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* A, int lda,
                const double* B, int ldb, double beta, double* C, int ldc);
// Products against a double reference on shapes that reach a BLAS's
// direct, small-matrix and blocked paths (all four transpositions, k = 0,
// beta = 0 over stale values, odd sizes and leading dimensions): "" when
// every element is within the rounding bound of its sum, else the first
// failure (routine, shape, error).
std::string gemm_self_check(GemmFn<float> sgemm, GemmFn<double> dgemm);

enum class BlasChooser { Library, Environment, Wiola };

struct BlasState {
  std::string library;   // "OpenBLAS"
  std::string version;   // "0.3.21"
  std::string kernels;   // the core in use: "SkylakeX"
  BlasChooser chosen_by = BlasChooser::Library;
  std::string chooser_env;     // OPENBLAS_CORETYPE=... (or the test hook) where that chose
  std::string library_choice;  // the library's own core, where wiola replaced it
  IsaLevel cpu = IsaLevel::Sse;
  std::string cpu_kernels;  // the core matching this CPU ("" below AVX2)
  std::string note;         // why a better core is not in use, or ""
  bool simulated = false;   // WIOLA_TEST_BLAS made the library's choice
  // The kernels in use are below what this CPU runs (AVX2 and up).
  bool below_cpu() const;
  // "OpenBLAS 0.3.21, SkylakeX kernels (selected by wiola: the library chose Prescott)"
  std::string summary() const;
};

// Finds and applies the kernels once per process (the CPU backend's
// constructor calls it, as simd_init; so do the sgemm rate and
// `wiola --version`), before any BLAS call of the backend. A bad
// WIOLA_TEST_BLAS is a wiola::Error, every time it is called. Where the
// library fell back and its kernels stay (no DYNAMIC_ARCH, a refusal) it
// warns once on stderr (local rank 0 only).
//
// WIOLA_TEST_BLAS (tests only, docs/testing.md) simulates another host:
// "library:CORE" as if OpenBLAS had chosen CORE by itself (what follows is
// wiola's selection), "forced:CORE" as if OPENBLAS_CORETYPE=CORE had chosen
// it (kept); "@VERSION" after either judges the cores as that release's
// (library:Prescott@0.3.11: SkylakeX is refused). It overrides
// OPENBLAS_CORETYPE.
void blas_init();
const BlasState& blas_state();

// Benchmarks: the n^3 sgemm rate (openblas_sgemm_gflops) on `core`, switched
// to for the measurement and back; nullopt where the library cannot switch.
// Not while BLAS runs on other threads.
std::optional<double> blas_sgemm_gflops_on(const std::string& core, int n, int reps);

}  // namespace wiola::cpu
