// The op interface: every numerical operation the Wiola model needs, one
// function per op with its backward beside it. `model/` calls only this;
// `kernels/cpu/` implements it with OpenBLAS + OpenMP (float and double, so
// tests can check gradients in double precision); a CUDA backend implements
// it with cuBLAS (bf16 operands, fp32 accumulate).
//
// Conventions
// - Row-major. Shapes are written in brackets; N = tokens = B*T.
// - Every pointer is backend memory (host for the CPU backend, device memory
//   for a GPU, inaccessible memory for the cpu-opaque debug backend). The
//   host never dereferences one; host<->backend copies go through
//   upload/download, and only where the host needs a value (logging, the
//   non-finite check, dumps), batched once per step.
// - Floating-point buffers are typed pointers (kernels/ptr.h): each knows its
//   storage dtype. T, the compute type of Ops<T>, is the type of master
//   weights, gradients and statistics; activations and weight copies use the
//   storage types of precision() (all T on the CPU). Index arrays (token ids,
//   ATM plans) are int32_t/uint8_t, device-side scalars double.
// - Reductions leave their result in backend memory (double accumulators):
//   a loss, a norm or dL/dφ never round-trips to the host inside model code.
// - Allocations are not zero-filled: callers zero() what must start at zero.
// - Backward ops: parameter gradients ACCUMULATE (+=, for micro-batches);
//   activation gradients OVERWRITE unless the comment says "accumulates"
//   (the residual stream and tensors that feed several consumers).
// - Sharded callers (TP) pass their local sizes (local heads, local FFN
//   columns, local vocabulary slice); no op here communicates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/ptr.h"

namespace wiola {

enum class Trans { N, T };

// Names one sequence of ops for Ops::graph: its owner and every host value
// its ops depend on (buffer addresses, sizes, flags) as words. Two calls with
// equal keys must issue equal ops.
struct GraphKey {
  const void* owner = nullptr;
  std::vector<uint64_t> words;
  bool operator==(const GraphKey&) const = default;
};

// Keys of one self-attention call after ATM (docs/model.md §2). Keys are rows sorted
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

// Storage types of the model's buffers. T (Ops<T>) is always the type of
// master weights, gradients, optimizer state and statistics (norm rstd,
// softmax log-sum-exp, loss terms).
struct Precision {
  DType act;       // activations and their gradients (GEMM/attention operands)
  DType residual;  // the residual stream X, the GCLA summaries, their gradients
  DType weight;    // the weight copy GEMMs read
  // Weights live in a copy of the master parameters, refreshed after every
  // optimizer step (Model::refresh_weights), even when weight == T. A GPU
  // in bf16 needs the copy; cpu-opaque can force it to test the plumbing.
  bool separate_weights = false;
};

// Time marks in a backend's order of execution, for op profiles
// (kernels/profiled_ops.h). mark() returns the new mark's index; seconds()
// is the time between two marks, valid once the backend has synchronised.
// The host clock serves backends whose ops finish before they return (the
// CPU); a GPU records events on its stream instead.
class OpTimeline {
 public:
  virtual ~OpTimeline() = default;
  virtual int mark() = 0;
  virtual double seconds(int from, int to) = 0;
  virtual void clear() = 0;  // forget every mark
};
std::unique_ptr<OpTimeline> make_host_timeline();

template <class T>
class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;

