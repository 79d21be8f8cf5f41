// GCLA pieces on the GPU: prefix-mean summaries (chunked scans over positions
// per column, in double), the context sub-attention (one warp per token and
// KV group, so the heads of a group sum their key/value gradients in a fixed
// order), the blend of the self and context outputs and the output gate, and
// the blend fused with the gate. The blend and gate are flat per-element
// maps through vec_map (common.cuh) but for blend_bwd, whose per-thread
// partial sums fix the order of its dL/dphi sum.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/scalar.h"
#include "util/error.h"

namespace wiola::cuda {
namespace {

// Prefix-mean scans over positions, per (sequence, column), in double. A block
// takes 32 columns and splits the positions into 32 chunks (one thread each):
// each thread sums its chunk, the block adds up the chunks before (forward) or
// after (backward) it, and each thread rescans its chunk from that offset. A
// serial loop over T = 2048 per column left most of the GPU idle and waited on
// each load in turn. The sums' order is fixed by (T, chunking): deterministic.
// Documents (kDocs; doc_start, a device array [B, Tn]; docs/model.md §2): the
// scans restart at each position t with doc_start[t] == t. A chunk then
// passes on only the part of its sum that a neighbouring chunk's document
// sees (forward: from its last document start on; backward: before its
// first one), flagged where it holds a start, and a chunk's offset restarts
// at the nearest flagged chunk before it (after it, backward): a segmented
// scan, still O(T) per column.
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

// Shared memory of a scan: the chunks' sums, and with documents whether each
// chunk holds a document start.
template <bool kDocs>
struct ScanShared {
  double sums[kScanChunks][kScanCols];
};
template <>
struct ScanShared<true> {
  double sums[kScanChunks][kScanCols];
  bool cut[kScanChunks];
};

// Sums of each thread's chunk of its column into sums[chunk][col], and the
// offset from the other chunks of the column: chunks before it (forward,
// starting from `start`) or after it (backward). With documents (kDocs) the
// parts the neighbours' documents see, restarting at a chunk with a start;
// starts(t): position t starts a document.
template <bool kBackward, bool kDocs, class Term, class Starts>
__device__ double scan_offset(ScanShared<kDocs>& sh, const ScanChunk& ch, double start, Term term, Starts starts) {
  double part = 0;
  bool cut = false;
  if (ch.active) {
#pragma unroll 8
    for (int t = ch.t0; t < ch.t1; ++t) {
      if constexpr (kDocs) {
        if (starts(t)) {
          cut = true;
          if (!kBackward) part = 0;  // forward: only from the last start on
        }
        if (kBackward && cut) continue;  // backward: only before the first start
      }
      part += term(t);
    }
  }
  sh.sums[threadIdx.y][threadIdx.x] = part;
  if constexpr (kDocs) {  // the starts are the sequence's: any active column's
    if (threadIdx.x == 0) sh.cut[threadIdx.y] = cut;
  }
  __syncthreads();
  double off = start;
  auto add = [&](int c) {
    if constexpr (kDocs) off = sh.cut[c] ? sh.sums[c][threadIdx.x] : off + sh.sums[c][threadIdx.x];
    else off += sh.sums[c][threadIdx.x];
  };
  if (kBackward) {
    for (int c = kScanChunks - 1; c > int(threadIdx.y); --c) add(c);
  } else {
    for (int c = 0; c < int(threadIdx.y); ++c) add(c);
  }
  return off;
}

// out_op (may be null): out again in storage O, as convert(out, out_op)
// would round it (the context projections' GEMM operand). kDocs: the means
// restart at each document (doc_start; no carry, pos0 0).
// (clang-format 14 reads a product in __launch_bounds__ as a pointer)
// clang-format off
template <class R, class O, bool kDocs>
__global__ void __launch_bounds__(kScanCols * kScanChunks)
    k_prefix_mean_fwd(const R* x, int B, int Tn, int d, int pos0, const int32_t* doc_start, R* carry, R* out,
                      O* out_op) {
  // clang-format on
  __shared__ ScanShared<kDocs> sh;
  const ScanChunk ch(Tn, d);
  const R* xc = x + size_t(ch.b) * Tn * d + ch.j;
  const int32_t* ds = kDocs ? doc_start + size_t(ch.b) * Tn : nullptr;
  auto starts = [&](int t) { return ds[t] == t; };
  const double start = carry && ch.active ? double(ld(carry + size_t(ch.b) * d + ch.j)) : 0.0;
  auto term = [&](int t) { return double(ld(xc + size_t(t) * d)); };
  double acc = scan_offset<false>(sh, ch, start, term, starts);
  if (!ch.active) return;
  for (int t = ch.t0; t < ch.t1; ++t) {
    int first = 0;  // the first position of t's document
    if constexpr (kDocs) {
      first = ds[t];
      if (first == t) acc = 0;
    }
    acc += term(t);
    const size_t i = (size_t(ch.b) * Tn + t) * d + ch.j;
    const float v = float(acc / double(pos0 + t + 1 - first));
    st(out + i, v);
    if (out_op) st(out_op + i, as_stored<R>(v));
  }
  if (carry && threadIdx.y == kScanChunks - 1) st(carry + size_t(ch.b) * d + ch.j, float(acc));
}
// (clang-format 14 reads a product in __launch_bounds__ as a pointer)
// kDocs: dx[u] sums over t in u's document, each dout[t] divided by t's
// count t - doc_start[t] + 1.
// clang-format off
template <class R, bool kDocs>
__global__ void __launch_bounds__(kScanCols * kScanChunks)
    k_prefix_mean_bwd(const R* dout, int B, int Tn, int d, const int32_t* doc_start, R* dx) {
  // clang-format on
  __shared__ ScanShared<kDocs> sh;
  const ScanChunk ch(Tn, d);
  const R* gc = dout + size_t(ch.b) * Tn * d + ch.j;
  const int32_t* ds = kDocs ? doc_start + size_t(ch.b) * Tn : nullptr;
  auto starts = [&](int t) { return ds[t] == t; };
  auto term = [&](int t) { return double(ld(gc + size_t(t) * d)) / double(t + 1 - (kDocs ? ds[t] : 0)); };
  double acc = scan_offset<true>(sh, ch, 0.0, term, starts);
  if (!ch.active) return;
  for (int t = ch.t1 - 1; t >= ch.t0; --t) {
    acc += term(t);
    R* p = dx + (size_t(ch.b) * Tn + t) * d + ch.j;
    st(p, float(double(ld(p)) + acc));
    if (kDocs && starts(t)) acc = 0;  // positions before t are another document's
  }
}
inline dim3 scan_grid(int B, int d) { return dim3(unsigned((d + kScanCols - 1) / kScanCols), unsigned(B)); }
inline dim3 scan_block() { return dim3(kScanCols, kScanChunks); }

constexpr int kMaxDhPerLane = 8;  // head dims up to 256
constexpr int kMaxCtx = 16;

// One warp per (token n, head h). Context row (n, i) of kc and vc (and of
// dkc, dvc) starts at (n nc + i) ldkv.
template <class A>
__global__ void k_ctx_attention_fwd(const A* q, const A* kc, const A* vc, int N, int nc, int H, int Hkv, int dh,
                                    int ldkv, A* out, float* probs) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= N * H) return;
  const int n = warp / H, h = warp % H, g = h % Hkv;
  const float scale = rsqrtf(float(dh));
  const A* qr = q + (size_t(n) * H + h) * dh;
  float sc[kMaxCtx];
  float m = -INFINITY;
  for (int i = 0; i < nc; ++i) {
    const A* kr = kc + (size_t(n) * nc + i) * ldkv + size_t(g) * dh;
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
    for (int i = 0; i < nc; ++i) o += sc[i] * ld(vc + (size_t(n) * nc + i) * ldkv + size_t(g) * dh + e);
    st(out + (size_t(n) * H + h) * dh + e, o);
  }
}

