// The probe of the warp-level PTX instructions (kernels/cuda/ptx.cuh): one
// program, built with nvcc for the GPU (ptx_probe, tests/gpu/CMakeLists.txt)
// and for the CUDA emulator (ptx_probe_emu, tests/cuda_emu/CMakeLists.txt).
// It runs each instruction on one warp with inputs whose values encode their
// position, and prints every lane's output registers, one text line each:
//
//   ptx_probe --dump FILE      writes the lines to FILE;
//   ptx_probe --compare FILE   computes them here and compares them with
//                              FILE line by line: prints each difference and
//                              exits 1 on any (0 if none; 2 on a CUDA error
//                              or a bad command line).
//
// The kit (tests/gpu/kit_build.sh) carries the emulator's dump and the GPU
// runs --compare against it (kit_tests.sh): a difference means the
// emulator's fragment layouts (tools/cuda_emu/emu_ptx.cpp) are not the GPU's.
// Every value is an integer that bf16 and fp32 hold exactly (at most 256 in
// bf16) and every sum is exact in any order, so the two must agree exactly.
//
// The inputs (CudaEmu.PtxProbeMatchesTheIsaLayouts in tests/cuda_emu/test_emu.cu
// rebuilds the expected lines from these and the PTX ISA's layouts):
//   mma.m16n8k16, D = A B + C, with A(r, k) = 16 r + k, B(k, n) = 8 k + n,
//   C(r, n) = -(8 r + n + 1), I the identity (I(k, n) = 1 if k == n) and
//   I8(k, n) = 1 if k == n + 8, five cases:
//     mma.a_cols_0_7  A, I, 0     (D = A's columns 0..7)
//     mma.a_cols_8_15 A, I8, 0    (D = A's columns 8..15)
//     mma.b           I, B, 0     (D = B)
//     mma.c           0, 0, C     (D = C)
//     mma.sum         A, B, C
//   line "<case> lane L d0 v d1 v d2 v d3 v".
//   ldmatrix: a shared tile of 32 rows of 24 bf16 (48 bytes: rows are not
//   contiguous), row s holding 8 s + c in columns c = 0..7 and -1 in the
//   padding; lane l gives the address of row l, so matrix i's row r is row
//   8 i + r and holds 64 i + 8 r + c. Cases x1, x2, x4, x2.trans, x4.trans;
//   line "ldmatrix.<case> lane L r0 lo,hi r1 lo,hi ..." (the two bf16 of each
//   register, the low half first).
//   cp.async: global chunks k = 0..63 of 4 floats 4 k + j. Lane l copies
//   chunk l into shared chunk l (group 0), then chunk 32 + l into shared
//   chunk 32 + l, as zeros where l % 4 == 3 (zfill; group 1); waits for
//   group 0, reads its chunk; waits for group 1, reads its second chunk;
//   after __syncwarp reads lane (l + 1) % 32's first chunk. Line
//   "cp.async lane L group0 a b c d group1 a b c d next a b c d".
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cuda/ptx.cuh"

namespace {

namespace ptx = wiola::cuda::ptx;

constexpr int kMmaCases = 5;
const char* const kMmaNames[kMmaCases] = {"mma.a_cols_0_7", "mma.a_cols_8_15", "mma.b", "mma.c", "mma.sum"};
constexpr int kLdCases = 5;
const char* const kLdNames[kLdCases] = {"ldmatrix.x1", "ldmatrix.x2", "ldmatrix.x4", "ldmatrix.x2.trans",
                                        "ldmatrix.x4.trans"};
const int kLdRegs[kLdCases] = {1, 2, 4, 2, 4};
constexpr int kTileStride = 24;  // bf16 a tile row: 8 values, 16 of padding

// ---- kernels: one warp each ------------------------------------------------------------
// Block b runs mma case b: A (16 x 16), B (16 x 8), C (16 x 8) row-major in
// fp32, made into this lane's fragments as the PTX ISA lays them out; out:
// each lane's d[0..3].
__global__ void k_probe_mma(const float* a_all, const float* b_all, const float* c_all, float* out) {
  const float* A = a_all + blockIdx.x * 256;
  const float* B = b_all + blockIdx.x * 128;
  const float* C = c_all + blockIdx.x * 128;
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  uint32_t a[4], b[2];
  float c[4], d[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i % 2) * 8, col = 2 * t + (i / 2) * 8;  // a[1]: rows + 8; a[2]: columns + 8
    a[i] = ptx::pack_bf16(A[row * 16 + col], A[row * 16 + col + 1]);
  }
  for (int i = 0; i < 2; ++i) b[i] = ptx::pack_bf16(B[(2 * t + 8 * i) * 8 + g], B[(2 * t + 8 * i + 1) * 8 + g]);
  for (int i = 0; i < 4; ++i) c[i] = C[(g + (i / 2) * 8) * 8 + 2 * t + i % 2];
  ptx::mma_bf16_16816(d, a, b, c);
  for (int i = 0; i < 4; ++i) out[(blockIdx.x * 32 + lane) * 4 + i] = d[i];
}

