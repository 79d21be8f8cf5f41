// CPU self-attention kernels: see attention.h for the design.
#include "kernels/cpu/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "kernels/cpu/simd.h"
#include "util/error.h"

namespace wiola::cpu {
namespace {

constexpr int BQ_MAX = std::max(kAttnBlockQ, kAttnBlockQLong);

// Score rows are this long: a multiple of kRowRoom (simd.h).
constexpr int round_up_room(int n) { return (n + kRowRoom - 1) / kRowRoom * kRowRoom; }

// Block height of the backward pass for keys of length Tk.
int bwd_block_q(int Tk) { return Tk >= kAttnLongKeys ? kAttnBlockQLong : kAttnBlockQ; }

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// Row-major C = alpha op(A) op(B) + beta C, single-threaded inside the
// parallel regions (CpuOps keeps OpenBLAS at one thread).
inline void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda, const float* B, int ldb,
                 float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda, B,
              ldb, beta, C, ldc);
}
inline void gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* A, int lda, const double* B,
                 int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

// Row softmax pieces: the dispatched SIMD primitives (simd.h) for float,
// plain loops for double (the float64 test backend). Score rows have room up
// to their leading dimension, a multiple of kRowRoom (Block::ld), so the
// padded primitives may touch the lanes past a row's visible prefix.
float row_max(const float* x, int n) { return simd_row_max_padded(x, n); }
float exp_sub_sum(float* x, int n, float m) { return simd_exp_sub_sum_padded(x, n, m); }
void softmax_bwd_row(float* p, float* ds, int n, float L, float D) { simd_softmax_bwd_row_padded(p, ds, n, L, D); }
double dot_wide(const float* a, const float* b, int n) { return simd_dot_wide(a, b, n); }
double row_max(const double* x, int n) {
  double m = kNegInf<double>;
  for (int j = 0; j < n; ++j) m = std::max(m, x[j]);
  return m;
}
// x[j] = exp(x[j] - m) in place; returns the sum.
double exp_sub_sum(double* x, int n, double m) {
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - m));
  return sum;
}
// p[j] = exp(p[j] - L); ds[j] = p[j] (ds[j] - D).
void softmax_bwd_row(double* p, double* ds, int n, double L, double D) {
  for (int j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] - L);
    ds[j] = p[j] * (ds[j] - D);
  }
}
double dot_wide(const double* a, const double* b, int n) {
  double acc = 0;
  for (int j = 0; j < n; ++j) acc += a[j] * b[j];
  return acc;
}

// The same on the columns [lo, n) of a row (a query of a document that
// starts inside the block's key span); the columns before lo become 0. With
// lo = 0 exactly the calls above. The unpadded float primitives give the
// padded ones' bits (simd.h) and need no alignment.
float row_max_from(const float* x, int lo, int n) { return lo > 0 ? simd_row_max(x + lo, n - lo) : row_max(x, n); }
float exp_sub_sum_from(float* x, int lo, int n, float m) {
  if (lo == 0) return exp_sub_sum(x, n, m);
  std::fill_n(x, lo, 0.0f);
  return simd_exp_sub_sum(x + lo, n - lo, m);
}
void softmax_bwd_row_from(float* p, float* ds, int lo, int n, float L, float D) {
  if (lo == 0) return softmax_bwd_row(p, ds, n, L, D);
  std::fill_n(p, lo, 0.0f);
  std::fill_n(ds, lo, 0.0f);
  simd_softmax_bwd_row(p + lo, ds + lo, n - lo, L, D);
}
double row_max_from(const double* x, int lo, int n) { return row_max(x + lo, n - lo); }
double exp_sub_sum_from(double* x, int lo, int n, double m) {
  std::fill_n(x, lo, 0.0);
  return exp_sub_sum(x + lo, n - lo, m);
}
void softmax_bwd_row_from(double* p, double* ds, int lo, int n, double L, double D) {
  std::fill_n(p, lo, 0.0);
  std::fill_n(ds, lo, 0.0);
  softmax_bwd_row(p + lo, ds + lo, n - lo, L, D);
}