// One warp per (token n, KV group g): loops over the heads of the group, so
// dkc/dvc rows have one writer and sum the heads in a fixed order.
template <class A>
__global__ void k_ctx_attention_bwd(const A* q, const A* kc, const A* vc, const float* probs, const A* dout, int N,
                                    int nc, int H, int Hkv, int dh, int ldkv, A* dq, A* dkc, A* dvc) {
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
      const A* vr = vc + (size_t(n) * nc + i) * ldkv + size_t(g) * dh;
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
        acc += ds * ld(kc + (size_t(n) * nc + i) * ldkv + size_t(g) * dh + e);
        dk[i][k] += ds * qv;
        dv[i][k] += p[i] * dov;
      }
      A* dqp = dq + (size_t(n) * H + h) * dh + e;
      st(dqp, ld(dqp) + acc);  // dq accumulates (it also feeds self-attention)
    }
  }
  for (int i = 0; i < nc; ++i)
    for (int e = lane, k = 0; e < dh; e += 32, ++k) {
      const size_t r = (size_t(n) * nc + i) * ldkv + size_t(g) * dh + e;
      st(dkc + r, dk[i][k]);
      st(dvc + r, dv[i][k]);
    }
}

// One element of the output gate and of the blend, forward and backward:
// the unfused kernels and the fused blend + gate share them (the same bits).
__device__ __forceinline__ float gate_fwd(float p, float x) { return sigm(p) * x; }
__device__ __forceinline__ void gate_bwd(float p, float x, float d, float& dp, float& dx) {
  const float s = sigm(p);
  dp = d * x * s * (1.f - s);
  dx = d * s;
}
__device__ __forceinline__ float blend_beta(const float* phi) { return float(ref::sigmoid(double(phi[0]))); }
__device__ __forceinline__ float blend(float beta, float s, float c) { return (1.f - beta) * s + beta * c; }
// d_self, d_ctx of element i from its dout d; returns its term of the dL/dφ sum.
template <class E>
__device__ __forceinline__ double blend_bwd_at(float beta, float d, const E* os, const E* oc, size_t i, E* ds, E* dc) {
  st(ds + i, (1.f - beta) * d);
  st(dc + i, beta * d);
  return double(d) * (double(ld(oc + i)) - double(ld(os + i)));
}

