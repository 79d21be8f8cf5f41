// Target selection and reporting for the dispatched CPU kernels, and the
// attention primitives of simd.h (docs/cpu.md).
#include <cstddef>
#include <cstdint>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace wiola::cpu::HWY_NAMESPACE {

int64_t TargetBit() { return HWY_TARGET; }

// kPadded: the row has room up to the next whole vector (simd.h, kRowRoom).
template <bool kPadded>
float RowMaxT(const float* x, int n) {
  const DF d;
  const float ninf = -std::numeric_limits<float>::infinity();
  VF m = hn::Set(d, ninf);
  ForEachRow<kPadded>(d, size_t(n), [&](size_t i, auto t) HWY_ATTR { m = hn::Max(m, In(d, x + i, t, ninf)); });
  return hn::GetLane(hn::MaxOfLanes(d, m));
}
float RowMax(const float* x, int n) { return RowMaxT<false>(x, n); }
float RowMaxPadded(const float* x, int n) { return RowMaxT<true>(x, n); }

// m = -inf (a row with nothing visible) counts as 0: the row becomes zeros.
template <bool kPadded>
float ExpSubSumT(float* x, int n, float m) {
  const DF d;
  const float ninf = -std::numeric_limits<float>::infinity();
  const VF vm = hn::Set(d, m == ninf ? 0.0f : m);
  VF s = hn::Zero(d);
  ForEachRow<kPadded>(d, size_t(n), [&](size_t i, auto t) HWY_ATTR {
    const VF e = Exp(d, hn::Sub(In(d, x + i, t, ninf), vm));  // padding: exp(-inf) = 0
    Out(d, e, x + i, t);
    s = hn::Add(s, e);
  });
  return hn::GetLane(hn::SumOfLanes(d, s));
}
float ExpSubSum(float* x, int n, float m) { return ExpSubSumT<false>(x, n, m); }
float ExpSubSumPadded(float* x, int n, float m) { return ExpSubSumT<true>(x, n, m); }

double DotWide(const float* a, const float* b, int n) {
  const DF d;
  VD lo = hn::Zero(DD()), hi = hn::Zero(DD());
  ForEach(d, size_t(n), [&](size_t i, auto t) HWY_ATTR {
    const VF va = In(d, a + i, t), vb = In(d, b + i, t);  // padding: 0 * 0
    lo = hn::MulAdd(PromoteLo(va), PromoteLo(vb), lo);    // exact products
    hi = hn::MulAdd(PromoteHi(va), PromoteHi(vb), hi);
  });
  return SumLanes(hn::Add(lo, hi));
}

template <bool kPadded>
void SoftmaxBwdRowT(float* p, float* ds, int n, float L, float D) {
  const DF d;
  const VF vl = hn::Set(d, L), vd = hn::Set(d, D);
  ForEachRow<kPadded>(d, size_t(n), [&](size_t i, auto t) HWY_ATTR {
    const VF e = Exp(d, hn::Sub(In(d, p + i, t), vl));
    const VF g = hn::Mul(e, hn::Sub(In(d, ds + i, t), vd));
    Out(d, e, p + i, t);
    Out(d, g, ds + i, t);
  });
}
void SoftmaxBwdRow(float* p, float* ds, int n, float L, float D) { SoftmaxBwdRowT<false>(p, ds, n, L, D); }
void SoftmaxBwdRowPadded(float* p, float* ds, int n, float L, float D) { SoftmaxBwdRowT<true>(p, ds, n, L, D); }

}  // namespace wiola::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cpuid.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/simd_dispatch.h"
#include "util/env.h"
#include "util/error.h"

#ifndef WIOLA_MARCH_STR
#define WIOLA_MARCH_STR "unknown"
#endif