template <class T>
inline T dot(const T* __restrict a, const T* __restrict b, int n) {
  T acc = T(0);
  for (int d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// 64-byte aligned per-thread scratch.
template <class T>
class Scratch {
 public:
  explicit Scratch(size_t n) {
    const size_t bytes = std::max<size_t>(64, (n * sizeof(T) + 63) / 64 * 64);
    p_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!p_) throw std::bad_alloc();
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(p_); }
  T* get() const { return p_; }

 private:
  T* p_;
};

// OpenBLAS at one thread for the scope: its calls run inside OpenMP threads
// (CpuOps sets this already; direct callers such as the benchmarks may not).
class BlasSingleThread {
 public:
  BlasSingleThread() : n_(openblas_get_num_threads()) {
    if (n_ != 1) openblas_set_num_threads(1);
  }
  BlasSingleThread(const BlasSingleThread&) = delete;
  BlasSingleThread& operator=(const BlasSingleThread&) = delete;
  ~BlasSingleThread() {
    if (n_ != 1) openblas_set_num_threads(n_);
  }

 private:
  int n_;
};

inline int n_keys_of(const AttnShape& s, const AttnKeys& keys, int b) { return keys.n_keys ? keys.n_keys[b] : s.Tk; }

void validate(const AttnShape& s, const AttnKeys& keys, bool has_raw) {
  WIOLA_CHECK(s.B >= 0 && s.Tq >= 0 && s.Tk >= 0 && s.q_pos0 >= 0, "attention: negative shape (B=", s.B, " Tq=", s.Tq,
              " Tk=", s.Tk, " q_pos0=", s.q_pos0, ")");
  WIOLA_CHECK(s.H > 0 && s.Hkv > 0 && s.H % s.Hkv == 0, "attention: H=", s.H,
              " must be a positive multiple of Hkv=", s.Hkv);
  WIOLA_CHECK(s.dh > 0, "attention: head dim dh=", s.dh, " must be positive");
  WIOLA_CHECK(!keys.self_open || has_raw, "attention: self_open given without raw keys/values");
  for (int b = 0; b < s.B; ++b) {
    const int nk = n_keys_of(s, keys, b);
    WIOLA_CHECK(nk >= 0 && nk <= s.Tk, "attention: n_keys[", b, "]=", nk, " outside [0, Tk=", s.Tk, "]");
    if (keys.key_end) {
      const int32_t* ke = keys.key_end + size_t(b) * s.Tk;
      for (int j = 1; j < nk; ++j)
        WIOLA_CHECK(ke[j - 1] <= ke[j], "attention: key_end of sequence ", b, " not sorted at row ", j);
    }
    if (keys.doc_start)
      for (int i = 0; i < s.Tq; ++i) {
        const int ds = keys.doc_start[size_t(b) * s.Tq + i];
        WIOLA_CHECK(ds >= 0 && ds <= s.q_pos0 + i, "attention: doc_start[", b, ", ", i, "] = ", ds, " outside [0, ",
                    s.q_pos0 + i, "]");
      }
  }
}

// One block: query rows i0..i0+nq of sequence b for the heads of group g,
// stacked as rows jr = j*nq + r (head h = g + j*Hkv, position i0 + r). Its
// scores cover the key rows [klo, kmax): with documents a query sees the
// rows [nlo, nvis) of its own document only, and the block skips the rows
// before its lowest nlo; without them klo = nlo = 0 (causal prefixes).
// Score column c is key row klo + c.
struct Block {
  const AttnShape& s;
  const AttnKeys& keys;
  int b, g, i0, nq;
  int rep;           // heads per group, H / Hkv
  int rows;          // rep * nq
  int nvis[BQ_MAX];  // visible key rows of each position end before this
  int nlo[BQ_MAX];   // and start here (its document's first row)
  int kmax = 0;      // the largest end
  int klo = 0;       // the smallest start
  int ld;            // leading dimension of the [rows x width()] score buffers

  // Block qt of height bq (<= BQ_MAX).
  Block(const AttnShape& s_, const AttnKeys& k_, int b_, int g_, int qt, int bq)
      : s(s_),
        keys(k_),
        b(b_),
        g(g_),
        i0(qt * bq),
        nq(std::min(bq, s_.Tq - qt * bq)),
        rep(s_.H / s_.Hkv),
        rows(rep * nq) {
    const int nk = n_keys_of(s, keys, b);
    const int32_t* ke = keys.key_end ? keys.key_end + size_t(b) * s.Tk : nullptr;
    const int32_t* dstart = keys.doc_start ? keys.doc_start + size_t(b) * s.Tq : nullptr;
    for (int r = 0; r < nq; ++r) {
      const int p = s.q_pos0 + i0 + r;
      nvis[r] = ke ? int(std::upper_bound(ke, ke + nk, p) - ke) : std::min(p + 1, nk);
      kmax = std::max(kmax, nvis[r]);
      nlo[r] = 0;
      if (dstart) {
        const int ds = dstart[i0 + r];  // groups ending at or after ds lie inside the document
        nlo[r] = std::min(nvis[r], ke ? int(std::lower_bound(ke, ke + nk, ds) - ke) : ds);
      }
    }
    klo = dstart ? *std::min_element(nlo, nlo + nq) : 0;
    ld = round_up_room(width());
  }
  int width() const { return kmax - klo; }
  int head(int jr) const { return g + (jr / nq) * s.Hkv; }
  int pos(int jr) const { return i0 + jr % nq; }         // query index within Tq
  int vis(int jr) const { return nvis[jr % nq] - klo; }  // score columns [lo, vis)
  int lo(int jr) const { return nlo[jr % nq] - klo; }
  bool self_open(int jr) const { return keys.self_open && keys.self_open[size_t(b) * s.Tq + pos(jr)]; }
  // Offsets of a query-layout row [B, Tq, H, dh], a key row [B, Tk, Hkv, dh]
  // (key index 0 of this group), and a raw row [B, Tq, Hkv, dh].
  size_t q_row(int jr) const { return ((size_t(b) * s.Tq + pos(jr)) * s.H + head(jr)) * s.dh; }
  size_t key0() const { return size_t(b) * s.Tk * s.Hkv * s.dh + size_t(g) * s.dh; }
  size_t key_lo() const { return key0() + size_t(klo) * s.Hkv * s.dh; }  // score column 0
  size_t raw_row(int jr) const { return ((size_t(b) * s.Tq + pos(jr)) * s.Hkv + g) * s.dh; }
  size_t lse_at(int jr) const { return (size_t(b) * s.H + head(jr)) * s.Tq + pos(jr); }
  // dst[jr, :] = src[q_row(jr), :]
  template <class T>
  void pack(const T* src, T* dst) const {
    for (int jr = 0; jr < rows; ++jr) std::memcpy(dst + size_t(jr) * s.dh, src + q_row(jr), sizeof(T) * s.dh);
  }
};

// Per-thread buffers of the forward pass.
template <class T>
struct FwdBuffers {
  Scratch<T> q, o, scores;
  std::vector<T> m, l, p_self;  // per stacked row
  FwdBuffers(const AttnShape& s, int rep, int bq)
      : q(size_t(rep) * bq * s.dh),
        o(size_t(rep) * bq * s.dh),
        scores(size_t(rep) * bq * round_up_room(s.Tk)),
        m(size_t(rep) * bq),
        l(size_t(rep) * bq),
        p_self(size_t(rep) * bq) {}
};

template <class T>
void fwd_block(const Block& bk, const T* q, const T* k, const T* v, const T* raw_k, const T* raw_v, T* o, T* lse,
               FwdBuffers<T>& w) {
  const AttnShape& s = bk.s;
  const int dh = s.dh, kv_ld = s.Hkv * s.dh;
  const T scale = T(1) / std::sqrt(T(dh));
  T* Q = w.q.get();
  T* O = w.o.get();
  T* S = w.scores.get();
  bk.pack(q, Q);

  // S = scale Q K^T over the block's key span.
  const int kw = bk.width();
  if (kw > 0) gemm(false, true, bk.rows, kw, dh, scale, Q, dh, k + bk.key_lo(), kv_ld, T(0), S, bk.ld);

  // Row softmax numerators (unnormalised), the own raw key included.
  for (int jr = 0; jr < bk.rows; ++jr) {
    T* srow = S + size_t(jr) * bk.ld;
    const int lim = bk.vis(jr), lo = bk.lo(jr);
    T m = row_max_from(srow, lo, lim), sc = kNegInf<T>;
    if (bk.self_open(jr)) {
      sc = scale * dot(Q + size_t(jr) * dh, raw_k + bk.raw_row(jr), dh);
      m = std::max(m, sc);
    }
    T l = 0;
    if (m > kNegInf<T>) {
      l = exp_sub_sum_from(srow, lo, lim, m);
      w.p_self[jr] = sc > kNegInf<T> ? std::exp(sc - m) : T(0);
      l += w.p_self[jr];
    } else {
      w.p_self[jr] = 0;
      std::fill_n(srow, lim, T(0));
    }
    std::fill(srow + lim, srow + kw, T(0));
    w.m[jr] = m;
    w.l[jr] = l;
  }

  // O = P V, then the raw value and the normalisation.
  if (kw > 0) gemm(false, false, bk.rows, dh, kw, T(1), S, bk.ld, v + bk.key_lo(), kv_ld, T(0), O, dh);
  else std::fill_n(O, size_t(bk.rows) * dh, T(0));
  for (int jr = 0; jr < bk.rows; ++jr) {
    T* orow = O + size_t(jr) * dh;
    T* dst = o + bk.q_row(jr);
    if (w.p_self[jr] != T(0)) {
      const T* rv = raw_v + bk.raw_row(jr);
      for (int d = 0; d < dh; ++d) orow[d] += w.p_self[jr] * rv[d];
    }
    if (w.l[jr] > T(0)) {
      const T inv = T(1) / w.l[jr];
      for (int d = 0; d < dh; ++d) dst[d] = orow[d] * inv;
      lse[bk.lse_at(jr)] = w.m[jr] + std::log(w.l[jr]);
    } else {
      std::fill_n(dst, dh, T(0));
      lse[bk.lse_at(jr)] = kNegInf<T>;
    }
  }
}

template <class T>
void fwd_impl(const AttnShape& s, const AttnKeys& keys, const T* q, const T* k, const T* v, const T* raw_k,
              const T* raw_v, T* o, T* lse) {
  constexpr int bq = kAttnBlockQ;
  const int n_qt = (s.Tq + bq - 1) / bq;
  const long n_items = long(s.B) * s.Hkv * n_qt;
#pragma omp parallel
  {
    FwdBuffers<T> w(s, s.H / s.Hkv, bq);
    // Items ordered (b, query block descending, g): long blocks first.
#pragma omp for schedule(dynamic, 1)
    for (long item = 0; item < n_items; ++item) {
      const int g = int(item % s.Hkv);
      const int qt = n_qt - 1 - int((item / s.Hkv) % n_qt);
      const int b = int(item / (long(s.Hkv) * n_qt));
      fwd_block(Block(s, keys, b, g, qt, bq), q, k, v, raw_k, raw_v, o, lse, w);
    }
  }
}

// Per-thread buffers of the backward pass.
template <class T>
struct BwdBuffers {
  Scratch<T> q, dout, dq, p, ds;
  std::vector<T> L, D;  // per stacked row
  BwdBuffers(const AttnShape& s, int rep, int bq)
      : q(size_t(rep) * bq * s.dh),
        dout(size_t(rep) * bq * s.dh),
        dq(size_t(rep) * bq * s.dh),
        p(size_t(rep) * bq * round_up_room(s.Tk)),
        ds(size_t(rep) * bq * round_up_room(s.Tk)),
        L(size_t(rep) * bq),
        D(size_t(rep) * bq) {}
};

// Outputs of the backward pass, all [.., dh] rows.
template <class T>
struct AttnGrads {
  T *dq, *dk, *dv, *draw_k, *draw_v;
};

// first: the group's first block (its last positions, the longest prefix):
// its dK, dV products overwrite (beta = 0) instead of adding (never with
// documents: bwd_impl zeroes the rows and every block adds).
template <class T>
void bwd_block(const Block& bk, const T* q, const T* k, const T* v, const T* raw_k, const T* raw_v, const T* o,
               const T* lse, const T* dout, const AttnGrads<T>& gr, BwdBuffers<T>& w, bool first) {
  const AttnShape& s = bk.s;
  const int dh = s.dh, kv_ld = s.Hkv * s.dh;
  const T scale = T(1) / std::sqrt(T(dh));
  T* Q = w.q.get();
  T* dO = w.dout.get();
  T* dQ = w.dq.get();
  T* P = w.p.get();
  T* dS = w.ds.get();
  bk.pack(q, Q);
  bk.pack(dout, dO);
  for (int jr = 0; jr < bk.rows; ++jr) {
    // D = dO . O in double, as the reference; dO from the packed copy.
    w.D[jr] = T(dot_wide(dO + size_t(jr) * dh, o + bk.q_row(jr), dh));
    w.L[jr] = lse[bk.lse_at(jr)];
  }
  const T acc = first ? T(0) : T(1);
  const int kw = bk.width();

  if (kw > 0) {
    const size_t k0 = bk.key_lo();
    gemm(false, true, bk.rows, kw, dh, scale, Q, dh, k + k0, kv_ld, T(0), P, bk.ld);   // scores
    gemm(false, true, bk.rows, kw, dh, T(1), dO, dh, v + k0, kv_ld, T(0), dS, bk.ld);  // dP = dO V^T
    for (int jr = 0; jr < bk.rows; ++jr) {
      T* prow = P + size_t(jr) * bk.ld;
      T* dsrow = dS + size_t(jr) * bk.ld;
      const bool any = w.L[jr] > kNegInf<T>;
      const int lim = any ? bk.vis(jr) : 0, lo = any ? bk.lo(jr) : 0;
      softmax_bwd_row_from(prow, dsrow, lo, lim, w.L[jr], w.D[jr]);
      std::fill(prow + lim, prow + kw, T(0));
      std::fill(dsrow + lim, dsrow + kw, T(0));
    }
    gemm(true, false, kw, dh, bk.rows, T(1), P, bk.ld, dO, dh, acc, gr.dv + k0, kv_ld);   // dV += P^T dO
    gemm(true, false, kw, dh, bk.rows, scale, dS, bk.ld, Q, dh, acc, gr.dk + k0, kv_ld);  // dK += scale dS^T Q
    gemm(false, false, bk.rows, dh, kw, scale, dS, bk.ld, k + k0, kv_ld, T(0), dQ, dh);   // dQ = scale dS K
  } else {
    std::fill_n(dQ, size_t(bk.rows) * dh, T(0));
  }

  for (int jr = 0; jr < bk.rows; ++jr) {
    T* dqr = dQ + size_t(jr) * dh;
    if (bk.self_open(jr) && w.L[jr] > kNegInf<T>) {
      const size_t row = bk.raw_row(jr);
      const T* qr = Q + size_t(jr) * dh;
      const T* dor = dO + size_t(jr) * dh;
      const T p = std::exp(scale * dot(qr, raw_k + row, dh) - w.L[jr]);
      const T ds = p * (dot(dor, raw_v + row, dh) - w.D[jr]);
      const T dss = ds * scale;
      for (int d = 0; d < dh; ++d) {
        gr.draw_v[row + d] += p * dor[d];
        gr.draw_k[row + d] += dss * qr[d];
        dqr[d] += dss * raw_k[row + d];
      }
    }
    std::memcpy(gr.dq + bk.q_row(jr), dqr, sizeof(T) * dh);
  }
}

template <class T>
void bwd_impl(const AttnShape& s, const AttnKeys& keys, const T* q, const T* k, const T* v, const T* raw_k,
              const T* raw_v, const T* o, const T* lse, const T* dout, const AttnGrads<T>& gr) {
  const int bq = bwd_block_q(s.Tk);
  const int n_qt = (s.Tq + bq - 1) / bq;
  const long n_items = long(s.B) * s.Hkv;
  const size_t kv_ld = size_t(s.Hkv) * s.dh;
#pragma omp parallel
  {
    BwdBuffers<T> w(s, s.H / s.Hkv, bq);
#pragma omp for schedule(dynamic, 1)
    for (long item = 0; item < n_items; ++item) {
      const int b = int(item / s.Hkv), g = int(item % s.Hkv);
      // This thread owns the rows (b, *, g) of dk, dv, draw_k, draw_v.
      // Blocks run last to first: visible prefixes only grow with the
      // position, so the first block's products cover key rows [0, kmax)
      // and write them (beta = 0); the rows no query sees are zeroed here.
      // Documents: the blocks' spans are not prefixes, so every row is
      // zeroed and every block adds.
      const bool docs = keys.doc_start != nullptr;
      const int kmax = n_qt > 0 && !docs ? Block(s, keys, b, g, n_qt - 1, bq).kmax : 0;
      for (int j = kmax; j < s.Tk; ++j) {
        const size_t row = (size_t(b) * s.Tk + j) * kv_ld + size_t(g) * s.dh;
        std::fill_n(gr.dk + row, s.dh, T(0));
        std::fill_n(gr.dv + row, s.dh, T(0));
      }
      if (gr.draw_k && gr.draw_v)
        for (int i = 0; i < s.Tq; ++i) {
          const size_t row = (size_t(b) * s.Tq + i) * kv_ld + size_t(g) * s.dh;
          std::fill_n(gr.draw_k + row, s.dh, T(0));
          std::fill_n(gr.draw_v + row, s.dh, T(0));
        }
      for (int qt = n_qt - 1; qt >= 0; --qt)
        bwd_block(Block(s, keys, b, g, qt, bq), q, k, v, raw_k, raw_v, o, lse, dout, gr, w, qt == n_qt - 1 && !docs);
    }
  }
}

}  // namespace

