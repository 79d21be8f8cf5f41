// The warp-level tensor-core and copy instructions of the FlashAttention-2
// style kernels, one wrapper each: inline PTX on the GPU (sm_80 and later),
// the CUDA emulator's implementation of the same instruction in CI
// (tools/cuda_emu, emu_ptx.cpp), so that a kernel written against these
// wrappers runs unchanged in both. Fragment layouts are the PTX ISA's
// ("Matrix Fragments for mma.m16n8k16", "ldmatrix"); the kit's ptx_probe
// compares the emulator's mapping with the GPU's.
//
// Every wrapper is a warp-collective operation: all 32 lanes of the warp
// execute it together, converged (as the instructions' .aligned forms require).
//
//   mma_bf16_16816(d, a, b, c)   D[16x8] = A[16x16] B[16x8] + C, bf16 inputs,
//                                fp32 accumulators. Lane l (g = l/4, t = l%4)
//                                holds a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..],
//                                a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..];
//                                b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g];
//                                c/d[0..1] = C[g][2t..2t+1], c/d[2..3] = C[g+8][2t..].
//                                (Each 32-bit register packs two bf16, the
//                                lower column or row in the low half.)
//   ldmatrix_x{1,2,4}(r, row)    loads 1, 2 or 4 8x8 bf16 matrices from shared
//                                memory: lanes 8i..8i+7 give the addresses of
//                                matrix i's rows 0..7 (16 bytes each, 16-byte
//                                aligned); lane l receives in r[i] the row l/4,
//                                columns 2(l%4)..+1 of matrix i.
//   ldmatrix_x{2,4}_trans        the same, each matrix transposed: r[i] holds
//                                column l/4, rows 2(l%4)..+1 of matrix i.
//   cp_async_16(dst, src)        16 bytes global -> shared, asynchronously (.cg:
//                                not cached in L1). dst and src 16-byte aligned.
//   cp_async_16_zfill(dst, src, valid)  the same, or 16 zero bytes when !valid
//                                (src is then not read).
//   cp_async_commit()            closes the lane's current group of copies.
//   cp_async_wait<N>()           waits until at most N of the lane's groups are
//                                still in flight. The destination may not be
//                                read before that (the emulator fills it with
//                                NaN bytes until the wait), and other lanes see
//                                the data only after a __syncthreads (or
//                                __syncwarp for the warp's own copies).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#if defined(WIOLA_CUDA_EMULATOR)
namespace wiola_emu::ptx {
void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b, const float* c);
void ldmatrix(uint32_t* r, int n, bool trans, const void* row);
void cp_async_16(void* dst, const void* src, bool valid);
void cp_async_commit();
void cp_async_wait(int n);
}  // namespace wiola_emu::ptx
#endif

namespace wiola::cuda::ptx {

// The shared-memory address space's 32-bit address of a generic pointer.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#else
  (void)p;
  return 0;
#endif
}

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                               const float (&c)[4]) {
#if defined(WIOLA_CUDA_EMULATOR)
  ::wiola_emu::ptx::mma_bf16_16816(d, a, b, c);
#elif defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#endif
}

__device__ __forceinline__ void ldmatrix_x1(uint32_t (&r)[1], const void* row) {
#if defined(WIOLA_CUDA_EMULATOR)
  ::wiola_emu::ptx::ldmatrix(r, 1, false, row);
#elif defined(__CUDA_ARCH__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* row) {
#if defined(WIOLA_CUDA_EMULATOR)
  ::wiola_emu::ptx::ldmatrix(r, 2, false, row);
#elif defined(__CUDA_ARCH__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(WIOLA_CUDA_EMULATOR)
  ::wiola_emu::ptx::ldmatrix(r, 4, false, row);
#elif defined(__CUDA_ARCH__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row) {
#if defined(WIOLA_CUDA_EMULATOR)
  ::wiola_emu::ptx::ldmatrix(r, 2, true, row);
#elif defined(__CUDA_ARCH__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(row)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#if defined(WIOLA_CUDA_EMULATOR)
  ::wiola_emu::ptx::ldmatrix(r, 4, true, row);
#elif defined(__CUDA_ARCH__)
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
#endif
}

__device__ __forceinline__ void cp_async_16_zfill(void* dst, const void* src, bool valid) {
#if defined(WIOLA_CUDA_EMULATOR)
  ::wiola_emu::ptx::cp_async_16(dst, src, valid);
#elif defined(__CUDA_ARCH__)
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
#endif
}
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) { cp_async_16_zfill(dst, src, true); }

__device__ __forceinline__ void cp_async_commit() {
#if defined(WIOLA_CUDA_EMULATOR)
  ::wiola_emu::ptx::cp_async_commit();
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(WIOLA_CUDA_EMULATOR)
  ::wiola_emu::ptx::cp_async_wait(N);
#elif defined(__CUDA_ARCH__)
  // "memory": plain loads of the copied data may not move above the wait.
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Two floats as one register of two bf16 (lo in the low half), the A/B
// operand form of mma_bf16_16816.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  static_assert(sizeof(v) == sizeof(r));
  __builtin_memcpy(&r, &v, sizeof(r));
  return r;
}

}  // namespace wiola::cuda::ptx
