// Element types of backend buffers and messages. One enum for the op
// interface (a buffer knows whether it holds fp32, bf16, ...) and for the
// communicators (dist/comm.h), so a buffer's dtype is also what goes on the
// wire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace wiola {

enum class DType : uint8_t { F32, F64, BF16, I32, I64, U8 };

constexpr size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::BF16: return "bfloat16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
  }
  return "?";
}

// bfloat16 storage: the upper 16 bits of an IEEE float. Only a tag type on
// the host (backends that compute in bf16 convert in their kernels).
struct bf16 {
  uint16_t bits;
};

// float -> bfloat16 bits, rounded to nearest even (the GPU's conversion and
// torch's); NaN stays a (quiet) NaN with its sign.
inline uint16_t bf16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// bfloat16 bits -> float (exact).
inline float bf16_widen(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

template <class E>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::F32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::F64; };
template <> struct DTypeOf<bf16> { static constexpr DType value = DType::BF16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::I32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::I64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::U8; };

template <class E>
constexpr DType dtype_of() {
  return DTypeOf<E>::value;
}

template <class E>
concept FloatElement = std::is_same_v<E, float> || std::is_same_v<E, double> ||
                       std::is_same_v<E, bf16>;

}  // namespace wiola
