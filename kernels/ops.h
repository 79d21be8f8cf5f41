// The op interface: every numerical operation the Wiola model needs, one
// function per op with its backward beside it. `model/` calls only this;
// `kernels/cpu/` implements it with OpenBLAS + OpenMP (float and double, so
// tests can check gradients in double precision) and `kernels/cuda/` with
// cuBLAS (bf16 operands, fp32 accumulate).
//
// Conventions
// - Row-major. Shapes are written in brackets; N = tokens = B*T.
// - Tensor pointers are backend memory (host for CPU, device for CUDA).
//   Index arrays (token ids, ATM layouts) are `int32_t`/`uint8_t` backend
//   memory too; host<->backend copies go through upload/download.
// - Backward ops: parameter gradients ACCUMULATE (+=, for micro-batches);
//   activation gradients OVERWRITE unless the comment says "accumulates"
//   (the residual stream and tensors that feed several consumers).
// - Sharded callers (TP) pass their local sizes (local heads, local FFN
//   columns, local vocabulary slice); no op here communicates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace wiola {

enum class Trans { N, T };

// Keys of one self-attention call after ATM (SPEC §2). Keys are rows sorted
// by `key_end`; key row j of sequence b is visible to the query at position
// p iff key_end[b*Tk + j] <= p. A query whose position opens a merged pair
// additionally sees its own raw key/value (its pair is not complete inside its
// prefix): self_open[b*Tq + i] != 0.
// Plain causal attention: key_end == nullptr (key j ends at position j),
// self_open == nullptr, keys == raw keys.
struct AttnKeys {
  const int32_t* key_end = nullptr;    // [B, Tk] or nullptr
  const int32_t* n_keys = nullptr;     // [B] valid key rows, or nullptr (= Tk)
  const uint8_t* self_open = nullptr;  // [B, Tq] or nullptr
};

struct AttnShape {
  int B = 0;       // sequences
  int Tq = 0;      // queries per sequence
  int Tk = 0;      // key rows per sequence (capacity; n_keys may be less)
  int H = 0;       // query heads (local to this TP rank)
  int Hkv = 0;     // KV groups (local); query head h uses group h % Hkv
  int dh = 0;      // head dim
  int q_pos0 = 0;  // position of query row 0 (non-zero in cached decoding)
};