template <class E>
__global__ void k_sigmoid_gate_fwd(const E* pre, const E* x, size_t n, E* out) {
  vec_map(
      n, [](float p, float x, float& o) { o = gate_fwd(p, x); }, MapIn{pre}, MapIn{x}, MapOut{out});
}
template <class E>
__global__ void k_sigmoid_gate_bwd(const E* pre, const E* x, const E* dout, size_t n, E* dpre, E* dx) {
  vec_map(
      n, [](float p, float x, float d, float& dp, float& dx) { gate_bwd(p, x, d, dp, dx); }, MapIn{pre}, MapIn{x},
      MapIn{dout}, MapOut{dpre}, MapOut{dx});
}
template <class E>
__global__ void k_blend_fwd(const E* os, const E* oc, const float* phi, size_t n, E* out) {
  const float beta = blend_beta(phi);
  vec_map(
      n, [beta](float s, float c, float& o) { o = blend(beta, s, c); }, MapIn{os}, MapIn{oc}, MapOut{out});
}
// d_self, d_ctx, and per-block partial sums of dout (o_ctx - o_self).
template <class E>
__global__ void k_blend_bwd(const E* os, const E* oc, const float* phi, const E* dout, size_t n, E* ds, E* dc,
                            double* part) {
  const float beta = blend_beta(phi);
  double s = 0;
  GRID_LOOP(i, n) s += blend_bwd_at(beta, ld(dout + i), os, oc, i, ds, dc);
  s = block_sum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}
// The blend, then the gate on o as stored (its one rounding), in one pass.
template <class E>
__global__ void k_blend_gate_fwd(const E* os, const E* oc, const float* phi, const E* pre, size_t n, E* o, E* og) {
  const float beta = blend_beta(phi);
  vec_map(
      n,
      [beta](float s, float c, float p, float& o, float& og) {
        o = blend(beta, s, c);
        og = gate_fwd(p, as_stored<E>(o));
      },
      MapIn{os}, MapIn{oc}, MapIn{pre}, MapOut{o}, MapOut{og});
}
// The gate's backward, then the blend's on dL/do as d_o would store it, in
// k_blend_bwd's order (its grid and loop: the same partial sums of dL/dφ).
template <class E>
__global__ void k_blend_gate_bwd(const E* os, const E* oc, const float* phi, const E* pre, const E* o, const E* dog,
                                 size_t n, E* dpre, E* ds, E* dc, double* part) {
  const float beta = blend_beta(phi);
  double s = 0;
  GRID_LOOP(i, n) {
    float dp, d_o;
    gate_bwd(ld(pre + i), ld(o + i), ld(dog + i), dp, d_o);
    st(dpre + i, dp);
    s += blend_bwd_at(beta, as_stored<E>(d_o), os, oc, i, ds, dc);
  }
  s = block_sum(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}
__global__ void k_blend_bwd_finish(const double* part, int nb, const float* phi, double* dphi) {
  double s = 0;
  for (int i = threadIdx.x; i < nb; i += blockDim.x) s += part[i];
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const double b = ref::sigmoid(double(phi[0]));
    dphi[0] = s * b * (1.0 - b);
  }
}

}  // namespace