template <class T>
void attention_fwd(const AttnShape& s, const AttnKeys& keys, const T* q, const T* k, const T* v, const T* raw_k,
                   const T* raw_v, T* o, T* lse) {
  validate(s, keys, raw_k && raw_v);
  if (s.B == 0 || s.Tq == 0) return;
  simd_init();  // may throw: before the parallel region
  const BlasSingleThread one_blas_thread;
  fwd_impl(s, keys, q, k, v, raw_k, raw_v, o, lse);
}

template <class T>
void attention_bwd(const AttnShape& s, const AttnKeys& keys, const T* q, const T* k, const T* v, const T* raw_k,
                   const T* raw_v, const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv, T* draw_k, T* draw_v) {
  validate(s, keys, raw_k && raw_v);
  WIOLA_CHECK(!keys.self_open || (draw_k && draw_v), "attention_bwd: self_open given without draw_k/draw_v");
  if (s.B == 0) return;
  simd_init();  // may throw: before the parallel region
  const BlasSingleThread one_blas_thread;
  bwd_impl(s, keys, q, k, v, raw_k, raw_v, o, lse, dout, AttnGrads<T>{dq, dk, dv, draw_k, draw_v});
}

template void attention_fwd<float>(const AttnShape&, const AttnKeys&, const float*, const float*, const float*,
                                   const float*, const float*, float*, float*);
template void attention_fwd<double>(const AttnShape&, const AttnKeys&, const double*, const double*, const double*,
                                    const double*, const double*, double*, double*);
template void attention_bwd<float>(const AttnShape&, const AttnKeys&, const float*, const float*, const float*,
                                   const float*, const float*, const float*, const float*, const float*, float*, float*,
                                   float*, float*, float*);
template void attention_bwd<double>(const AttnShape&, const AttnKeys&, const double*, const double*, const double*,
                                    const double*, const double*, const double*, const double*, const double*, double*,
                                    double*, double*, double*, double*);

}  // namespace wiola::cpu
