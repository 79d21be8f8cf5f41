// bf16 for the emulator (tests/cuda_emu/emu.h): the storage type and the
// conversions the CUDA backend uses, rounding to nearest even as the hardware.
#pragma once

#include <cstdint>
#include <cstring>

#include "tests/cuda_emu/emu.h"

struct __nv_bfloat16 {
  uint16_t bits;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) {  // NOLINT: implicit, as cuda_bf16.h's
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) bits = uint16_t((u >> 16) | 0x40u);  // NaN stays NaN
    else bits = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  operator float() const {  // NOLINT
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return float(h); }
