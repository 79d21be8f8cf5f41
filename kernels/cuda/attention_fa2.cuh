// The tile helpers the FlashAttention-2 kernels share (attention_fa2_fwd.cu,
// attention_fa2_bwd.cu): the block shapes, the shared tiles' row stride,
// cp.async tile copies, the keys' visibility ends, bf16 register unpacking.
// Device code for those two files only (an anonymous namespace: each keeps
// its own copy).
#pragma once

#include <climits>
#include <cstdint>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ptx.cuh"

namespace wiola::cuda {
namespace {

constexpr int kFaRows = 64;  // the backward's tiles and default blocks, in rows; the forward's default
constexpr int kFaWarps = 4, kFaThreads = 32 * kFaWarps;

// The row stride of the shared tiles, in elements: 16 bytes of padding.
constexpr int fa_ld(int D) { return D + 8; }

// Rows [r0, r0 + R) of the bf16 matrix src (rows ld apart, columns [0, D))
// into the shared tile dst [R][D + 8] by cp.async, 16 bytes a copy, by a
// block of NT threads; rows at or past `valid` are zero-filled.
template <int D, int R = kFaRows, int NT = kFaThreads>
__device__ __forceinline__ void fa_copy_tile(bf16_t* dst, const bf16_t* src, size_t ld, int r0, int valid) {
  constexpr int kChunks = D / 8, kPer = R * kChunks / NT;
  static_assert(R * kChunks % NT == 0, "a tile is a whole number of copies per thread");
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int idx = int(threadIdx.x) + t * NT, r = idx / kChunks, c = (idx % kChunks) * 8;
    const bool ok = r0 + r < valid;
    ptx::cp_async_16_zfill(dst + r * fa_ld(D) + c, ok ? src + size_t(r0 + r) * ld + c : src, ok);
  }
}

// Rows [r0, r0 + R) of HP heads of the bf16 matrix src (head p's columns
// start p * head_ld after src's, rows ld apart) into the shared tile dst
// [HP][R][D + 8] by cp.async, 16 bytes a copy, by a block of NT threads;
// rows at or past `valid` are zero-filled. The packed forward's Q tile.
template <int D, int R, int HP, int NT>
__device__ __forceinline__ void fa_copy_heads(bf16_t* dst, const bf16_t* src, size_t head_ld, size_t ld, int r0,
                                              int valid) {
  constexpr int kChunks = D / 8, kPer = HP * R * kChunks / NT;
  static_assert(HP * R * kChunks % NT == 0, "a tile is a whole number of copies per thread");
#pragma unroll
  for (int t = 0; t < kPer; ++t) {
    const int idx = int(threadIdx.x) + t * NT, hr = idx / kChunks, p = hr / R, r = hr % R, c = (idx % kChunks) * 8;
    const bool ok = r0 + r < valid;
    ptx::cp_async_16_zfill(dst + hr * fa_ld(D) + c, ok ? src + p * head_ld + size_t(r0 + r) * ld + c : src, ok);
  }
}

// The visibility ends of key rows [j0, j0 + R) into kend[R]: key j is
// visible to position p iff kend[j - j0] <= p; rows at or past jmax get
// INT_MAX (never visible).
template <int R = kFaRows>
__device__ __forceinline__ void fa_key_ends(int* kend, const AttnKeys& keys, int b, int Tk, int j0, int jmax) {
  for (int c = threadIdx.x; c < R; c += blockDim.x) {
    const int j = j0 + c;
    kend[c] = j >= jmax ? INT_MAX : keys.key_end ? keys.key_end[size_t(b) * Tk + j] : j;
  }
}

// The two bf16 of a packed register as floats.
__device__ __forceinline__ float bf16_lo(uint32_t r) {
  const uint32_t u = r << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
__device__ __forceinline__ float bf16_hi(uint32_t r) {
  const uint32_t u = r & 0xffff0000u;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
__device__ __forceinline__ uint32_t ld_u32(const bf16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

}  // namespace
}  // namespace wiola::cuda
