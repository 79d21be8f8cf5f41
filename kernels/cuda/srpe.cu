// SRPE rotation on the GPU from the host-computed table, alone or fused with
// the split of the fused Q|K|V|gate projection output and with the join of
// its gradient (the fused kernels write the rotated q and k, SRPE's output).
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "util/error.h"

namespace wiola::cuda {
namespace {

// One SRPE pair (x[j], x[j + dh/2]) = (a, b) by the table's (c, s), or by
// its transpose. Each product and sum rounded on its own (no FMA
// contraction), so k_srpe_apply and the fused split kernels give the same bits
// whatever nvcc would contract in each, and the CPU's fp32 ones.
__device__ __forceinline__ void srpe_pair(float a, float b, float c, float s, bool inverse, float& lo, float& hi) {
  if (!inverse) {
    lo = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    hi = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  } else {
    lo = __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    hi = __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

template <class E>
__global__ void k_srpe_apply(E* x, int B, int Tn, int nh, int dh, const float* table, bool inverse) {
  const int half = dh / 2;
  const size_t n = size_t(B) * Tn * nh * half;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int j = int(i % half);
    const size_t rh = i / half;  // (b, t, h)
    const int t = int((rh / nh) % Tn);
    E* v = x + rh * dh;
    const float c = table[(size_t(t) * half + j) * 2], s = table[(size_t(t) * half + j) * 2 + 1];
    float lo, hi;
    srpe_pair(ld(v + j), ld(v + j + half), c, s, inverse, lo, hi);
    st(v + j, lo);
    st(v + j + half, hi);
  }
}

// K consecutive elements of storage E: K == 1 one by one, else as 16-byte
// pieces (the address a multiple of 16 bytes).
template <class E, int K>
__device__ __forceinline__ void load_k(const E* p, float (&v)[K]) {
  if constexpr (K == 1) {
    v[0] = ld(p);
  } else {
    map_detail::Pack<E, K> b;
    const uint4* src = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = 0.f;
    if (!map_detail::vector_access_ok(src)) return;
#pragma unroll
    for (int c = 0; c < int(sizeof b.u / 16); ++c) b.u[c] = src[c];
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = ld(&b.e[k]);
  }
}
template <class E, int K>
__device__ __forceinline__ void store_k(E* p, const float (&v)[K]) {
  if constexpr (K == 1) {
    st(p, v[0]);
  } else {
    map_detail::Pack<E, K> b;
#pragma unroll
    for (int k = 0; k < K; ++k) st(&b.e[k], v[k]);
    uint4* dst = reinterpret_cast<uint4*>(p);
    if (!map_detail::vector_access_ok(dst)) return;
#pragma unroll
    for (int c = 0; c < int(sizeof b.u / 16); ++c) dst[c] = b.u[c];
  }
}
// The bytes of K elements, unchanged (copy_block's bits, NaN payloads too).
template <class E, int K>
__device__ __forceinline__ void copy_k(const E* src, E* dst) {
  if constexpr (K == 1) {
    *dst = *src;
  } else {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    if (!map_detail::vector_access_ok(s) || !map_detail::vector_access_ok(d)) return;
#pragma unroll
    for (int c = 0; c < int(K * sizeof(E) / 16); ++c) d[c] = s[c];
  }
}

// SRPE fused with the split of the fused Q|K|V|gate projection output
// (kJoin false: fused -> q, k rotated, v, gate copied) or with the join of
// their gradients (kJoin true: dq, dk rotated back, dv, dgate -> fused). The
// fused rows hold 2 (H + Hkv) heads of dh columns, q's H, k's Hkv, v's Hkv,
// the gate's H. A thread moves K consecutive pairs (j, j + dh/2) of one
// head: K = 16 bytes of E where every head starts on a 16-byte boundary
// (one 16-byte load and store per half), else 1; the pairs go through
// srpe_pair as in k_srpe_apply, element by element (the same bits). Row r =
// b Tn + t takes the table row of its position: t, or t - doc_start[r] with
// documents (doc_start may be null; docs/model.md §2 "Documents").
template <class E, int K, bool kJoin>
__global__ void k_srpe_split(E* fused, int B, int Tn, int H, int Hkv, int dh, const float* table,
                             const int32_t* doc_start, E* q, E* k, E* v, E* g) {
  const int half = dh / 2, per_head = half / K, nheads = 2 * (H + Hkv);
  const size_t width = size_t(nheads) * dh;
  const size_t n = size_t(B) * Tn * nheads * per_head;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int j = int(i % per_head) * K;
    const size_t rh = i / per_head;  // (row, head of the fused row)
    const int hh = int(rh % nheads);
    const size_t r = rh / nheads;
    E* part;
    if (hh < H) part = q + (r * H + hh) * dh;
    else if (hh < H + Hkv) part = k + (r * Hkv + (hh - H)) * dh;
    else if (hh < H + 2 * Hkv) part = v + (r * Hkv + (hh - H - Hkv)) * dh;
    else part = g + (r * H + (hh - H - 2 * Hkv)) * dh;
    part += j;
    E* whole = fused + r * width + size_t(hh) * dh + j;
    const E* src = kJoin ? part : whole;
    E* dst = kJoin ? whole : part;
    if (hh >= H + Hkv) {  // v and the gate: copied
      copy_k<E, K>(src, dst);
      copy_k<E, K>(src + half, dst + half);
      continue;
    }
    float a[K], b[K], lo[K], hi[K];
    load_k<E, K>(src, a);
    load_k<E, K>(src + half, b);
    const size_t pos = r % size_t(Tn) - (doc_start ? size_t(doc_start[r]) : 0);
    const float* tab = table + (pos * half + j) * 2;
#pragma unroll
    for (int e = 0; e < K; ++e) srpe_pair(a[e], b[e], tab[2 * e], tab[2 * e + 1], kJoin, lo[e], hi[e]);
    store_k<E, K>(dst, lo);
    store_k<E, K>(dst + half, hi);
  }
}

}  // namespace

void srpe_apply(Ctx c, Ptr x, int B, int Tn, int nh, int dh, CPtr table, bool inverse) {
  WIOLA_CHECK(dh % 2 == 0, "srpe_apply: head dim ", dh, " is odd");
  dispatch(x.dtype(), "srpe_apply", [&](auto e) {
    using E = decltype(e);
    k_srpe_apply<E><<<grid_for(size_t(B) * Tn * nh * (dh / 2)), kThreads, 0, c.s>>>(dev<E>(x), B, Tn, nh, dh,
                                                                                    dev<float>(table), inverse);
  });
  after_launch("srpe_apply");
}

namespace {
// k_srpe_split over B Tn rows, 16 bytes a thread where every pointer and
// head start allows it.
template <bool kJoin>
void srpe_split(Ctx c, const char* op, DType t, void* fused, int B, int Tn, int H, int Hkv, int dh, CPtr table,
                const int32_t* doc_start, void* q, void* k, void* v, void* g) {
  dispatch(t, op, [&](auto e) {
    using E = decltype(e);
    constexpr int W = int(16 / sizeof(E));
    auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = (dh / 2) % W == 0 && a16(fused) && a16(q) && a16(k) && a16(v) && a16(g);
    const size_t pairs = size_t(B) * Tn * size_t(2 * (H + Hkv)) * size_t(dh / 2);
    auto launch = [&](auto kk) {
      constexpr int K = decltype(kk)::value;
      k_srpe_split<E, K, kJoin><<<grid_for(pairs / K), kThreads, 0, c.s>>>(
          static_cast<E*>(fused), B, Tn, H, Hkv, dh, dev<float>(table), doc_start, static_cast<E*>(q),
          static_cast<E*>(k), static_cast<E*>(v), static_cast<E*>(g));
    };
    if (vec) launch(std::integral_constant<int, W>{});
    else launch(std::integral_constant<int, 1>{});
  });
  after_launch(op);
}
}  // namespace

// SRPE fused with the Q|K|V|gate split and with its gradients' join: one
// kernel (k_srpe_split) each way, no copies; with documents (doc_start, a
// device array) each row rotates by its position in its document.
void srpe_split_fwd(Ctx c, CPtr proj, int B, int Tn, int H, int Hkv, int dh, CPtr table, const int32_t* doc_start,
                    Ptr q, Ptr k, Ptr v, Ptr gate) {
  WIOLA_CHECK(dh % 2 == 0, "srpe_split_fwd: head dim ", dh, " is odd");
  const DType t = proj.dtype();
  WIOLA_CHECK(q.dtype() == t && k.dtype() == t && v.dtype() == t && gate.dtype() == t,
              "cuda srpe_split_fwd: q, k, v, gate not all ", dtype_name(t));
  srpe_split<false>(c, "srpe_split_fwd", t, const_cast<void*>(proj.raw()), B, Tn, H, Hkv, dh, table, doc_start, q.raw(),
                    k.raw(), v.raw(), gate.raw());
}
void srpe_split_bwd(Ctx c, CPtr dq, CPtr dk, CPtr dv, CPtr dgate, int B, int Tn, int H, int Hkv, int dh, CPtr table,
                    const int32_t* doc_start, Ptr dproj) {
  WIOLA_CHECK(dh % 2 == 0, "srpe_split_bwd: head dim ", dh, " is odd");
  const DType t = dproj.dtype();
  WIOLA_CHECK(dq.dtype() == t && dk.dtype() == t && dv.dtype() == t && dgate.dtype() == t,
              "cuda srpe_split_bwd: dq, dk, dv, dgate not all ", dtype_name(t));
  // The kernel only reads the parts here (kJoin): their pointers lose const
  // to share one kernel with the forward, which writes them.
  srpe_split<true>(c, "srpe_split_bwd", t, dproj.raw(), B, Tn, H, Hkv, dh, table, doc_start,
                   const_cast<void*>(dq.raw()), const_cast<void*>(dk.raw()), const_cast<void*>(dv.raw()),
                   const_cast<void*>(dgate.raw()));
}

}  // namespace wiola::cuda
