// GCLA and ATM pieces on the GPU: SRPE rotation from the host-computed table
// (alone, or fused with the split of the fused Q|K|V|gate projection output
// and with the join of its gradient),
// prefix-mean summaries (chunked scans over positions per column, in double),
// the context sub-attention (one warp per token and KV group, so the heads of
// a group sum their key/value gradients in a fixed order), and ATM's
// similarity, plan (kernels/atm_plan.h, one thread per sequence) and merged
// rows.
#include <cstdint>
#include <type_traits>

#include "kernels/atm_plan.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "util/error.h"

namespace wiola::cuda {
namespace {

// One SRPE pair (x[j], x[j + dh/2]) = (a, b) by the table's (c, s), or by
// its transpose. Each product and sum rounded on its own (no FMA
// contraction), so k_srpe and the fused split kernels give the same bits
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
__global__ void k_srpe(E* x, int B, int Tn, int nh, int dh, const float* table, bool inverse) {
  const int half = dh / 2;
  const size_t n = size_t(B) * Tn * nh * half;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int j = int(i % half);
    const size_t rh = i / half;         // (b, t, h)
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
// srpe_pair as in k_srpe, element by element (the same bits).
template <class E, int K, bool kJoin>
__global__ void k_srpe_split(E* fused, int B, int Tn, int H, int Hkv, int dh, const float* table, E* q, E* k, E* v,
                             E* g) {
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
    const float* tab = table + (size_t(r % size_t(Tn)) * half + j) * 2;
#pragma unroll
    for (int e = 0; e < K; ++e) srpe_pair(a[e], b[e], tab[2 * e], tab[2 * e + 1], kJoin, lo[e], hi[e]);
    store_k<E, K>(dst, lo);
    store_k<E, K>(dst + half, hi);
  }
}

// Prefix-mean scans over positions, per (sequence, column), in double. A block
// takes 32 columns and splits the positions into 32 chunks (one thread each):
// each thread sums its chunk, the block adds up the chunks before (forward) or
// after (backward) it, and each thread rescans its chunk from that offset. A
// serial loop over T = 2048 per column left most of the GPU idle and waited on
// each load in turn. The sums' order is fixed by (T, chunking): deterministic.
constexpr int kScanCols = 32, kScanChunks = 32;

// This thread's column j of sequence b (active: j < d) and its chunk [t0, t1)
// of the positions.
struct ScanChunk {
  int j, b, t0, t1;
  bool active;
  __device__ ScanChunk(int Tn, int d) {
    j = blockIdx.x * kScanCols + threadIdx.x, b = blockIdx.y, active = j < d;
    const int len = (Tn + kScanChunks - 1) / kScanChunks;
    t0 = min(Tn, int(threadIdx.y) * len), t1 = min(Tn, t0 + len);
  }
};

// Sums of each thread's chunk of its column into sums[chunk][col], and the
// offset from the other chunks of the column: chunks before it (forward,
// starting from `start`) or after it (backward).
template <bool kBackward, class Term>
__device__ double scan_offset(double (*sums)[kScanCols], const ScanChunk& ch, double start, Term term) {
  double part = 0;
  if (ch.active) {
#pragma unroll 8
    for (int t = ch.t0; t < ch.t1; ++t) part += term(t);
  }
  sums[threadIdx.y][threadIdx.x] = part;
  __syncthreads();
  double off = start;
  if (kBackward) {
    for (int c = kScanChunks - 1; c > int(threadIdx.y); --c) off += sums[c][threadIdx.x];
  } else {
    for (int c = 0; c < int(threadIdx.y); ++c) off += sums[c][threadIdx.x];
  }
  return off;
}

// out_op (may be null): out again in storage O, as convert(out, out_op)
// would round it (the context projections' GEMM operand).
template <class R, class O>
__global__ void __launch_bounds__(kScanCols* kScanChunks)
    k_prefix_fwd(const R* x, int B, int Tn, int d, int pos0, R* carry, R* out, O* out_op) {
  __shared__ double sums[kScanChunks][kScanCols];
  const ScanChunk ch(Tn, d);
  const R* xc = x + size_t(ch.b) * Tn * d + ch.j;
  const double start = carry && ch.active ? double(ld(carry + size_t(ch.b) * d + ch.j)) : 0.0;
  double acc = scan_offset<false>(sums, ch, start, [&](int t) { return double(ld(xc + size_t(t) * d)); });
  if (!ch.active) return;
  for (int t = ch.t0; t < ch.t1; ++t) {
    acc += double(ld(xc + size_t(t) * d));
    const size_t i = (size_t(ch.b) * Tn + t) * d + ch.j;
    const float v = float(acc / double(pos0 + t + 1));
    st(out + i, v);
    if (out_op) st(out_op + i, as_stored<R>(v));
  }
  if (carry && threadIdx.y == kScanChunks - 1) st(carry + size_t(ch.b) * d + ch.j, float(acc));
}
template <class R>
__global__ void __launch_bounds__(kScanCols* kScanChunks) k_prefix_bwd(const R* dout, int B, int Tn, int d, R* dx) {
  __shared__ double sums[kScanChunks][kScanCols];
  const ScanChunk ch(Tn, d);
  const R* gc = dout + size_t(ch.b) * Tn * d + ch.j;
  auto term = [&](int t) { return double(ld(gc + size_t(t) * d)) / double(t + 1); };
  double acc = scan_offset<true>(sums, ch, 0.0, term);
  if (!ch.active) return;
  for (int t = ch.t1 - 1; t >= ch.t0; --t) {
    acc += term(t);
    R* p = dx + (size_t(ch.b) * Tn + t) * d + ch.j;
    st(p, float(double(ld(p)) + acc));
  }
}
inline dim3 scan_grid(int B, int d) { return dim3(unsigned((d + kScanCols - 1) / kScanCols), unsigned(B)); }
inline dim3 scan_block() { return dim3(kScanCols, kScanChunks); }

constexpr int kMaxDhPerLane = 8;  // head dims up to 256
constexpr int kMaxCtx = 16;

// One warp per (token n, head h).
template <class A>
__global__ void k_ctx_fwd(const A* q, const A* kc, const A* vc, int N, int nc, int H, int Hkv, int dh, A* out,
                          float* probs) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= N * H) return;
  const int n = warp / H, h = warp % H, g = h % Hkv;
  const float scale = rsqrtf(float(dh));
  const A* qr = q + (size_t(n) * H + h) * dh;
  float sc[kMaxCtx];
  float m = -INFINITY;
  for (int i = 0; i < nc; ++i) {
    const A* kr = kc + ((size_t(n) * nc + i) * Hkv + g) * dh;
    float s = 0.f;
    for (int e = lane; e < dh; e += 32) s += ld(qr + e) * ld(kr + e);
    sc[i] = warp_sum(s) * scale;
    m = fmaxf(m, sc[i]);
  }
  float l = 0.f;
  for (int i = 0; i < nc; ++i) {
    sc[i] = __expf(sc[i] - m);
    l += sc[i];
  }
  for (int i = 0; i < nc; ++i) {
    sc[i] /= l;
    if (lane == 0) probs[(size_t(n) * H + h) * nc + i] = sc[i];
  }
  for (int e = lane; e < dh; e += 32) {
    float o = 0.f;
    for (int i = 0; i < nc; ++i) o += sc[i] * ld(vc + ((size_t(n) * nc + i) * Hkv + g) * dh + e);
    st(out + (size_t(n) * H + h) * dh + e, o);
  }
}

