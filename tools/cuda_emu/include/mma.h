// nvcuda::wmma for the emulator (tools/cuda_emu/emu.h). A fragment holds the
// whole 16x16 tile, so it needs no lane layout: the kernels only move whole
// fragments (load, fill, mma, store), never their elements. Loads and stores
// are warp-collective: all lanes arrive before any lane reads or writes, as
// the converged warp does. Lane 0 alone does the work (every lane would hold
// the same tile; the others' copies are never read). mma_sync multiplies in
// fp32, k in order.
#pragma once

#include <type_traits>

#include "cuda_bf16.h"
#include "tools/cuda_emu/emu.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = rows * cols;
  T x[num_elements];
};

template <class Use, int M, int N, int K, class T, class L, class V>
void fill_fragment(fragment<Use, M, N, K, T, L>& f, V v) {
  if (::wiola_emu::lane_id() != 0) return;
  for (auto& e : f.x) e = T(v);
}

// Operand tiles: element (r, c) at p[r * ldm + c] (row_major) or p[c * ldm + r].
template <class Use, int M, int N, int K, class T, class L>
void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "accumulator loads take a layout");
  __syncwarp();
  if (::wiola_emu::lane_id() != 0) return;
  using F = fragment<Use, M, N, K, T, L>;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] = std::is_same_v<L, row_major> ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
}
template <int M, int N, int K, class T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm, layout_t l) {
  __syncwarp();
  if (::wiola_emu::lane_id() != 0) return;
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      f.x[r * N + c] = l == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
}
template <int M, int N, int K, class T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t l) {
  __syncwarp();
  if (::wiola_emu::lane_id() != 0) return;
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) (l == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = f.x[r * N + c];
}

template <int M, int N, int K, class TA, class LA, class LB, class TC>
void mma_sync(fragment<accumulator, M, N, K, TC>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TA, LB>& b, const fragment<accumulator, M, N, K, TC>& c) {
  if (::wiola_emu::lane_id() != 0) return;
  TC out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float acc = float(c.x[i * N + j]);
      for (int k = 0; k < K; ++k) acc += float(a.x[i * K + k]) * float(b.x[k * N + j]);
      out[i * N + j] = TC(acc);
    }
  for (int e = 0; e < M * N; ++e) d.x[e] = out[e];
}

}  // namespace nvcuda::wmma