// out[(case * 32 + lane) * 4 + i]: register i of each ldmatrix case.
__global__ void k_probe_ldmatrix(uint32_t* out) {
  __shared__ __align__(16) __nv_bfloat16 tile[32 * kTileStride];
  const int lane = threadIdx.x;
  for (int c = 0; c < kTileStride; ++c)
    tile[lane * kTileStride + c] = __float2bfloat16(c < 8 ? float(8 * lane + c) : -1.f);  // -1: padding
  __syncwarp();
  const void* row = &tile[lane * kTileStride];
  uint32_t x1[1], x2[2], x4[4], x2t[2], x4t[4];
  ptx::ldmatrix_x1(x1, row);
  ptx::ldmatrix_x2(x2, row);
  ptx::ldmatrix_x4(x4, row);
  ptx::ldmatrix_x2_trans(x2t, row);
  ptx::ldmatrix_x4_trans(x4t, row);
  auto put = [&](int k, const uint32_t* r, int n) {
    for (int i = 0; i < n; ++i) out[(k * 32 + lane) * 4 + i] = r[i];
  };
  put(0, x1, 1);
  put(1, x2, 2);
  put(2, x4, 4);
  put(3, x2t, 2);
  put(4, x4t, 4);
}

// src: 64 chunks of 4 floats; out[lane * 12 + ...]: group 0's chunk, group
// 1's, the next lane's group-0 chunk.
__global__ void k_probe_cp_async(const float* src, float* out) {
  __shared__ __align__(16) float sm[64 * 4];
  const int lane = threadIdx.x;
  ptx::cp_async_16(&sm[lane * 4], &src[lane * 4]);
  ptx::cp_async_commit();
  ptx::cp_async_16_zfill(&sm[(32 + lane) * 4], &src[(32 + lane) * 4], lane % 4 != 3);
  ptx::cp_async_commit();
  ptx::cp_async_wait<1>();
  for (int j = 0; j < 4; ++j) out[lane * 12 + j] = sm[lane * 4 + j];
  ptx::cp_async_wait<0>();
  for (int j = 0; j < 4; ++j) out[lane * 12 + 4 + j] = sm[(32 + lane) * 4 + j];
  __syncwarp();
  for (int j = 0; j < 4; ++j) out[lane * 12 + 8 + j] = sm[(lane + 1) % 32 * 4 + j];
}

