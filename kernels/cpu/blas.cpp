// The CPU backend's BLAS and the selection of its kernels (kernels/cpu/blas.h,
// docs/cpu.md "BLAS kernels").
#include "kernels/cpu/blas.h"

#include <cblas.h>
#include <cpuid.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <type_traits>
#include <vector>

#include "kernels/backend.h"
#include "util/env.h"
#include "util/error.h"
#include "util/test_hooks.h"

// OpenBLAS's own core selection (driver/others/dynamic.c), exported by
// DYNAMIC_ARCH builds only: quit forgets the core, init selects one again,
// reading OPENBLAS_CORETYPE as at load, and sets up its block sizes. Weak, so
// that a single-core build links and is reported as one that cannot switch.
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace wiola::cpu {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
bool same_core(std::string_view a, std::string_view b) { return lower(a) == lower(b); }

uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// ---- OpenBLAS, as linked ------------------------------------------------------
std::string blas_config() {
  const char* c = openblas_get_config();
  return c ? c : "";
}
std::string current_core() {
  const char* c = openblas_get_corename();
  return c ? c : "unknown";
}
bool can_switch(const std::string& config) {
  return gotoblas_dynamic_init && gotoblas_dynamic_quit && config.find("DYNAMIC_ARCH") != std::string::npos;
}

// OpenBLAS's core selection run again with OPENBLAS_CORETYPE=core for its
// duration (the variable is restored); returns the core it then runs.
std::string switch_core(const std::string& core) {
  const std::optional<std::string> saved = env_value("OPENBLAS_CORETYPE");
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  if (saved) setenv("OPENBLAS_CORETYPE", saved->c_str(), 1);
  else unsetenv("OPENBLAS_CORETYPE");
  return current_core();
}

// ---- the test hook --------------------------------------------------------------
struct BlasHook {
  bool forced = false;  // as if OPENBLAS_CORETYPE chose `core` (else the library itself)
  std::string core;
  std::string version;  // the release to judge the cores by ("" the linked one's)
};
std::optional<BlasHook> read_hook() {
  const TestHook h(wiola::Hook::Blas);
  if (!h.set()) return std::nullopt;
  h.fields(2, 2);
  const bool forced = h.word(0, {"library", "forced"}) == "forced";
  const std::string& rest = h.field(1);
  const auto at = rest.find('@');
  const std::string core = rest.substr(0, at), version = at == std::string::npos ? "" : rest.substr(at + 1);
  int a = 0, b = 0, c = 0;
  if (at != std::string::npos && std::sscanf(version.c_str(), "%d.%d.%d", &a, &b, &c) != 3)
    h.bad("'" + version + "' is not a release such as 0.3.11");
  if (!openblas_core_level(core)) h.bad("'" + core + "' is not an OpenBLAS x86-64 core");
  return BlasHook{forced, core, version};
}

// ---- the self-check -----------------------------------------------------------
struct CheckShape {
  int m, n, k;
};
// Direct and small-matrix paths (m n k up to 64^3), odd edges, and a k
// beyond one block of the packed path (OpenBLAS's GEMM_Q is 192-640).
constexpr CheckShape kCheckShapes[] = {{1, 1, 0},    {1, 1, 1},    {2, 3, 4},      {7, 5, 3},    {16, 16, 16},
                                       {33, 17, 45}, {64, 64, 64}, {100, 37, 129}, {40, 24, 700}};

template <class T>
std::string check_gemm(GemmFn<T> gemm, const char* name) {
  const double u = std::is_same_v<T, float> ? 0x1p-24 : 0x1p-53;  // unit roundoff
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  auto next = [&] {  // deterministic values in [-1, 1)
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return T(double(seed >> 11) * 0x1p-52 - 1.0);
  };
  for (const CheckShape& s : kCheckShapes)
    for (int t = 0; t < 4; ++t)
      for (int scaled = 0; scaled < 2; ++scaled) {
        const bool ta = t & 1, tb = t & 2;
        // alpha 1, beta 0 over stale values (the direct path's case), then
        // a general alpha and beta.
        const T alpha = scaled ? T(-0.75) : T(1), beta = scaled ? T(0.5) : T(0);
        const int ar = ta ? s.k : s.m, ac = ta ? s.m : s.k, br = tb ? s.n : s.k, bc = tb ? s.k : s.n;
        const int lda = ac + 3, ldb = bc + 1, ldc = s.n + 2;  // padded: leading dimensions are honoured
        std::vector<T> A(size_t(std::max(ar, 1)) * lda), B(size_t(std::max(br, 1)) * ldb), C(size_t(s.m) * ldc);
        for (T& x : A) x = next();
        for (T& x : B) x = next();
        for (T& x : C) x = scaled ? next() : T(0.2667);
        const std::vector<T> C0 = C;
        gemm(ta, tb, s.m, s.n, s.k, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        for (int i = 0; i < s.m; ++i)
          for (int j = 0; j < ldc; ++j) {
            const size_t at = size_t(i) * ldc + j;
            if (j >= s.n) {  // the padding is not written
              if (C[at] != C0[at]) return std::string(name) + " wrote past n in its output row";
              continue;
            }
            double ref = 0, mag = 0;
            for (int p = 0; p < s.k; ++p) {
              const double a = ta ? A[size_t(p) * lda + i] : A[size_t(i) * lda + p];
              const double b = tb ? B[size_t(j) * ldb + p] : B[size_t(p) * ldb + j];
              ref += a * b;
              mag += std::fabs(a * b);
            }
            ref = double(alpha) * ref + (beta != T(0) ? double(beta) * double(C0[at]) : 0.0);
            mag = std::fabs(double(alpha)) * mag + std::fabs(double(beta) * double(C0[at]));
            const double err = std::fabs(double(C[at]) - ref), bound = 2.0 * (s.k + 2) * u * mag + 1e-30;
            if (!(err <= bound)) {
              std::ostringstream os;
              os << name << " " << (ta ? 'T' : 'N') << (tb ? 'T' : 'N') << " m=" << s.m << " n=" << s.n << " k=" << s.k
                 << " alpha=" << double(alpha) << " beta=" << double(beta) << ": C[" << i << "," << j
                 << "] = " << double(C[at]) << ", expected " << ref << " (error " << err << ", bound " << bound << ")";
              return os.str();
            }
          }
      }
  return "";
}

// ---- the selection ----------------------------------------------------------------
// Replaces the library's core (below what this CPU runs) by the best one
// wiola may use: not known to be wrong in this release, passing the
// self-check. Leaves the library's core and says why where none qualifies.
void replace_generic_core(BlasState& s, bool dynamic, IsaLevel library_level) {
  if (!dynamic) {
    s.note = s.cpu_kernels + " not selectable: this OpenBLAS is built for one core (no DYNAMIC_ARCH)";
    return;
  }
  const std::string original = s.kernels;
  std::string why;
  for (int l = int(s.cpu); l > int(library_level); --l) {
    const char* core = openblas_core_for(IsaLevel(l));
    if (!core) continue;
    if (const std::string bad = openblas_known_bad(s.version, core); !bad.empty()) {
      why += std::string(why.empty() ? "" : "; ") + core + " refused: " + bad;
      continue;
    }
    const std::string got = switch_core(core);
    std::string failed;
    if (!same_core(got, core)) failed = "this OpenBLAS ran " + got + " when asked for it";
    else failed = gemm_self_check(blas_sgemm, blas_dgemm);
    if (failed.empty()) {
      s.library_choice = original;
      s.kernels = got;
      s.chosen_by = BlasChooser::Wiola;
      s.note = why;  // the better cores refused, if any
      return;
    }
    why += std::string(why.empty() ? "" : "; ") + core + " refused: " + failed;
    const std::string back = switch_core(original);
    WIOLA_CHECK(same_core(back, original), "OpenBLAS: could not return to its ", original, " core (it runs ", back,
                ")");
  }
  s.note = why;
}

// Who chose the core OpenBLAS runs now: the library, OPENBLAS_CORETYPE, or
// the test hook (which first makes OpenBLAS run its core).
void find_chooser(BlasState& s, bool dynamic, const std::string& config) {
  if (const auto hook = read_hook()) {
    WIOLA_CHECK(dynamic, "WIOLA_TEST_BLAS needs an OpenBLAS built with DYNAMIC_ARCH (this one: ", config, ")");
    const std::string got = switch_core(hook->core);
    WIOLA_CHECK(same_core(got, hook->core), "WIOLA_TEST_BLAS: this OpenBLAS runs ", got, " when asked for ",
                hook->core);
    s.simulated = true;
    if (!hook->version.empty()) s.version = hook->version;
    if (hook->forced) {
      s.chosen_by = BlasChooser::Environment;
      s.chooser_env = "WIOLA_TEST_BLAS=forced:" + hook->core;
    }
  } else if (const std::string env = env_text("OPENBLAS_CORETYPE"); !env.empty() && dynamic) {
    s.chosen_by = BlasChooser::Environment;  // the user's own choice always wins
    s.chooser_env = std::string("OPENBLAS_CORETYPE=") + env;
  }
}

BlasState select_kernels() {
  BlasState s;
  const std::string config = blas_config();
  std::istringstream words(config);
  words >> s.library >> s.version;
  if (s.library.empty()) s.library = "OpenBLAS";
  const bool dynamic = can_switch(config);
  s.cpu = cpu_isa_level();
  if (const char* best = openblas_core_for(s.cpu)) s.cpu_kernels = best;
  find_chooser(s, dynamic, config);
  s.kernels = current_core();

  if (s.below_cpu() && s.chosen_by == BlasChooser::Library)
    replace_generic_core(s, dynamic, *openblas_core_level(s.kernels));
  return s;
}

// The library fell back and wiola could not replace its kernels: the user
// would not know otherwise (a choice of OPENBLAS_CORETYPE is the user's own
// and only shows in the banners).
void warn_fallback(const BlasState& s) {
  if (!s.below_cpu() || s.chosen_by == BlasChooser::Environment || launcher_local_rank() > 0) return;
  std::fprintf(stderr,
               "wiola: warning: %s %s runs its %s kernels (%s) on a CPU that runs %s (%s kernels): %s. Matrix "
               "products run slower than they could.\n",
               s.library.c_str(), s.version.c_str(), s.kernels.c_str(), isa_level_name(*openblas_core_level(s.kernels)),
               isa_level_name(s.cpu), s.cpu_kernels.c_str(), s.note.c_str());
}

// The process's selection, made on first use: the CPU backend may be made
// during static initialisation (a test's global), before this file's globals.
struct Selection {
  std::mutex mu;
  bool done = false;
  BlasState state;
  std::string error;
};
Selection& selection() {
  static Selection s;
  return s;
}

}  // namespace

const char* isa_level_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::Sse: return "sse";
    case IsaLevel::Avx: return "avx";
    case IsaLevel::Avx2: return "avx2";
    case IsaLevel::Avx512: return "avx512";
  }
  return "?";
}