// One warp per (token n, KV group g): loops over the heads of the group, so
// dkc/dvc rows have one writer and sum the heads in a fixed order.
template <class A>
__global__ void k_ctx_bwd(const A* q, const A* kc, const A* vc, const float* probs, const A* dout, int N, int nc,
                          int H, int Hkv, int dh, A* dq, A* dkc, A* dvc) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= N * Hkv) return;
  const int n = warp / Hkv, g = warp % Hkv;
  const float scale = rsqrtf(float(dh));
  float dk[kMaxCtx][kMaxDhPerLane], dv[kMaxCtx][kMaxDhPerLane];
  for (int i = 0; i < nc; ++i)
    for (int e = 0; e < kMaxDhPerLane; ++e) dk[i][e] = dv[i][e] = 0.f;
  for (int h = g; h < H; h += Hkv) {
    const A* qr = q + (size_t(n) * H + h) * dh;
    const A* dor = dout + (size_t(n) * H + h) * dh;
    const float* p = probs + (size_t(n) * H + h) * nc;
    float dp[kMaxCtx];
    float dot = 0.f;
    for (int i = 0; i < nc; ++i) {
      const A* vr = vc + ((size_t(n) * nc + i) * Hkv + g) * dh;
      float s = 0.f;
      for (int e = lane; e < dh; e += 32) s += ld(dor + e) * ld(vr + e);
      dp[i] = warp_sum(s);
      dot += p[i] * dp[i];
    }
    for (int e = lane, k = 0; e < dh; e += 32, ++k) {
      float acc = 0.f;
      const float qv = ld(qr + e), dov = ld(dor + e);
      for (int i = 0; i < nc; ++i) {
        const float ds = p[i] * (dp[i] - dot) * scale;
        acc += ds * ld(kc + ((size_t(n) * nc + i) * Hkv + g) * dh + e);
        dk[i][k] += ds * qv;
        dv[i][k] += p[i] * dov;
      }
      A* dqp = dq + (size_t(n) * H + h) * dh + e;
      st(dqp, ld(dqp) + acc);  // dq accumulates (it also feeds self-attention)
    }
  }
  for (int i = 0; i < nc; ++i)
    for (int e = lane, k = 0; e < dh; e += 32, ++k) {
      const size_t r = ((size_t(n) * nc + i) * Hkv + g) * dh + e;
      st(dkc + r, dk[i][k]);
      st(dvc + r, dv[i][k]);
    }
}