  // ---- memory ------------------------------------------------------------
  virtual void* alloc_bytes(size_t bytes) = 0;  // contents undefined
  virtual void free_bytes(void* p) = 0;
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void synchronize() {}
  // True when the host may touch this backend's buffers directly (plain CPU
  // memory): a communicator may then use them as message buffers.
  virtual bool host_accessible() const = 0;
  // The accelerator this backend runs on, in words ("" for the host CPU,
  // which reports describe themselves): reports and the peak-FLOP table key.
  virtual std::string device_name() const { return ""; }
  // The device stream every op of this backend runs on, as an opaque handle
  // (the CUDA backend's cudaStream_t), which a GPU data plane orders its
  // communication against; nullptr for the host backends.
  virtual void* device_stream() const { return nullptr; }
  // Which device this backend runs on, the same string for two backends on
  // one device ("host/domain:bus:device", a GPU's PCI address), so that
  // ranks can tell whether they share one; "" for the host backends.
  virtual std::string device_identity() const { return ""; }
  // Most bytes this backend has held allocated at once (0: not tracked; the
  // CPU backends live in the process's resident set instead).
  virtual size_t peak_bytes() const { return 0; }
  virtual Precision precision() const {
    return {dtype_of<T>(), dtype_of<T>(), dtype_of<T>(), false};
  }
  // Marks for profiling this backend's ops (see OpTimeline).
  virtual std::unique_ptr<OpTimeline> make_timeline() { return make_host_timeline(); }
  // The per-shape GEMM choices of a backend that tunes its matrix products
  // (the CUDA backend with the option gemm = auto; kernels/gemm_tuning.h), as
  // the JSON text of a tuning table: those in use and those measured since
  // the last adopt_gemm_tuning. "" for a backend that does not tune.
  virtual std::string gemm_tuning() const { return ""; }
  // Uses the choices of a table (gemm_tuning()'s text, rank 0's: the trainer
  // broadcasts it so that every rank computes with the same algorithms;
  // docs/gpu.md). Ignored by a backend that does not tune.
  virtual void adopt_gemm_tuning(const std::string& table_json) { (void)table_json; }
  // ---- CUDA Graphs (the backend option cuda_graphs; docs/gpu.md) ----
  // Runs body, which issues ops on this backend, or replays what it issued
  // before. A backend that records graphs (cuda with cuda_graphs = layers)
  // calls body as usual the first time it sees `key`, records what body
  // issues the second time (and runs the recording), and from then on runs
  // the recording without calling body. So body must issue the same ops with
  // the same arguments whenever it is called with an equal key, change no
  // host state the caller relies on, and neither read nor write host memory
  // (no upload, download or synchronize: those invalidate the recording, a
  // loud error). Every other backend calls body().
  virtual void graph(const GraphKey& key, const std::function<void()>& body) {
    (void)key;
    body();
  }
  // Drops the recordings of the keys of this owner (a Model going away:
  // its buffers, which recordings name, are freed).
  virtual void forget_graphs(const void* owner) { (void)owner; }
  // dst[i] = src[i] between storage types (master weights -> weight copy).
  virtual void convert(CPtr src, Ptr dst, size_t n) = 0;
  // dst[r, 0:cols] = src[r, 0:cols] for r < rows: a block of columns of
  // row-major matrices whose rows are ld_dst and ld_src elements apart, one
  // storage type. (The model splits the fused Q|K|V|gate projection's output
  // with srpe_split_fwd, which gives copy_block's bits, SRPE fused in.)
  virtual void copy_block(Ptr dst, int ld_dst, CPtr src, int ld_src, int rows, int cols) = 0;

  // ---- BLAS ----------------------------------------------------------------
  // C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C (accumulated in T or
  // wider whatever the storage types)
  virtual void gemm(Trans ta, Trans tb, int m, int n, int k, T alpha, CPtr A,
                    int lda, CPtr B, int ldb, T beta, Ptr C, int ldc) = 0;
  // The same for `batch` independent problems at fixed strides (elements).
  virtual void gemm_strided_batched(Trans ta, Trans tb, int m, int n, int k,
                                    T alpha, CPtr A, int lda, long sA, CPtr B,
                                    int ldb, long sB, T beta, Ptr C, int ldc,
                                    long sC, int batch) = 0;