IsaLevel cpu_isa_level() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return IsaLevel::Sse;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28);
  if (!osxsave || !avx) return IsaLevel::Sse;
  const uint64_t xcr = xcr0();
  if ((xcr & 0x6) != 0x6) return IsaLevel::Sse;  // the OS does not save YMM
  unsigned b7 = 0;
  if (__get_cpuid_max(0, nullptr) >= 7) {
    unsigned a7 = 0, c7 = 0, d7 = 0;
    __cpuid_count(7, 0, a7, b7, c7, d7);
  }
  if (!(b7 & (1u << 5)) || !fma) return IsaLevel::Avx;
  // AVX-512 F, DQ, CD, BW, VL and the OS saving opmask and ZMM state.
  const unsigned need = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);
  if ((b7 & need) == need && (xcr & 0xE0) == 0xE0) return IsaLevel::Avx512;
  return IsaLevel::Avx2;
}

std::optional<IsaLevel> openblas_core_level(std::string_view core) {
  struct Core {
    const char* name;
    IsaLevel level;
  };
  // OpenBLAS's x86-64 cores (driver/others/dynamic.c's names) by the widest
  // instructions their kernels use.
  static const Core kCores[] = {{"Katmai", IsaLevel::Sse},        {"Coppermine", IsaLevel::Sse},
                                {"Northwood", IsaLevel::Sse},     {"Prescott", IsaLevel::Sse},
                                {"Banias", IsaLevel::Sse},        {"Atom", IsaLevel::Sse},
                                {"Core2", IsaLevel::Sse},         {"Penryn", IsaLevel::Sse},
                                {"Dunnington", IsaLevel::Sse},    {"Nehalem", IsaLevel::Sse},
                                {"Athlon", IsaLevel::Sse},        {"Opteron", IsaLevel::Sse},
                                {"Opteron_SSE3", IsaLevel::Sse},  {"Barcelona", IsaLevel::Sse},
                                {"Nano", IsaLevel::Sse},          {"Bobcat", IsaLevel::Sse},
                                {"Sandybridge", IsaLevel::Avx},   {"Bulldozer", IsaLevel::Avx},
                                {"Piledriver", IsaLevel::Avx},    {"Steamroller", IsaLevel::Avx},
                                {"Excavator", IsaLevel::Avx2},    {"Haswell", IsaLevel::Avx2},
                                {"Zen", IsaLevel::Avx2},          {"SkylakeX", IsaLevel::Avx512},
                                {"Cooperlake", IsaLevel::Avx512}, {"SapphireRapids", IsaLevel::Avx512}};
  for (const Core& c : kCores)
    if (same_core(core, c.name)) return c.level;
  return std::nullopt;
}