// One block per neighbour pair (b, t), t < Tn-1; sums in double.
template <class E>
__global__ void k_atm_sim(const E* x, int Tn, int d, double* rho) {
  const int b = blockIdx.y, t = blockIdx.x;
  const E* a = x + (size_t(b) * Tn + t) * d;
  const E* c = a + d;
  double s = 0, na = 0, nb = 0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const double u = ld(a + j), v = ld(c + j);
    s += u * v;
    na += u * u;
    nb += v * v;
  }
  s = block_sum(s);
  na = block_sum(na);
  nb = block_sum(nb);
  if (threadIdx.x == 0) {
    const double n0 = sqrt(na), n1 = sqrt(nb);
    rho[size_t(b) * (Tn - 1) + t] = (n0 > 0 && n1 > 0) ? s / (n0 * n1) : 0.0;
  }
}
__global__ void k_atm_plan(const double* rho, int B, int Tn, double tau, uint8_t* open, int32_t* group_first,
                           int32_t* key_end, int32_t* n_groups) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  uint8_t* ob = open + size_t(b) * Tn;
  atm_greedy_row(rho + size_t(b) * (Tn - 1), Tn, tau, ob);
  n_groups[b] = atm_layout_row(ob, Tn, group_first + size_t(b) * Tn, key_end + size_t(b) * Tn);
}
template <class E>
__global__ void k_atm_merge(const E* x, int B, int Tn, int w, const int32_t* gf, const int32_t* ke,
                            const int32_t* ng, E* out) {
  const size_t n = size_t(B) * Tn * w;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / w;
    const int c = int(i % w), b = int(r / Tn), j = int(r % Tn);
    if (j >= ng[b]) {
      st(out + i, 0.f);
      continue;
    }
    const int f = gf[r], e = ke[r];
    float s = 0.f;
    for (int t = f; t <= e; ++t) s += ld(x + (size_t(b) * Tn + t) * w + c);
    st(out + i, s / float(e - f + 1));
  }
}
template <class E>
__global__ void k_atm_merge_bwd(const E* dout, int B, int Tn, int w, const int32_t* gf, const int32_t* ke,
                                const int32_t* ng, E* dx) {
  const size_t n = size_t(B) * Tn * w;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t r = i / w;
    const int c = int(i % w), b = int(r / Tn), j = int(r % Tn);
    if (j >= ng[b]) continue;
    const int f = gf[r], e = ke[r];
    const float v = ld(dout + i) / float(e - f + 1);
    for (int t = f; t <= e; ++t) {  // each member row belongs to exactly one group
      E* p = dx + (size_t(b) * Tn + t) * w + c;
      st(p, ld(p) + v);
    }
  }
}

}  // namespace

void srpe_apply(Ctx c, Ptr x, int B, int Tn, int nh, int dh, CPtr table, bool inverse) {
  dispatch(x.dtype(), "srpe_apply", [&](auto e) {
    using E = decltype(e);
    k_srpe<E><<<grid_for(size_t(B) * Tn * nh * (dh / 2)), kThreads, 0, c.s>>>(dev<E>(x), B, Tn, nh, dh,
                                                                             dev<float>(table), inverse);
  });
  after_launch("srpe_apply");
}