namespace {
// k_prefix_mean_fwd: carry null, the plain prefix mean (pos0 0), per
// document where doc_start is not null (a device array).
void prefix_mean_launch(Ctx c, CPtr x, int B, int Tn, int d, int pos0, const int32_t* doc_start, Ptr carry, Ptr out,
                        Ptr out_op) {
  const char* op = carry ? "prefix_mean_carry_fwd" : "prefix_mean_fwd";
  dispatch(x.dtype(), op, [&](auto e) {
    dispatch(out_op ? out_op.dtype() : x.dtype(), op, [&](auto eo) {
      using R = decltype(e);
      using O = decltype(eo);
      auto launch = [&](auto kernel) {
        kernel<<<scan_grid(B, d), scan_block(), 0, c.s>>>(dev<R>(x), B, Tn, d, pos0, doc_start, dev<R>(carry),
                                                          dev<R>(out), dev<O>(out_op));
      };
      if (doc_start) launch(k_prefix_mean_fwd<R, O, true>);
      else launch(k_prefix_mean_fwd<R, O, false>);
    });
  });
  after_launch(op);
}
}  // namespace

void prefix_mean_fwd(Ctx c, CPtr x, int B, int Tn, int d, const int32_t* doc_start, Ptr out, Ptr out_op) {
  prefix_mean_launch(c, x, B, Tn, d, 0, doc_start, nullptr, out, out_op);
}
void prefix_mean_bwd(Ctx c, CPtr dout, int B, int Tn, int d, const int32_t* doc_start, Ptr dx) {
  dispatch(dx.dtype(), "prefix_mean_bwd", [&](auto e) {
    using R = decltype(e);
    auto launch = [&](auto kernel) {
      kernel<<<scan_grid(B, d), scan_block(), 0, c.s>>>(dev<R>(dout), B, Tn, d, doc_start, dev<R>(dx));
    };
    if (doc_start) launch(k_prefix_mean_bwd<R, true>);
    else launch(k_prefix_mean_bwd<R, false>);
  });
  after_launch("prefix_mean_bwd");
}
void prefix_mean_carry_fwd(Ctx c, CPtr x, int B, int Tn, int d, int pos0, Ptr carry, Ptr out, Ptr out_op) {
  prefix_mean_launch(c, x, B, Tn, d, pos0, nullptr, carry, out, out_op);
}

void ctx_attention_fwd(Ctx c, CPtr q, CPtr kc, CPtr vc, int N, int nc, int H, int Hkv, int dh, int ldkv, Ptr out,
                       Ptr probs) {
  WIOLA_CHECK(nc <= kMaxCtx && dh <= 32 * kMaxDhPerLane, "cuda ctx_attention: nc ", nc, " > ", kMaxCtx, " or head dim ",
              dh, " > ", 32 * kMaxDhPerLane);
  WIOLA_CHECK(ldkv >= Hkv * dh, "cuda ctx_attention: row stride ", ldkv, " < Hkv dh = ", Hkv * dh);
  dispatch(q.dtype(), "ctx_attention_fwd", [&](auto e) {
    using A = decltype(e);
    const size_t threads = size_t(N) * H * 32;
    k_ctx_attention_fwd<A><<<grid_for(threads), kThreads, 0, c.s>>>(dev<A>(q), dev<A>(kc), dev<A>(vc), N, nc, H, Hkv,
                                                                    dh, ldkv, dev<A>(out), dev<float>(probs));
  });
  after_launch("ctx_attention_fwd");
}
void ctx_attention_bwd(Ctx c, CPtr q, CPtr kc, CPtr vc, CPtr probs, CPtr dout, int N, int nc, int H, int Hkv, int dh,
                       int ldkv, Ptr dq, Ptr dkc, Ptr dvc) {
  WIOLA_CHECK(nc <= kMaxCtx && dh <= 32 * kMaxDhPerLane, "cuda ctx_attention: nc ", nc, " > ", kMaxCtx, " or head dim ",
              dh, " > ", 32 * kMaxDhPerLane);
  WIOLA_CHECK(ldkv >= Hkv * dh, "cuda ctx_attention: row stride ", ldkv, " < Hkv dh = ", Hkv * dh);
  dispatch(q.dtype(), "ctx_attention_bwd", [&](auto e) {
    using A = decltype(e);
    const size_t threads = size_t(N) * Hkv * 32;
    k_ctx_attention_bwd<A><<<grid_for(threads), kThreads, 0, c.s>>>(dev<A>(q), dev<A>(kc), dev<A>(vc),
                                                                    dev<float>(probs), dev<A>(dout), N, nc, H, Hkv, dh,
                                                                    ldkv, dev<A>(dq), dev<A>(dkc), dev<A>(dvc));
  });
  after_launch("ctx_attention_bwd");
}