const char* openblas_core_for(IsaLevel level) {
  switch (level) {
    case IsaLevel::Avx512: return "SkylakeX";
    case IsaLevel::Avx2: return "Haswell";
    default: return nullptr;
  }
}

std::string openblas_known_bad(std::string_view version, std::string_view core) {
  const auto level = openblas_core_level(core);
  if (!level || *level != IsaLevel::Avx512) return "";
  int major = 0, minor = 0, patch = 0;
  if (std::sscanf(std::string(version).c_str(), "%d.%d.%d", &major, &minor, &patch) != 3 || major != 0 || minor != 3)
    return "";
  struct Bad {
    int first, last;  // 0.3.first .. 0.3.last
    const char* why;
  };
  static const Bad kBad[] = {
      {4, 6,
       "OpenBLAS 0.3.4-0.3.6's AVX-512 DGEMM kernels compute wrong results for some inputs (OpenBLAS issues "
       "1955, 2029, 2168; disabled in 0.3.7)"},
      {11, 11,
       "OpenBLAS 0.3.11's AVX-512 small-matrix SGEMM (sgemm_direct) is compiled empty and leaves wrong "
       "results (OpenBLAS issue 2914; fixed in 0.3.12)"},
      {14, 14,
       "OpenBLAS 0.3.14's AVX-512 small-matrix SGEMM (sgemm_direct) is compiled empty and leaves wrong "
       "results (OpenBLAS issue 3152; fixed in 0.3.15)"},
  };
  for (const Bad& b : kBad)
    if (patch >= b.first && patch <= b.last) return b.why;
  return "";
}