// ---- the host side ------------------------------------------------------------------------
[[noreturn]] void cuda_fail(const char* what, cudaError_t e) {
  std::fprintf(stderr, "ptx_probe: %s: %s: %s\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
  std::exit(2);
}
void check(const char* what, cudaError_t e) {
  if (e != cudaSuccess) cuda_fail(what, e);
}
// A launch's error, or its fault once it has run.
void check_launch(const char* kernel) {
  check(kernel, cudaGetLastError());
  check(kernel, cudaDeviceSynchronize());
}

template <class T>
T* to_device(const std::vector<T>& h) {
  void* p = nullptr;
  check("cudaMalloc", cudaMalloc(&p, h.size() * sizeof(T)));
  check("cudaMemcpy", cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return static_cast<T*>(p);
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  check("cudaMemcpy", cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

float bf16_to_float(uint32_t bits16) {
  const uint32_t u = bits16 << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void probe_mma(std::vector<std::string>& lines) {
  std::vector<float> a(kMmaCases * 256, 0.f), b(kMmaCases * 128, 0.f), c(kMmaCases * 128, 0.f);
  auto A = [&](int k, int r, int col) -> float& { return a[size_t(k * 256 + r * 16 + col)]; };
  auto B = [&](int k, int r, int n) -> float& { return b[size_t(k * 128 + r * 8 + n)]; };
  auto C = [&](int k, int r, int n) -> float& { return c[size_t(k * 128 + r * 8 + n)]; };
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 16; ++k) {
      A(0, r, k) = A(1, r, k) = A(4, r, k) = float(16 * r + k);
      A(2, r, k) = r == k ? 1.f : 0.f;
    }
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) {
      B(0, k, n) = k == n ? 1.f : 0.f;
      B(1, k, n) = k == n + 8 ? 1.f : 0.f;
      B(2, k, n) = B(4, k, n) = float(8 * k + n);
      C(3, k, n) = C(4, k, n) = -float(8 * k + n + 1);
    }
  float *da = to_device(a), *db = to_device(b), *dc = to_device(c);
  float* dout = to_device(std::vector<float>(kMmaCases * 32 * 4, 0.f));
  k_probe_mma<<<kMmaCases, 32>>>(da, db, dc, dout);
  check_launch("k_probe_mma");
  const std::vector<float> out = to_host(dout, kMmaCases * 32 * 4);
  for (float* p : {da, db, dc, dout}) cudaFree(p);
  for (int k = 0; k < kMmaCases; ++k)
    for (int l = 0; l < 32; ++l) {
      const float* d = &out[size_t((k * 32 + l) * 4)];
      lines.push_back(format("%s lane %d d0 %.9g d1 %.9g d2 %.9g d3 %.9g", kMmaNames[k], l, d[0], d[1], d[2], d[3]));
    }
}

void probe_ldmatrix(std::vector<std::string>& lines) {
  uint32_t* dout = to_device(std::vector<uint32_t>(kLdCases * 32 * 4, 0));
  k_probe_ldmatrix<<<1, 32>>>(dout);
  check_launch("k_probe_ldmatrix");
  const std::vector<uint32_t> out = to_host(dout, kLdCases * 32 * 4);
  cudaFree(dout);
  for (int k = 0; k < kLdCases; ++k)
    for (int l = 0; l < 32; ++l) {
      std::string line = format("%s lane %d", kLdNames[k], l);
      for (int i = 0; i < kLdRegs[k]; ++i) {
        const uint32_t r = out[size_t((k * 32 + l) * 4 + i)];
        line += format(" r%d %.9g,%.9g", i, bf16_to_float(r & 0xffffu), bf16_to_float(r >> 16));
      }
      lines.push_back(line);
    }
}

void probe_cp_async(std::vector<std::string>& lines) {
  std::vector<float> src(64 * 4);
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
  float* dsrc = to_device(src);
  float* dout = to_device(std::vector<float>(32 * 12, 0.f));
  k_probe_cp_async<<<1, 32>>>(dsrc, dout);
  check_launch("k_probe_cp_async");
  const std::vector<float> out = to_host(dout, 32 * 12);
  cudaFree(dsrc);
  cudaFree(dout);
  for (int l = 0; l < 32; ++l) {
    const float* v = &out[size_t(l * 12)];
    lines.push_back(format("cp.async lane %d group0 %.9g %.9g %.9g %.9g group1 %.9g %.9g %.9g %.9g next %.9g %.9g "
                           "%.9g %.9g",
                           l, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]));
  }
}

std::vector<std::string> probe() {
  std::vector<std::string> lines;
  probe_mma(lines);
  probe_ldmatrix(lines);
  probe_cp_async(lines);
  return lines;
}

int dump(const std::vector<std::string>& lines, const char* path) {
  std::ofstream f(path);
  for (const auto& l : lines) f << l << '\n';
  if (!f.flush()) {
    std::fprintf(stderr, "ptx_probe: cannot write %s\n", path);
    return 2;
  }
  std::printf("ptx_probe: %zu lines written to %s\n", lines.size(), path);
  return 0;
}

int compare(const std::vector<std::string>& lines, const char* path) {
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "ptx_probe: cannot read %s\n", path);
    return 2;
  }
  std::vector<std::string> theirs;
  for (std::string l; std::getline(f, l);) theirs.push_back(l);
  size_t differ = 0;
  for (size_t i = 0; i < std::max(lines.size(), theirs.size()); ++i) {
    const std::string here = i < lines.size() ? lines[i] : "(none)", there = i < theirs.size() ? theirs[i] : "(none)";
    if (here == there) continue;
    if (++differ <= 50) std::printf("line %zu differs:\n  here: %s\n  file: %s\n", i + 1, here.c_str(), there.c_str());
  }
  std::printf("ptx_probe: %zu lines here, %zu in %s: %zu differ -> %s\n", lines.size(), theirs.size(), path, differ,
              differ ? "FAIL" : "PASS");
  return differ ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "--dump" && mode != "--compare") {
    std::fprintf(stderr, "usage: %s --dump FILE | --compare FILE\n", argv[0]);
    return 2;
  }
  cudaDeviceProp prop;
  check("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, 0));
  std::printf("ptx_probe: device %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  const std::vector<std::string> lines = probe();
  return mode == "--dump" ? dump(lines, argv[2]) : compare(lines, argv[2]);
}