void sigmoid_gate_fwd(Ctx c, CPtr pre, CPtr x, size_t n, Ptr out) {
  WIOLA_UNARY_A("sigmoid_gate_fwd", out,
                (k_sigmoid_gate_fwd<E><<<grid, kThreads, 0, c.s>>>(dev<E>(pre), dev<E>(x), n, dev<E>(out))));
}
void sigmoid_gate_bwd(Ctx c, CPtr pre, CPtr x, CPtr dout, size_t n, Ptr dpre, Ptr dx) {
  WIOLA_UNARY_A("sigmoid_gate_bwd", dx,
                (k_sigmoid_gate_bwd<E>
                 <<<grid, kThreads, 0, c.s>>>(dev<E>(pre), dev<E>(x), dev<E>(dout), n, dev<E>(dpre), dev<E>(dx))));
}
void blend_fwd(Ctx c, CPtr o_self, CPtr o_ctx, CPtr phi, size_t n, Ptr out) {
  WIOLA_UNARY_A(
      "blend_fwd", out,
      (k_blend_fwd<E><<<grid, kThreads, 0, c.s>>>(dev<E>(o_self), dev<E>(o_ctx), dev<float>(phi), n, dev<E>(out))));
}
void blend_bwd(Ctx c, CPtr o_self, CPtr o_ctx, CPtr phi, CPtr dout, size_t n, Ptr d_self, Ptr d_ctx, double* dphi) {
  DeviceTemp part(c.mem, kRedBlocks * sizeof(double), "blend_bwd");
  const int nb = red_blocks(n);
  dispatch(dout.dtype(), "blend_bwd", [&](auto e) {
    using E = decltype(e);
    k_blend_bwd<E><<<nb, kThreads, 0, c.s>>>(dev<E>(o_self), dev<E>(o_ctx), dev<float>(phi), dev<E>(dout), n,
                                             dev<E>(d_self), dev<E>(d_ctx), part.as<double>());
  });
  k_blend_bwd_finish<<<1, kThreads, 0, c.s>>>(part.as<double>(), nb, dev<float>(phi), dphi);
  after_launch("blend_bwd");
}
void blend_gate_fwd(Ctx c, CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, size_t n, Ptr o, Ptr og) {
  WIOLA_UNARY_A("blend_gate_fwd", og,
                (k_blend_gate_fwd<E><<<grid, kThreads, 0, c.s>>>(dev<E>(o_self), dev<E>(o_ctx), dev<float>(phi),
                                                                 dev<E>(pre), n, dev<E>(o), dev<E>(og))));
}
void blend_gate_bwd(Ctx c, CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, CPtr o, CPtr dog, size_t n, Ptr dpre,
                    Ptr d_self, Ptr d_ctx, double* dphi) {
  DeviceTemp part(c.mem, kRedBlocks * sizeof(double), "blend_gate_bwd");
  const int nb = red_blocks(n);
  dispatch(dog.dtype(), "blend_gate_bwd", [&](auto e) {
    using E = decltype(e);
    k_blend_gate_bwd<E><<<nb, kThreads, 0, c.s>>>(dev<E>(o_self), dev<E>(o_ctx), dev<float>(phi), dev<E>(pre),
                                                  dev<E>(o), dev<E>(dog), n, dev<E>(dpre), dev<E>(d_self),
                                                  dev<E>(d_ctx), part.as<double>());
  });
  k_blend_bwd_finish<<<1, kThreads, 0, c.s>>>(part.as<double>(), nb, dev<float>(phi), dphi);
  after_launch("blend_gate_bwd");
}

}  // namespace wiola::cuda