  // ---- elementwise and reductions --------------------------------------------
  virtual void add(CPtr a, CPtr b, Ptr out, size_t n) = 0;  // out = a+b
  virtual void axpy(T alpha, CPtr x, Ptr y, size_t n) = 0;  // y += a*x
  virtual void scale(Ptr x, T s, size_t n) = 0;
  // acc[0] += sum of x[i]^2 / of x[i], summed in double; acc is a backend
  // double (the caller zeroes it, then downloads it once when it needs it).
  virtual void sum_squares(CPtr x, size_t n, double* acc) = 0;
  virtual void sum(CPtr x, size_t n, double* acc) = 0;
  // y[i] = y[i] + x[i], added in double: double partial results (dL/dφ after
  // its TP sum) into a gradient.
  virtual void accumulate(const double* x, Ptr y, size_t n) = 0;

  // ---- embedding (vocab-parallel: rows [v0, v0+V_local) live here) --------
  // out[N,d] = E[ids - v0] for ids in range, 0 otherwise.
  virtual void embedding_fwd(const int32_t* ids, int N, CPtr E, int v0,
                             int V_local, int d, Ptr out) = 0;
  // dE[id - v0] += dout[i] for ids in range.
  virtual void embedding_bwd(const int32_t* ids, int N, CPtr dout, int v0,
                             int V_local, int d, Ptr dE) = 0;

  // ---- WiolaRMSNorm: z = x + delta; y = gamma * z / sqrt(mean(z^2) + eps) ----
  // rstd[N] saved for backward. y_op (may be null) gets y again in its own
  // storage type, the bits convert(y, y_op) would write: the GEMM operand
  // copy of a norm output kept wider than the GEMMs' operands (the residual
  // type's X-tilde feeding bf16 GEMMs), made in the same pass.
  virtual void rmsnorm_fwd(CPtr x, CPtr gamma, CPtr delta, int N, int d,
                           double eps, Ptr y, Ptr rstd, Ptr y_op) = 0;
  // The residual add fused with the norm that follows it: s = a + b (the
  // residual stream after a sub-layer; s may be a or b), then the norm of s
  // as rmsnorm_fwd (y_op too). The same results as add, then rmsnorm_fwd, in
  // one pass.
  virtual void add_rmsnorm_fwd(CPtr a, CPtr b, Ptr s, CPtr gamma, CPtr delta,
                               int N, int d, double eps, Ptr y, Ptr rstd,
                               Ptr y_op) = 0;
  // dx = dres + dz: the residual branch's gradient dres joins the norm's
  // (dres may be dx itself: accumulate; or null: dx = dz); dgamma, ddelta
  // accumulate.
  virtual void rmsnorm_bwd(CPtr x, CPtr gamma, CPtr delta, CPtr rstd, CPtr dy,
                           int N, int d, CPtr dres, Ptr dx, Ptr dgamma,
                           Ptr ddelta) = 0;

  // ---- SRPE: rotate-half pairs of each head, in place ------------------------
  // x[B, Tn, nh, dh]; table[Tn, dh/2, 2] = (c, s) for positions of rows
  // 0..Tn-1 (host-computed in float64, rounded once; see model/srpe.h).
  // inverse=true applies the transpose rotation (= the backward pass).
  virtual void srpe_apply(Ptr x, int B, int Tn, int nh, int dh, CPtr table,
                          bool inverse) = 0;
  // SRPE fused with the split of the fused input projection (model/layer.cpp):
  // proj[B Tn, width] holds the column blocks [q: H dh | k: Hkv dh | v: Hkv dh
  // | gate: H dh], width = 2 H dh + 2 Hkv dh, all one storage type.
  // srpe_split_fwd writes q[B,Tn,H,dh] and k[B,Tn,Hkv,dh] rotated, v and
  // gate as they are: the bits of copy_block of each block, then srpe_apply
  // on q and k. srpe_split_bwd writes their gradients' join into dproj with
  // dq and dk rotated back (inverse), dq and dk left as they are: the bits
  // of srpe_apply(inverse) on dq and dk, then copy_block of each into dproj.
  // One pass over the blocks each way, no copies in between.
  virtual void srpe_split_fwd(CPtr proj, int B, int Tn, int H, int Hkv, int dh, CPtr table, Ptr q, Ptr k,
                              Ptr v, Ptr gate) = 0;
  virtual void srpe_split_bwd(CPtr dq, CPtr dk, CPtr dv, CPtr dgate, int B, int Tn, int H, int Hkv, int dh,
                              CPtr table, Ptr dproj) = 0;

