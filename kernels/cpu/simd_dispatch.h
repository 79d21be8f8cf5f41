// For the dispatched kernel files only: WIOLA_DISPATCH(F) is the pointer to
// F of the SIMD target in use (HWY_DYNAMIC_DISPATCH), after WIOLA_SIMD has
// been applied. Take it once, outside OpenMP regions: applying WIOLA_SIMD may
// throw (an unknown or unusable target), and no exception may leave a region.
#pragma once

#include <atomic>

namespace wiola::cpu::simd_detail {

extern std::atomic<bool> g_ready;
void apply_env();  // simd.cpp: chooses the target (WIOLA_SIMD or the best one)

inline void ready() {
  if (!g_ready.load(std::memory_order_acquire)) [[unlikely]]
    apply_env();
}

}  // namespace wiola::cpu::simd_detail

#define WIOLA_DISPATCH(F) (::wiola::cpu::simd_detail::ready(), &HWY_DYNAMIC_DISPATCH(F))