namespace wiola::cpu {

HWY_EXPORT(TargetBit);
HWY_EXPORT(RowMax);
HWY_EXPORT(ExpSubSum);
HWY_EXPORT(SoftmaxBwdRow);
HWY_EXPORT(RowMaxPadded);
HWY_EXPORT(ExpSubSumPadded);
HWY_EXPORT(SoftmaxBwdRowPadded);
HWY_EXPORT(DotWide);

// The padded forms touch whole vectors up to the row's room.
static_assert(HWY_MAX_BYTES / sizeof(float) <= size_t(kRowRoom), "a row's room must hold a whole vector");

// The attention kernel calls these per row: the dispatch is a load and an
// indirect call once the target is chosen.
float simd_row_max(const float* x, int n) { return (*WIOLA_DISPATCH(RowMax))(x, n); }

float simd_exp_sub_sum(float* x, int n, float m) { return (*WIOLA_DISPATCH(ExpSubSum))(x, n, m); }

void simd_softmax_bwd_row(float* p, float* ds, int n, float L, float D) {
  (*WIOLA_DISPATCH(SoftmaxBwdRow))(p, ds, n, L, D);
}

float simd_row_max_padded(const float* x, int n) { return (*WIOLA_DISPATCH(RowMaxPadded))(x, n); }

float simd_exp_sub_sum_padded(float* x, int n, float m) { return (*WIOLA_DISPATCH(ExpSubSumPadded))(x, n, m); }

void simd_softmax_bwd_row_padded(float* p, float* ds, int n, float L, float D) {
  (*WIOLA_DISPATCH(SoftmaxBwdRowPadded))(p, ds, n, L, D);
}

double simd_dot_wide(const float* a, const float* b, int n) { return (*WIOLA_DISPATCH(DotWide))(a, b, n); }

namespace {

struct Named {
  const char* name;
  int64_t bit;
};
// Every x86 target Highway 1.0.3 knows, best first; the canonical name first
// where two name one target.
constexpr Named kNames[] = {
    {"avx512_dl", HWY_AVX3_DL}, {"avx3_dl", HWY_AVX3_DL}, {"avx512", HWY_AVX3},
    {"avx3", HWY_AVX3},         {"avx2", HWY_AVX2},       {"sse4", HWY_SSE4},
    {"ssse3", HWY_SSSE3},       {"emu128", HWY_EMU128},   {"scalar", HWY_SCALAR},
};

const char* name_of(int64_t bit) {
  for (const Named& n : kNames)
    if (n.bit == bit) return n.name;
  return "unknown";
}

std::vector<std::string> names_of(int64_t mask) {
  std::vector<std::string> v;
  for (const Named& n : kNames)
    if ((mask & n.bit) && (v.empty() || v.back() != name_of(n.bit))) v.emplace_back(n.name);
  return v;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "none" : s;
}

std::mutex g_mu;

// What this CPU can run, detected once before any target is forced. The
// baseline target is always runnable: the whole binary requires it (Highway
// reports SSE4 only with AES and CLMUL, which these kernels do not use).
int64_t runnable() {
  static const int64_t bits = [] {
    hwy::SetSupportedTargetsForTest(0);
    return (hwy::SupportedTargets() | HWY_STATIC_TARGET) & HWY_TARGETS;
  }();
  return bits;
}

// The target bit `name` stands for, or a wiola::Error naming the value
// (`what`) and the usable targets.
int64_t resolve(const std::string& what, const std::string& name) {
  std::string low = name;
  for (char& c : low) c = char(std::tolower(static_cast<unsigned char>(c)));
  const std::string usable = join(names_of(runnable()));
  int64_t bit = 0;
  for (const Named& n : kNames)
    if (low == n.name) bit = n.bit;
  if (bit == 0) fail(what, ": unknown SIMD target; usable on this CPU: ", usable);
  if (!(bit & HWY_TARGETS))
    fail(what, ": target ", name_of(bit), " is not compiled into this build (compiled: ", join(names_of(HWY_TARGETS)),
         "); usable on this CPU: ", usable);
  if (!(bit & runnable()))
    fail(what, ": this CPU (", cpu_model_name(), ") cannot run ", name_of(bit), "; usable on this CPU: ", usable);
  return bit;
}

// Points every dispatch table at `bit` (0: the best runnable target). The
// mock makes Highway's own re-initialisation, should anything trigger it,
// choose the same target.
void use(int64_t bit) {
  runnable();  // detect before mocking
  hwy::SetSupportedTargetsForTest(bit);
  hwy::GetChosenTarget().Update(bit ? bit : runnable());
  simd_detail::g_ready.store(true, std::memory_order_release);
}

int64_t env_target() {
  const std::string env = env_text("WIOLA_SIMD");
  if (env.empty()) return 0;
  return resolve("WIOLA_SIMD=" + env, env);
}

}  // namespace

namespace simd_detail {
std::atomic<bool> g_ready{false};

void apply_env() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_ready.load(std::memory_order_acquire)) return;
  use(env_target());
}
}  // namespace simd_detail

void simd_init() { simd_detail::ready(); }

const char* simd_target_name() { return name_of((*WIOLA_DISPATCH(TargetBit))()); }

std::vector<std::string> simd_compiled_targets() { return names_of(HWY_TARGETS); }

std::vector<std::string> simd_supported_targets() { return names_of(runnable()); }

const char* simd_build_march() { return WIOLA_MARCH_STR; }

void simd_use_target(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mu);
  use(resolve("SIMD target '" + name + "'", name));
}

void simd_reset_target() {
  std::lock_guard<std::mutex> lock(g_mu);
  use(env_target());
}

std::string cpu_model_name() {
  auto trim = [](std::string s) {
    const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\n");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string v = trim(line.substr(colon + 1));
    if (!v.empty()) return v;
  }
  // CPUID leaves 0x80000002..4: the 48-byte brand string.
  unsigned regs[12] = {};
  if (__get_cpuid_max(0x80000000u, nullptr) >= 0x80000004u) {
    for (unsigned l = 0; l < 3; ++l)
      __get_cpuid(0x80000002u + l, &regs[4 * l], &regs[4 * l + 1], &regs[4 * l + 2], &regs[4 * l + 3]);
    char brand[49] = {};
    std::memcpy(brand, regs, 48);
    const std::string v = trim(brand);
    if (!v.empty()) return v;
  }
  return "unknown x86-64 CPU";
}

}  // namespace wiola::cpu
#endif  // HWY_ONCE