  // ---- causal self-attention with GQA and ATM key merging ---------------------
  // q[B,Tq,H,dh], k,v[B,Tk,Hkv,dh], raw_k,raw_v[B,Tq,Hkv,dh] (only read where
  // self_open). out o[B,Tq,H,dh], lse[B,H,Tq] (log-sum-exp of scaled scores,
  // saved for backward). Scale 1/sqrt(dh). Tiled, online softmax: no
  // [B,H,Tq,Tk] buffer.
  virtual void attention_fwd(const AttnShape& s, const AttnKeys& keys, CPtr q,
                             CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, Ptr o,
                             Ptr lse) = 0;
  // Overwrites dq[B,Tq,H,dh], dk,dv[B,Tk,Hkv,dh], draw_k,draw_v[B,Tq,Hkv,dh]
  // (zero where not self_open; may be null when self_open is nullptr).
  virtual void attention_bwd(const AttnShape& s, const AttnKeys& keys, CPtr q,
                             CPtr k, CPtr v, CPtr raw_k, CPtr raw_v, CPtr o,
                             CPtr lse, CPtr dout, Ptr dq, Ptr dk, Ptr dv,
                             Ptr draw_k, Ptr draw_v) = 0;

  // ---- ATM (docs/model.md §2): similarity, merge plan, merged keys/values ----
  // rho[B, Tn-1] (backend doubles): rho_t = x_t.x_{t+1} / (|x_t| |x_{t+1}|),
  // 0 if a norm is 0, accumulated in double.
  virtual void atm_similarity(CPtr x, int B, int Tn, int d, double* rho) = 0;
  // The merge plan of every sequence (kernels/atm_plan.h: Algorithm 1 and the
  // key layout): open[B,Tn], group_first[B,Tn], key_end[B,Tn], n_groups[B].
  virtual void atm_plan(const double* rho, int B, int Tn, double tau,
                        uint8_t* open, int32_t* group_first, int32_t* key_end,
                        int32_t* n_groups) = 0;
  // Merge rows of x[B,Tn,w] into out[B,Tn,w] (rows >= n_groups[b] zero):
  // out[b,j] = mean of x[b, group_first[b,j] .. key_end[b,j]].
  virtual void atm_merge_rows(CPtr x, int B, int Tn, int w,
                              const int32_t* group_first,
                              const int32_t* key_end, const int32_t* n_groups,
                              Ptr out) = 0;
  // dx[b,t] += dout[b,j] / |group j| for every member t of group j.
  virtual void atm_merge_rows_bwd(CPtr dout, int B, int Tn, int w,
                                  const int32_t* group_first,
                                  const int32_t* key_end,
                                  const int32_t* n_groups, Ptr dx) = 0;