void blas_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* A, int lda, const float* B,
                int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
              A, lda, B, ldb, beta, C, ldc);
}
void blas_dgemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* A, int lda,
                const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
              A, lda, B, ldb, beta, C, ldc);
}

std::string gemm_self_check(GemmFn<float> sgemm, GemmFn<double> dgemm) {
  std::string r = check_gemm<float>(sgemm, "sgemm");
  return r.empty() ? check_gemm<double>(dgemm, "dgemm") : r;
}

bool BlasState::below_cpu() const {
  const auto level = openblas_core_level(kernels);
  return level && *level < cpu && !cpu_kernels.empty();
}

std::string BlasState::summary() const {
  std::string s = library + " " + version + ", " + kernels + " kernels (";
  switch (chosen_by) {
    case BlasChooser::Wiola: s += "selected by wiola: the library chose " + library_choice; break;
    case BlasChooser::Environment: s += chooser_env; break;
    case BlasChooser::Library: s += "the library's choice"; break;
  }
  if (simulated && chosen_by != BlasChooser::Environment) s += ", simulated by WIOLA_TEST_BLAS";
  if (below_cpu()) s += "; " + (note.empty() ? "this CPU runs " + cpu_kernels : note);
  return s + ")";
}

void blas_init() {
  Selection& sel = selection();
  std::lock_guard<std::mutex> lock(sel.mu);
  if (!sel.done) {
    sel.done = true;
    try {
      sel.state = select_kernels();
      warn_fallback(sel.state);
    } catch (const Error& e) {
      sel.error = e.what();
    }
  }
  if (!sel.error.empty()) throw Error(sel.error);
}

const BlasState& blas_state() {
  blas_init();
  return selection().state;
}

std::optional<double> blas_sgemm_gflops_on(const std::string& core, int n, int reps) {
  blas_init();
  if (!can_switch(blas_config())) return std::nullopt;
  const std::string in_use = current_core();
  std::optional<double> rate;
  if (same_core(switch_core(core), core)) rate = openblas_sgemm_gflops(n, reps);
  const std::string back = switch_core(in_use);
  WIOLA_CHECK(same_core(back, in_use), "OpenBLAS: could not return to its ", in_use, " core (it runs ", back, ")");
  return rate;
}

}  // namespace wiola::cpu