template <class T>
class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;

  // ---- memory ------------------------------------------------------------
  virtual void* alloc_bytes(size_t bytes) = 0;  // zero-filled
  virtual void free_bytes(void* p) = 0;
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void synchronize() {}

  // ---- BLAS ----------------------------------------------------------------
  // C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C
  virtual void gemm(Trans ta, Trans tb, int m, int n, int k, T alpha,
                    const T* A, int lda, const T* B, int ldb, T beta, T* C,
                    int ldc) = 0;
  // The same for `batch` independent problems at fixed strides.
  virtual void gemm_strided_batched(Trans ta, Trans tb, int m, int n, int k,
                                    T alpha, const T* A, int lda, long sA,
                                    const T* B, int ldb, long sB, T beta, T* C,
                                    int ldc, long sC, int batch) = 0;

  // ---- elementwise and reductions --------------------------------------------
  virtual void add(const T* a, const T* b, T* out, size_t n) = 0;  // out = a+b
  virtual void axpy(T alpha, const T* x, T* y, size_t n) = 0;      // y += a*x
  virtual void scale(T* x, T s, size_t n) = 0;
  virtual double sum_squares(const T* x, size_t n) = 0;  // returned on host
  virtual double sum(const T* x, size_t n) = 0;

  // ---- embedding (vocab-parallel: rows [v0, v0+V_local) live here) --------
  // out[N,d] = E[ids - v0] for ids in range, 0 otherwise.
  virtual void embedding_fwd(const int32_t* ids, int N, const T* E, int v0,
                             int V_local, int d, T* out) = 0;
  // dE[id - v0] += dout[i] for ids in range.
  virtual void embedding_bwd(const int32_t* ids, int N, const T* dout, int v0,
                             int V_local, int d, T* dE) = 0;

  // ---- WiolaRMSNorm: z = x + delta; y = gamma * z / sqrt(mean(z^2) + eps) ----
  // rstd[N] saved for backward.
  virtual void rmsnorm_fwd(const T* x, const T* gamma, const T* delta, int N,
                           int d, double eps, T* y, T* rstd) = 0;
  // dx ACCUMULATES (x is the residual stream); dgamma, ddelta accumulate.
  virtual void rmsnorm_bwd(const T* x, const T* gamma, const T* delta,
                           const T* rstd, const T* dy, int N, int d, T* dx,
                           T* dgamma, T* ddelta) = 0;

  // ---- SRPE: rotate-half pairs of each head, in place ------------------------
  // x[B, Tn, nh, dh]; table[Tn, dh/2, 2] = (c, s) for positions of rows
  // 0..Tn-1 (host-computed in float64, rounded once; see model/srpe.h).
  // inverse=true applies the transpose rotation (= the backward pass).
  virtual void srpe_apply(T* x, int B, int Tn, int nh, int dh, const T* table,
                          bool inverse) = 0;

  // ---- causal self-attention with GQA and ATM key merging ---------------------
  // q[B,Tq,H,dh], k,v[B,Tk,Hkv,dh], raw_k,raw_v[B,Tq,Hkv,dh] (only read where
  // self_open). out o[B,Tq,H,dh], lse[B,H,Tq] (log-sum-exp of scaled scores,
  // saved for backward). Scale 1/sqrt(dh). Tiled, online softmax: no
  // [B,H,Tq,Tk] buffer.
  virtual void attention_fwd(const AttnShape& s, const AttnKeys& keys,
                             const T* q, const T* k, const T* v,
                             const T* raw_k, const T* raw_v, T* o, T* lse) = 0;
  // Overwrites dq[B,Tq,H,dh], dk,dv[B,Tk,Hkv,dh], draw_k,draw_v[B,Tq,Hkv,dh]
  // (zero where not self_open; may be nullptr when self_open is nullptr).
  virtual void attention_bwd(const AttnShape& s, const AttnKeys& keys,
                             const T* q, const T* k, const T* v,
                             const T* raw_k, const T* raw_v, const T* o,
                             const T* lse, const T* dout, T* dq, T* dk, T* dv,
                             T* draw_k, T* draw_v) = 0;

  // ---- ATM (SPEC §2): cosine similarity of neighbours, merged keys/values ----
  // rho[B, T-1]: rho_t = x_t.x_{t+1} / (|x_t| |x_{t+1}|), 0 if a norm is 0.
  // Always accumulated in double, stored as double on the host side.
  virtual void atm_similarity(const T* x, int B, int Tn, int d,
                              double* rho_host) = 0;
  // Merge rows of x[B,Tn,w] into out[B,Tn,w] (rows >= n_groups[b] zero):
  // out[b,j] = mean of x[b, group_first[b,j] .. key_end[b,j]].
  virtual void atm_merge_rows(const T* x, int B, int Tn, int w,
                              const int32_t* group_first,
                              const int32_t* key_end, const int32_t* n_groups,
                              T* out) = 0;
  // dx[b,t] += dout[b,j] / |group j| for every member t of group j.
  virtual void atm_merge_rows_bwd(const T* dout, int B, int Tn, int w,
                                  const int32_t* group_first,
                                  const int32_t* key_end,
                                  const int32_t* n_groups, T* dx) = 0;

  // ---- GCLA pieces --------------------------------------------------------------
  // Prefix mean over positions: out[b,t] = mean_{u<=t} x[b,u]; x,out [B,Tn,d].
  virtual void prefix_mean_fwd(const T* x, int B, int Tn, int d, T* out) = 0;
  // dx[b,u] += sum_{t>=u} dout[b,t]/(t+1)   (ACCUMULATES)
  virtual void prefix_mean_bwd(const T* dout, int B, int Tn, int d, T* dx) = 0;
  // Cached decoding: rows are positions pos0..pos0+Tn-1 and carry[B,d] holds
  // the sums of all earlier rows: out[b,i] = (carry[b] + sum_{u<=i} x[b,u]) /
  // (pos0+i+1), then carry[b] += sum_u x[b,u]. Default: on the host (decoding
  // is not the hot path); backends may override.
  virtual void prefix_mean_carry_fwd(const T* x, int B, int Tn, int d, int pos0,
                                     T* carry, T* out) {
    const size_t n = size_t(B) * Tn * d;
    std::vector<T> hx(n), hc(size_t(B) * d), ho(n);
    download(hx.data(), x, n * sizeof(T));
    download(hc.data(), carry, hc.size() * sizeof(T));
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < d; ++j) {
        double acc = double(hc[size_t(b) * d + j]);
        for (int i = 0; i < Tn; ++i) {
          const size_t r = (size_t(b) * Tn + i) * d + j;
          acc += double(hx[r]);
          ho[r] = T(acc / double(pos0 + i + 1));
        }
        hc[size_t(b) * d + j] = T(acc);
      }
    upload(out, ho.data(), n * sizeof(T));
    upload(carry, hc.data(), hc.size() * sizeof(T));
  }
  // Context sub-attention: per token n and head h, softmax over nc context
  // rows of q[n,h].kc[n,i,g]/sqrt(dh), g = h % Hkv.
  // q[N,H,dh], kc,vc[N,nc,Hkv,dh]; out[N,H,dh], probs[N,H,nc].
  virtual void ctx_attention_fwd(const T* q, const T* kc, const T* vc, int N,
                                 int nc, int H, int Hkv, int dh, T* out,
                                 T* probs) = 0;
  // dq ACCUMULATES (q also feeds self-attention); dkc, dvc overwrite.
  virtual void ctx_attention_bwd(const T* q, const T* kc, const T* vc,
                                 const T* probs, const T* dout, int N, int nc,
                                 int H, int Hkv, int dh, T* dq, T* dkc,
                                 T* dvc) = 0;
  // out = (1-beta)*o_self + beta*o_ctx, beta = sigmoid(phi) (phi on host).
  virtual void blend_fwd(const T* o_self, const T* o_ctx, double phi, size_t n,
                         T* out) = 0;
  // d_self = (1-beta) dout, d_ctx = beta dout (overwrite); returns dL/dphi.
  virtual double blend_bwd(const T* o_self, const T* o_ctx, double phi,
                           const T* dout, size_t n, T* d_self, T* d_ctx) = 0;
  // out = sigmoid(pre) * x
  virtual void sigmoid_gate_fwd(const T* pre, const T* x, size_t n, T* out) = 0;
  virtual void sigmoid_gate_bwd(const T* pre, const T* x, const T* dout,
                                size_t n, T* dpre, T* dx) = 0;

  // ---- DSFF pieces -------------------------------------------------------------
  // h = SiLU(g) * u
  virtual void swiglu_fwd(const T* g, const T* u, size_t n, T* h) = 0;
  virtual void swiglu_bwd(const T* g, const T* u, const T* dh, size_t n, T* dg,
                          T* du) = 0;
  // y = GELU(x) (exact erf form)
  virtual void gelu_fwd(const T* x, size_t n, T* y) = 0;
  virtual void gelu_bwd(const T* x, const T* dy, size_t n, T* dx) = 0;
  // out = alpha*a + (1-alpha)*b, alpha = sigmoid(pre)
  virtual void fusion_fwd(const T* pre, const T* a, const T* b, size_t n,
                          T* out) = 0;
  virtual void fusion_bwd(const T* pre, const T* a, const T* b, const T* dout,
                          size_t n, T* dpre, T* da, T* db) = 0;

  // ---- cross-entropy, in three phases so TP can all-reduce between them ----
  // (vocab-parallel: logits[N, V_local] hold columns [v0, v0+V_local).)
  // Phase 1: row_max[N] = max over local columns.
  virtual void ce_row_max(const T* logits, int N, int V_local, T* row_max) = 0;
  // Phase 2: sumexp[N] = sum exp(logit - row_max); tgt[N] = logit[target]
  // if target in the local slice else 0.
  virtual void ce_sumexp_target(const T* logits, const int32_t* targets, int N,
                                int V_local, int v0, const T* row_max,
                                T* sumexp, T* tgt) = 0;
  // Phase 3: loss[N] = log(sumexp) + row_max - tgt, and in place
  // logits <- scale * (softmax - onehot(target)) = dL/dlogits.
  virtual void ce_loss_grad(T* logits, const int32_t* targets, int N,
                            int V_local, int v0, const T* row_max,
                            const T* sumexp, const T* tgt, double scale,
                            T* loss) = 0;
  // Logits-only softmax statistics for evaluation (no gradient).
  virtual void ce_loss(const T* logits, const int32_t* targets, int N,
                       int V_local, int v0, const T* row_max, const T* sumexp,
                       const T* tgt, T* loss) = 0;

  // ---- optimizer -------------------------------------------------------------------
  // PyTorch AdamW on a flat range: p *= 1 - lr*wd; m,v moments; bias
  // corrections bc1 = 1-beta1^t, bc2 = 1-beta2^t.
  virtual void adamw(T* p, const T* g, T* m, T* v, size_t n, double lr,
                     double beta1, double beta2, double eps, double wd,
                     double bc1, double bc2) = 0;
};

// The CPU backend for a scalar type (float for training, double for checks).
template <class T>
std::unique_ptr<Ops<T>> make_cpu_ops();

// Threads of the CPU backend (OpenMP loops and OpenBLAS); n <= 0 keeps the
// runtime default. cpu_threads() reports the current count.
void set_cpu_threads(int n);
int cpu_threads();
// Best-of-`reps` GFLOP/s of an n^3 OpenBLAS sgemm on cpu_threads() threads:
// the machine's matmul rate that benchmarks report against.
double openblas_sgemm_gflops(int n, int reps);

// Owning typed buffer in backend memory.
template <class T, class E = T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Ops<T>& ops, size_t n) : ops_(&ops), n_(n) {
    p_ = n ? static_cast<E*>(ops.alloc_bytes(n * sizeof(E))) : nullptr;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      ops_ = o.ops_; p_ = o.p_; n_ = o.n_;
      o.p_ = nullptr; o.n_ = 0;
    }
    return *this;
  }
  ~Buffer() { release(); }
  E* data() { return p_; }
  const E* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(E); }

 private:
  void release() {
    if (p_) ops_->free_bytes(p_);
    p_ = nullptr;
  }
  Ops<T>* ops_ = nullptr;
  E* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace wiola