  // ---- GCLA pieces --------------------------------------------------------------
  // Prefix mean over positions: out[b,t] = mean_{u<=t} x[b,u]; x,out [B,Tn,d].
  // out_op (may be null) gets out again in its own storage type, the bits
  // convert(out, out_op) would write: the context projections' GEMM operand
  // of a summary, made once in this pass (as rmsnorm_fwd's y_op).
  virtual void prefix_mean_fwd(CPtr x, int B, int Tn, int d, Ptr out, Ptr out_op) = 0;
  // dx[b,u] += sum_{t>=u} dout[b,t]/(t+1)   (ACCUMULATES)
  virtual void prefix_mean_bwd(CPtr dout, int B, int Tn, int d, Ptr dx) = 0;
  // Cached decoding: rows are positions pos0..pos0+Tn-1 and carry[B,d] holds
  // the sums of all earlier rows: out[b,i] = (carry[b] + sum_{u<=i} x[b,u]) /
  // (pos0+i+1), then carry[b] += sum_u x[b,u]. out_op as in prefix_mean_fwd.
  virtual void prefix_mean_carry_fwd(CPtr x, int B, int Tn, int d, int pos0,
                                     Ptr carry, Ptr out, Ptr out_op) = 0;
  // Context sub-attention: per token n and head h, softmax over nc context
  // rows of q[n,h].kc[n,i,g]/sqrt(dh), g = h % Hkv.
  // q[N,H,dh]; out[N,H,dh], probs[N,H,nc]. kc, vc: the nc context rows of
  // each token, row (n, i) at (n nc + i) ldkv, each [Hkv, dh] (ldkv >= Hkv
  // dh): Hkv dh for [N,nc,Hkv,dh] tensors, 2 Hkv dh for the interleaved
  // keys|values [N,nc,2,Hkv,dh] of the merged context projection (vc = kc +
  // Hkv dh).
  virtual void ctx_attention_fwd(CPtr q, CPtr kc, CPtr vc, int N, int nc,
                                 int H, int Hkv, int dh, int ldkv, Ptr out,
                                 Ptr probs) = 0;
  // dq ACCUMULATES (q also feeds self-attention); dkc, dvc overwrite their
  // rows (the layout of kc, vc; the elements between rows are untouched).
  virtual void ctx_attention_bwd(CPtr q, CPtr kc, CPtr vc, CPtr probs,
                                 CPtr dout, int N, int nc, int H, int Hkv,
                                 int dh, int ldkv, Ptr dq, Ptr dkc, Ptr dvc) = 0;
  // out = (1-beta)*o_self + beta*o_ctx, beta = sigmoid(phi[0]); phi is the
  // layer's φ in backend memory (read by the op: no host round trip).
  virtual void blend_fwd(CPtr o_self, CPtr o_ctx, CPtr phi, size_t n,
                         Ptr out) = 0;
  // d_self = (1-beta) dout, d_ctx = beta dout (overwrite); dphi[0] (backend
  // double) = dL/dφ of this call (overwrite; summed in double).
  virtual void blend_bwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr dout,
                         size_t n, Ptr d_self, Ptr d_ctx, double* dphi) = 0;
  // out = sigmoid(pre) * x
  virtual void sigmoid_gate_fwd(CPtr pre, CPtr x, size_t n, Ptr out) = 0;
  virtual void sigmoid_gate_bwd(CPtr pre, CPtr x, CPtr dout, size_t n,
                                Ptr dpre, Ptr dx) = 0;
  // The blend and the gate after it in one pass: o = blend_fwd(o_self,
  // o_ctx, phi), og = sigmoid(pre) * o, with o rounded to its storage type
  // before the gate reads it: the bits of blend_fwd, then sigmoid_gate_fwd.
  virtual void blend_gate_fwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre,
                              size_t n, Ptr o, Ptr og) = 0;
  // Their backward in one pass: sigmoid_gate_bwd(pre, o, dog) into dpre and
  // dL/do (rounded to the storage type of d_self, never stored), then
  // blend_bwd of dL/do into d_self, d_ctx and dphi[0]: the bits of the two.
  virtual void blend_gate_bwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre,
                              CPtr o, CPtr dog, size_t n, Ptr dpre,
                              Ptr d_self, Ptr d_ctx, double* dphi) = 0;

  // ---- DSFF pieces -------------------------------------------------------------
  // h = SiLU(g) * u
  virtual void swiglu_fwd(CPtr g, CPtr u, size_t n, Ptr h) = 0;
  virtual void swiglu_bwd(CPtr g, CPtr u, CPtr dh, size_t n, Ptr dg,
                          Ptr du) = 0;
  // y = GELU(x) (exact erf form)
  virtual void gelu_fwd(CPtr x, size_t n, Ptr y) = 0;
  virtual void gelu_bwd(CPtr x, CPtr dy, size_t n, Ptr dx) = 0;
  // out = res + alpha*a + (1-alpha)*b, alpha = sigmoid(pre): the fusion gate
  // with the residual add after it (res may be null: no residual).
  virtual void fusion_fwd(CPtr pre, CPtr a, CPtr b, CPtr res, size_t n,
                          Ptr out) = 0;
  virtual void fusion_bwd(CPtr pre, CPtr a, CPtr b, CPtr dout, size_t n,
                          Ptr dpre, Ptr da, Ptr db) = 0;

  // ---- cross-entropy, in three phases so TP can all-reduce between them ----
  // (vocab-parallel: logits[N, V_local] hold columns [v0, v0+V_local).)
  // Phase 1: row_max[N] = max over local columns.
  virtual void ce_row_max(CPtr logits, int N, int V_local, Ptr row_max) = 0;
  // Phase 2: sumexp[N] = sum exp(logit - row_max); tgt[N] = logit[target]
  // if target in the local slice else 0.
  virtual void ce_sumexp_target(CPtr logits, const int32_t* targets, int N,
                                int V_local, int v0, CPtr row_max, Ptr sumexp,
                                Ptr tgt) = 0;
  // Phase 3: loss[N] = log(sumexp) + row_max - tgt, and in place
  // logits <- scale * (softmax - onehot(target)) = dL/dlogits.
  virtual void ce_loss_grad(Ptr logits, const int32_t* targets, int N,
                            int V_local, int v0, CPtr row_max, CPtr sumexp,
                            CPtr tgt, double scale, Ptr loss) = 0;
  // Logits-only softmax statistics for evaluation (no gradient).
  virtual void ce_loss(CPtr logits, const int32_t* targets, int N, int V_local,
                       int v0, CPtr row_max, CPtr sumexp, CPtr tgt,
                       Ptr loss) = 0;

  // ---- optimizer -------------------------------------------------------------------
  // PyTorch AdamW on a flat range: p *= 1 - lr*wd; m,v moments; bias
  // corrections bc1 = 1-beta1^t, bc2 = 1-beta2^t. Fused with the passes that
  // follow an update: w (may be null) gets the updated p in its own storage
  // type, the bits convert(p, w) would write (the weight copy GEMMs read),
  // and with zero_grad g is zeroed once read (ready for the next step's
  // accumulation).
  virtual void adamw(Ptr p, Ptr g, Ptr m, Ptr v, size_t n, double lr,
                     double beta1, double beta2, double eps, double wd,
                     double bc1, double bc2, Ptr w, bool zero_grad) = 0;
};

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
  static constexpr DType dtype() { return dtype_of<E>(); }

 private:
  void release() {
    if (p_) ops_->free_bytes(p_);
    p_ = nullptr;
  }
  Ops<T>* ops_ = nullptr;
  E* p_ = nullptr;
  size_t n_ = 0;
};


// Owning buffer whose element type is chosen at run time (activations, in the
// storage type the backend's precision() names).
template <class T>
class DynBuffer {
 public:
  DynBuffer() = default;
  DynBuffer(Ops<T>& ops, DType t, size_t n)
      : bytes_(Buffer<T, unsigned char>(ops, n * dtype_bytes(t))), t_(t), n_(n) {}
  Ptr data() { return Ptr(bytes_.data(), t_); }
  CPtr data() const { return CPtr(bytes_.data(), t_); }
  size_t size() const { return n_; }
  size_t bytes() const { return bytes_.bytes(); }
  DType dtype() const { return t_; }

 private:
  Buffer<T, unsigned char> bytes_;
  DType t_ = DType::F32;
  size_t n_ = 0;
};

}  // namespace wiola