namespace {
// k_srpe_split over B Tn rows, 16 bytes a thread where every pointer and
// head start allows it.
template <bool kJoin>
void srpe_split(Ctx c, const char* op, DType t, void* fused, int B, int Tn, int H, int Hkv, int dh, CPtr table,
                void* q, void* k, void* v, void* g) {
  dispatch(t, op, [&](auto e) {
    using E = decltype(e);
    constexpr int W = int(16 / sizeof(E));
    auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = (dh / 2) % W == 0 && a16(fused) && a16(q) && a16(k) && a16(v) && a16(g);
    const size_t pairs = size_t(B) * Tn * size_t(2 * (H + Hkv)) * size_t(dh / 2);
    auto launch = [&](auto kk) {
      constexpr int K = decltype(kk)::value;
      k_srpe_split<E, K, kJoin><<<grid_for(pairs / K), kThreads, 0, c.s>>>(
          static_cast<E*>(fused), B, Tn, H, Hkv, dh, dev<float>(table), static_cast<E*>(q), static_cast<E*>(k),
          static_cast<E*>(v), static_cast<E*>(g));
    };
    if (vec) launch(std::integral_constant<int, W>{});
    else launch(std::integral_constant<int, 1>{});
  });
  after_launch(op);
}
}  // namespace

void srpe_split_fwd(Ctx c, CPtr proj, int B, int Tn, int H, int Hkv, int dh, CPtr table, Ptr q, Ptr k, Ptr v,
                    Ptr gate) {
  const DType t = proj.dtype();
  WIOLA_CHECK(q.dtype() == t && k.dtype() == t && v.dtype() == t && gate.dtype() == t,
              "cuda srpe_split_fwd: q, k, v, gate not all ", dtype_name(t));
  srpe_split<false>(c, "srpe_split_fwd", t, const_cast<void*>(proj.raw()), B, Tn, H, Hkv, dh, table, q.raw(),
                    k.raw(), v.raw(), gate.raw());
}
void srpe_split_bwd(Ctx c, CPtr dq, CPtr dk, CPtr dv, CPtr dgate, int B, int Tn, int H, int Hkv, int dh, CPtr table,
                    Ptr dproj) {
  const DType t = dproj.dtype();
  WIOLA_CHECK(dq.dtype() == t && dk.dtype() == t && dv.dtype() == t && dgate.dtype() == t,
              "cuda srpe_split_bwd: dq, dk, dv, dgate not all ", dtype_name(t));
  // The kernel only reads the parts here (kJoin): their pointers lose const
  // to share one kernel with the forward, which writes them.
  srpe_split<true>(c, "srpe_split_bwd", t, dproj.raw(), B, Tn, H, Hkv, dh, table, const_cast<void*>(dq.raw()),
                   const_cast<void*>(dk.raw()), const_cast<void*>(dv.raw()), const_cast<void*>(dgate.raw()));
}

void prefix_mean_fwd(Ctx c, CPtr x, int B, int Tn, int d, Ptr out, Ptr out_op) {
  prefix_mean_carry_fwd(c, x, B, Tn, d, 0, nullptr, out, out_op);
}
void prefix_mean_bwd(Ctx c, CPtr dout, int B, int Tn, int d, Ptr dx) {
  dispatch(dx.dtype(), "prefix_mean_bwd", [&](auto e) {
    using R = decltype(e);
    k_prefix_bwd<R><<<scan_grid(B, d), scan_block(), 0, c.s>>>(dev<R>(dout), B, Tn, d, dev<R>(dx));
  });
  after_launch("prefix_mean_bwd");
}
// carry null: the plain prefix mean (prefix_mean_fwd).
void prefix_mean_carry_fwd(Ctx c, CPtr x, int B, int Tn, int d, int pos0, Ptr carry, Ptr out, Ptr out_op) {
  const char* op = carry ? "prefix_mean_carry_fwd" : "prefix_mean_fwd";
  dispatch(x.dtype(), op, [&](auto e) {
    dispatch(out_op ? out_op.dtype() : x.dtype(), op, [&](auto eo) {
      using R = decltype(e);
      using O = decltype(eo);
      k_prefix_fwd<R, O><<<scan_grid(B, d), scan_block(), 0, c.s>>>(dev<R>(x), B, Tn, d, pos0, dev<R>(carry),
                                                                     dev<R>(out), dev<O>(out_op));
    });
  });
  after_launch(op);
}

void ctx_attention_fwd(Ctx c, CPtr q, CPtr kc, CPtr vc, int N, int nc, int H, int Hkv, int dh, Ptr out,
                       Ptr probs) {
  WIOLA_CHECK(nc <= kMaxCtx && dh <= 32 * kMaxDhPerLane, "cuda ctx_attention: nc ", nc, " > ", kMaxCtx,
              " or head dim ", dh, " > ", 32 * kMaxDhPerLane);
  dispatch(q.dtype(), "ctx_attention_fwd", [&](auto e) {
    using A = decltype(e);
    const size_t threads = size_t(N) * H * 32;
    k_ctx_fwd<A><<<grid_for(threads), kThreads, 0, c.s>>>(dev<A>(q), dev<A>(kc), dev<A>(vc), N, nc, H, Hkv, dh,
                                                         dev<A>(out), dev<float>(probs));
  });
  after_launch("ctx_attention_fwd");
}
void ctx_attention_bwd(Ctx c, CPtr q, CPtr kc, CPtr vc, CPtr probs, CPtr dout, int N, int nc, int H, int Hkv,
                       int dh, Ptr dq, Ptr dkc, Ptr dvc) {
  WIOLA_CHECK(nc <= kMaxCtx && dh <= 32 * kMaxDhPerLane, "cuda ctx_attention: nc ", nc, " > ", kMaxCtx,
              " or head dim ", dh, " > ", 32 * kMaxDhPerLane);
  dispatch(q.dtype(), "ctx_attention_bwd", [&](auto e) {
    using A = decltype(e);
    const size_t threads = size_t(N) * Hkv * 32;
    k_ctx_bwd<A><<<grid_for(threads), kThreads, 0, c.s>>>(dev<A>(q), dev<A>(kc), dev<A>(vc), dev<float>(probs),
                                                         dev<A>(dout), N, nc, H, Hkv, dh, dev<A>(dq), dev<A>(dkc),
                                                         dev<A>(dvc));
  });
  after_launch("ctx_attention_bwd");
}

void atm_similarity(Ctx c, CPtr x, int B, int Tn, int d, double* rho) {
  if (Tn < 2 || B <= 0) return;
  dispatch(x.dtype(), "atm_similarity", [&](auto e) {
    using E = decltype(e);
    k_atm_sim<E><<<dim3(Tn - 1, B), kThreads, 0, c.s>>>(dev<E>(x), Tn, d, rho);
  });
  after_launch("atm_similarity");
}
void atm_plan(Ctx c, const double* rho, int B, int Tn, double tau, uint8_t* open, int32_t* group_first,
              int32_t* key_end, int32_t* n_groups) {
  k_atm_plan<<<(B + 63) / 64, 64, 0, c.s>>>(rho, B, Tn, tau, open, group_first, key_end, n_groups);
  after_launch("atm_plan");
}
void atm_merge_rows(Ctx c, CPtr x, int B, int Tn, int w, const int32_t* group_first, const int32_t* key_end,
                    const int32_t* n_groups, Ptr out) {
  dispatch(x.dtype(), "atm_merge_rows", [&](auto e) {
    using E = decltype(e);
    k_atm_merge<E><<<grid_for(size_t(B) * Tn * w), kThreads, 0, c.s>>>(dev<E>(x), B, Tn, w, group_first, key_end,
                                                                      n_groups, dev<E>(out));
  });
  after_launch("atm_merge_rows");
}
void atm_merge_rows_bwd(Ctx c, CPtr dout, int B, int Tn, int w, const int32_t* group_first,
                        const int32_t* key_end, const int32_t* n_groups, Ptr dx) {
  dispatch(dx.dtype(), "atm_merge_rows_bwd", [&](auto e) {
    using E = decltype(e);
    k_atm_merge_bwd<E><<<grid_for(size_t(B) * Tn * w), kThreads, 0, c.s>>>(dev<E>(dout), B, Tn, w, group_first,
                                                                          key_end, n_groups, dev<E>(dx));
  });
  after_launch("atm_merge_rows_bwd");
}

}  // namespace wiola::cuda
