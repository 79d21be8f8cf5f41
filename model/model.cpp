#include "model/model.h"

#include <algorithm>
#include <cstddef>
#include <tuple>
#include <utility>

#include "model/srpe.h"
#include "util/error.h"

namespace wiola {
namespace {
// Ids come from files; a bad one is an input error, not a crash.
void check_ids(const int32_t* ids, int n, int V, const char* what) {
  for (int i = 0; i < n; ++i)
    WIOLA_CHECK(ids[i] >= 0 && ids[i] < V, what, " id ", ids[i], " at position ", i, " is outside the vocabulary [0, ",
                V, ")");
}
// ATM's groups and visible (query, key) pairs counted document by document
// (starts [B, T]), and the causal pairs of the documents: sum len (len+1) / 2.
std::tuple<int64_t, int64_t, double> documents_atm_pairs(const std::vector<uint8_t>& open,
                                                         const std::vector<int32_t>& starts, int B, int T) {
  int64_t groups = 0, visible = 0;
  double causal = 0;
  for (int b = 0; b < B; ++b)
    for (int s = 0, e = 0; s < T; s = e) {
      for (e = s + 1; e < T && starts[size_t(b) * T + size_t(e)] == s;) ++e;
      const auto first = open.begin() + ptrdiff_t(size_t(b) * T + size_t(s));
      const AtmLayout lay = atm_layout(std::vector<uint8_t>(first, first + (e - s)), 1, e - s);
      groups += lay.total_groups();
      visible += lay.visible_pairs();
      causal += double(e - s) * (e - s + 1) / 2.0;
    }
  return {groups, visible, causal};
}
// Context pointers live in fixed arrays of this size.
constexpr int kMaxLambda = 16;

// The key of a layer's forward or backward for Ops::graph (CUDA Graphs,
// docs/gpu.md): every host value its ops depend on besides the model's own
// fixed state (configuration, parameter and scratch buffers, which the key's
// owner, the Model, stands for; they are in it too): which pass and layer,
// the flags and sizes, and every buffer address, which differ by slot, by
// the residual-gradient buffers' alternation and under recompute. ATM's
// decisions stay on the device and are not part of it: its kernels read the
// plan from memory, so one recording serves every step's merges.
struct LayerGraphKey {
  GraphKey key;
  explicit LayerGraphKey(const void* owner) { key.owner = owner; }
  LayerGraphKey& operator<<(int64_t v) {
    key.words.push_back(uint64_t(v));
    return *this;
  }
  LayerGraphKey& operator<<(const void* p) {
    key.words.push_back(uint64_t(reinterpret_cast<uintptr_t>(p)));
    return *this;
  }
  LayerGraphKey& operator<<(CPtr p) { return *this << p.raw(); }
};
enum LayerPass : int64_t { kGraphForward = 1, kGraphBackward = 2, kGraphRecompute = 3 };
}  // namespace

// Summary index s: s = 0 is S(-1) = P(X0); s = l+1 is S(l) = P(X(l+1)).
// Layer l reads s = max(0, l+1-Lambda) .. l. A stage [l0, l1) holds
// s in [max(0, l0+1-Lambda), l1-1]; those below l0 come from the previous
// stage, s = l0 is P(X(l0)) of its input, the rest it makes itself.

// What one micro-batch keeps from its forward to its backward.
template <class T>
struct Model<T>::Slot {
  Buffer<T, int32_t> ids;       // [N] (first stage)
  Buffer<T, int32_t> doc;       // [N] document starts (documents on; LayerCtx::doc_start)
  std::vector<DynBuffer<T>> X;  // nl+1 residual streams [N, d]
  std::vector<DynBuffer<T>> S;  // summaries held by the stage [N, d]
  // Their context-projection GEMM operands [N, d] in the activation type where
  // that is narrower than the residual type (empty otherwise): written with
  // each summary (or converted once from a received one), read by every
  // GEMM of every layer that reads the summary, forward and backward.
  std::vector<DynBuffer<T>> S_op;
  std::vector<LayerActs<T>> acts;  // per layer (empty with recompute)
  Buffer<T> rstd_f;                // last stage: final-norm rstd [N]
  DynBuffer<T> dx_top;             // last stage: dX(L) [N, d]
};

template <class T>
struct Model<T>::Impl {
  int B = 0, T_ = 0, N = 0, l0 = 0, l1 = 0, nl = 0;
  Buffer<T> srpe;              // [T, dh/2, 2] positions 0..T-1
  Buffer<T> srpe_dec;          // [T, dh/2, 2] for a decoding chunk
  Buffer<T, int32_t> targets;  // [N]
  std::vector<Slot> slots;
  LayerActs<T> scratch;  // recompute: one layer's activations
  // Split backward: per weight slot, per layer, B's operands for W.
  std::vector<std::vector<LayerWeightInputs<T>>> wk;
  LayerWork<T> work;
  DynBuffer<T> xtmp;             // recompute: discarded layer output
  std::vector<DynBuffer<T>> dS;  // summary gradients [N, d]
  DynBuffer<T> dcur, dprev;      // residual-stream gradients [N, d]
  // head (last stage), shared: consumed inside the forward
  DynBuffer<T> xf, logits, dxf;          // [N, d], [N, V_local], [N, d]
  Buffer<T> row_max, sumexp, tgt, loss;  // [N] statistics
  Buffer<T, double> loss_sum;            // [1] CE sum since take_loss_sum()
  Buffer<T> zloss;                       // [N] z * lse^2 (z-loss on)
  Buffer<T, double> zloss_sum;           // [1] their sum since take_z_loss_sum() (z-loss on)
  LayerCtx<T> ctx(Ops<T>& ops, const ModelConfig& cfg, const LocalDims& ld, TpCollectives* tp, int n, CPtr table,
                  const Precision& prec, const int32_t* doc = nullptr) const {
    return LayerCtx<T>{ops, cfg, ld, tp, B, n, table, prec, work.proj, doc};
  }

  // Every buffer of the stage [l0, l1) for `opt`'s micro-batch, slots and
  // backward, in this order: the SRPE tables, targets and loss sum, the
  // activation slots, recompute's scratch, the split backward's weight
  // inputs, the backward's gradients and work, the head (last stage).
  void allocate(Ops<T>& ops, const ModelConfig& cfg, const LocalDims& ld, TpCollectives* tp, const Precision& prec,
                const ModelOptions& opt, int layer_begin, int layer_end, int summaries, bool last) {
    B = opt.micro_batch;
    T_ = cfg.T;
    N = B * T_;
    l0 = layer_begin;
    l1 = layer_end;
    nl = l1 - l0;
    const auto table = srpe_table<T>(cfg, 0, cfg.T);
    srpe = Buffer<T>(ops, table.size());
    ops.upload(srpe.data(), table.data(), table.size() * sizeof(T));
    srpe_dec = Buffer<T>(ops, table.size());
    targets = Buffer<T, int32_t>(ops, size_t(N));
    loss_sum = Buffer<T, double>(ops, 1);
    ops.zero(loss_sum.data(), loss_sum.bytes());
    if (opt.z_loss > 0) {
      zloss = Buffer<T>(ops, size_t(N));
      zloss_sum = Buffer<T, double>(ops, 1);
      ops.zero(zloss_sum.data(), zloss_sum.bytes());
    }
    const LayerCtx<T> c = ctx(ops, cfg, ld, tp, T_, srpe.data(), prec);
    allocate_slots(c, opt, summaries, last);
    allocate_backward(c, opt, summaries);
    if (last) allocate_head(c);
  }

  // The activation slots; recompute's scratch layer.
  void allocate_slots(const LayerCtx<T>& c, const ModelOptions& opt, int summaries, bool last) {
    Ops<T>& ops = c.ops;
    const size_t n = size_t(N), d = size_t(c.cfg.d);
    const DType res = c.prec.residual, act = c.prec.act;
    slots.resize(size_t(opt.slots));
    for (Slot& sl : slots) {
      sl.ids = Buffer<T, int32_t>(ops, n);
      if (opt.documents_eos >= 0) sl.doc = Buffer<T, int32_t>(ops, n);
      for (int i = 0; i <= nl; ++i) sl.X.emplace_back(ops, res, n * d);
      for (int s = 0; s < summaries; ++s) sl.S.emplace_back(ops, res, n * d);
      if (dtype_bytes(act) < dtype_bytes(res))
        for (int s = 0; s < summaries; ++s) sl.S_op.emplace_back(ops, act, n * d);
      if (!opt.recompute) {
        sl.acts.resize(size_t(nl));
        for (int l = l0; l < l1; ++l) sl.acts[size_t(l - l0)].allocate(c, c.cfg.n_ctx(l));
      }
      if (last) {
        sl.rstd_f = Buffer<T>(ops, n);
        sl.dx_top = DynBuffer<T>(ops, res, n * d);
      }
    }
    if (opt.recompute) {
      scratch.allocate(c, c.cfg.Lambda);
      xtmp = DynBuffer<T>(ops, res, n * d);
    }
  }

  // The split backward's weight inputs, the summary and residual-stream
  // gradients and the layer work space.
  void allocate_backward(const LayerCtx<T>& c, const ModelOptions& opt, int summaries) {
    Ops<T>& ops = c.ops;
    const size_t n = size_t(N), d = size_t(c.cfg.d);
    const DType res = c.prec.residual;
    WIOLA_CHECK(opt.weight_slots >= 0, "weight slots must not be negative (got ", opt.weight_slots, ")");
    if (opt.split_backward) {
      wk.resize(size_t(opt.weight_slots > 0 ? opt.weight_slots : opt.slots));
      for (auto& set : wk) {
        set.resize(size_t(nl));
        for (int l = l0; l < l1; ++l) set[size_t(l - l0)].allocate(c, c.cfg.n_ctx(l), opt.recompute);
      }
    }
    for (int s = 0; s < summaries; ++s) dS.emplace_back(ops, res, n * d);
    work.allocate(c);
    dcur = DynBuffer<T>(ops, res, n * d);
    dprev = DynBuffer<T>(ops, res, n * d);
  }

  // The last stage's head: final norm, logits and the loss statistics.
  void allocate_head(const LayerCtx<T>& c) {
    Ops<T>& ops = c.ops;
    const size_t n = size_t(N), d = size_t(c.cfg.d);
    const DType act = c.prec.act;
    xf = DynBuffer<T>(ops, act, n * d);
    logits = DynBuffer<T>(ops, act, n * size_t(c.ld.V));
    row_max = Buffer<T>(ops, n);
    sumexp = Buffer<T>(ops, n);
    tgt = Buffer<T>(ops, n);
    loss = Buffer<T>(ops, n);
    dxf = DynBuffer<T>(ops, act, n * d);
  }
};

namespace {
// Flat ranges for grad-ready reports: a layer's tensors are contiguous.
// Each range runs to the end of its last tensor's span, so the padding is
// reported with it and every bucket of the optimizer completes.
std::vector<std::pair<size_t, size_t>> layer_ranges(const ParamLayout& layout, int l0, int l1) {
  std::vector<std::pair<size_t, size_t>> ranges;
  for (int l = l0; l < l1; ++l) {
    const std::string prefix = layer_param_name(l, "");
    size_t lo = layout.total(), hi = 0;
    for (const ParamEntry& e : layout.entries())
      if (e.name.compare(0, prefix.size(), prefix) == 0) {
        lo = std::min(lo, e.offset);
        hi = std::max(hi, e.offset + e.span);
      }
    ranges.emplace_back(lo, hi);
  }
  return ranges;
}
}  // namespace

template <class T>
Model<T>::Model(Ops<T>& ops, const ModelConfig& cfg, const ModelShard& shard, TpCollectives* tp,
                const ModelOptions& opt, const ParamStore<T>* store)
    : ops_(ops),
      cfg_(cfg),
      shard_(shard),
      tp_(tp),
      opt_(opt),
      prec_(ops.precision()),
      layout_(store ? store->layout : ParamLayout((cfg.validate(), cfg), shard, opt.param_align)),
      ld_(cfg, shard),
      impl_(std::make_unique<Impl>()) {
  WIOLA_CHECK(cfg.Lambda <= kMaxLambda, "model.lookback (", cfg.Lambda, ") must be at most ", kMaxLambda);
  WIOLA_CHECK(opt.micro_batch >= 1, "micro-batch must be at least 1 (got ", opt.micro_batch, ")");
  WIOLA_CHECK(opt.slots >= 1, "activation slots must be at least 1 (got ", opt.slots, ")");
  const int l1 = shard.end(cfg);
  WIOLA_CHECK(shard.layer_begin >= 0 && shard.layer_begin < l1 && l1 <= cfg.L, "layer range [", shard.layer_begin, ", ",
              l1, ") is not inside 0..", cfg.L);
  const bool copy = prec_.separate_weights || prec_.weight != dtype_of<T>();
  if (store) {
    cfg.validate();
    WIOLA_CHECK(store->params && store->grads && bool(store->weights) == copy,
                "internal: the parameter store lacks a buffer this precision needs");
    pbase_ = store->params;
    gbase_ = store->grads;
    wbase_ = store->weights;
  } else {
    params_ = Buffer<T>(ops, layout_.total());
    grads_ = Buffer<T>(ops, layout_.total());
    ops.zero(grads_.data(), grads_.bytes());
    pbase_ = params_.data();
    gbase_ = grads_.data();
    if (copy) {
      weights_ = DynBuffer<T>(ops, prec_.weight, layout_.total());
      wbase_ = weights_.data();
    }
  }
  w_ = ModelParams::bind_forward(layout_, wbase_ ? wbase_ : Ptr(pbase_), pbase_, cfg, shard);
  g_ = ModelParams::bind(layout_, gbase_, cfg, shard);
  atm_open_.resize(size_t(cfg.L));
  atm_valid_.assign(size_t(cfg.L), false);
  layer_range_ = layer_ranges(layout_, shard.layer_begin, l1);
  if (const ParamEntry* e = shard.last_stage(cfg) ? layout_.try_find("model.norm.weight") : nullptr) {
    const ParamEntry& o = layout_.find("model.norm.offset");
    norm_range_ = {std::min(e->offset, o.offset), std::max(e->offset + e->span, o.offset + o.span)};
  }

  impl_->allocate(ops, cfg_, ld_, tp_, prec_, opt, shard.layer_begin, l1, n_summaries(), shard.last_stage(cfg));
  for (int l = shard.layer_begin; l < l1; ++l)
    if (cfg.atm_layer(l)) atm_open_[size_t(l)] = Buffer<T, uint8_t>(ops, size_t(impl_->N));
}

template <class T>
Model<T>::~Model() {
  ops_.forget_graphs(this);  // recordings name this model's buffers
}

template <class T>
typename Model<T>::Slot& Model<T>::slot(int i) {
  WIOLA_CHECK(i >= 0 && i < int(impl_->slots.size()), "activation slot ", i, " outside 0..", impl_->slots.size() - 1);
  return impl_->slots[size_t(i)];
}

template <class T>
int Model<T>::summary_lo() const {
  return std::max(0, shard_.layer_begin + 1 - cfg_.Lambda);
}

template <class T>
int Model<T>::n_summaries() const {
  // s_hi = l1 - 1 (layer l1-1 reads s up to l1-1).
  return shard_.end(cfg_) - summary_lo();
}

template <class T>
int Model<T>::send_lo() const {
  return std::max(0, shard_.end(cfg_) + 1 - cfg_.Lambda);
}

// ctx: what the layer's context-projection GEMMs read, the summaries' operand
// copies where the slot has them (the same bits the GEMMs would convert).
template <class T>
void Model<T>::context(const Slot& sl, int l, CPtr* ctx, Ptr* dctx) {
  const int nc = cfg_.n_ctx(l), lo = summary_lo();
  for (int i = 0; i < nc; ++i) {
    const int s = l + 1 - nc + i;  // oldest first
    ctx[i] = sl.S_op.empty() ? sl.S[size_t(s - lo)].data() : sl.S_op[size_t(s - lo)].data();
    if (dctx) dctx[i] = impl_->dS[size_t(s - lo)].data();
  }
}

template <class T>
void Model<T>::init(uint64_t seed) {
  std::vector<T> host(layout_.total());
  init_params_host(layout_, seed, host.data());
  ops_.upload(pbase_, host.data(), host.size() * sizeof(T));
  refresh_weights();
}

template <class T>
void Model<T>::refresh_weights() {
  if (wbase_) ops_.convert(pbase_, wbase_, layout_.total());
}

template <class T>
double Model<T>::take_loss_sum() {
  double s = 0;
  ops_.download(&s, impl_->loss_sum.data(), sizeof s);
  ops_.zero(impl_->loss_sum.data(), impl_->loss_sum.bytes());
  return s;
}

template <class T>
double Model<T>::take_z_loss_sum() {
  if (opt_.z_loss <= 0) return 0;
  double s = 0;
  ops_.download(&s, impl_->zloss_sum.data(), sizeof s);
  ops_.zero(impl_->zloss_sum.data(), impl_->zloss_sum.bytes());
  return s;
}

template <class T>
std::vector<T> Model<T>::token_losses() const {
  WIOLA_CHECK(shard_.last_stage(cfg_), "token_losses: only the last stage computes the loss");
  std::vector<T> out(impl_->loss.size());
  ops_.download(out.data(), impl_->loss.data(), out.size() * sizeof(T));
  return out;
}

// Logits [count] as T on the host, whatever their storage type.
template <class T>
std::vector<T> Model<T>::download_logits(size_t count) const {
  std::vector<T> out(count);
  CPtr src = impl_->logits.data();
  if (src.dtype() == dtype_of<T>()) {
    ops_.download(out.data(), src.raw(), count * sizeof(T));
  } else {
    Buffer<T> tmp(ops_, count);
    ops_.convert(src, tmp.data(), count);
    ops_.download(out.data(), tmp.data(), count * sizeof(T));
  }
  return out;
}

template <class T>
void Model<T>::zero_grads() {
  ops_.zero(gbase_, layout_.total() * sizeof(T));
}

template <class T>
size_t Model<T>::activation_bytes() const {
  const Impl& m = *impl_;
  size_t b = m.scratch.arena.bytes() + m.xtmp.bytes() + m.xf.bytes() + m.logits.bytes();
  for (const auto& set : m.wk)
    for (const auto& k : set) b += k.arena.bytes();
  for (const Slot& sl : m.slots) {
    for (const auto& a : sl.acts) b += a.arena.bytes();
    for (const auto& x : sl.X) b += x.bytes();
    for (const auto& s : sl.S) b += s.bytes();
    for (const auto& s : sl.S_op) b += s.bytes();
    b += sl.rstd_f.bytes() + sl.dx_top.bytes();
  }
  return b;
}

template <class T>
typename Model<T>::Memory Model<T>::memory() const {
  const Impl& m = *impl_;
  Memory r;
  r.master = params_.bytes();
  r.grads = grads_.bytes();
  r.weights = weights_.bytes();
  r.activations = activation_bytes();
  r.workspace = m.work.arena.bytes() + m.dcur.bytes() + m.dprev.bytes() + m.dxf.bytes() + m.row_max.bytes() +
                m.sumexp.bytes() + m.tgt.bytes() + m.loss.bytes();
  for (const auto& x : m.dS) r.workspace += x.bytes();
  return r;
}

template <class T>
typename Model<T>::Memory Model<T>::plan_memory(Ops<T>& ops, const ModelConfig& cfg, const ModelShard& shard,
                                                const ModelOptions& opt, const Precision& prec) {
  // Mirrors the constructor's allocations (tests/model checks the two agree).
  const LocalDims ld(cfg, shard);
  const ParamLayout layout(cfg, shard, opt.param_align);
  const size_t n = layout.total(), N = size_t(opt.micro_batch) * cfg.T, d = size_t(cfg.d);
  const size_t res = dtype_bytes(prec.residual), act = dtype_bytes(prec.act), st = sizeof(T);
  Memory r;
  r.master = r.grads = n * sizeof(T);
  if (prec.separate_weights || prec.weight != dtype_of<T>()) r.weights = n * dtype_bytes(prec.weight);
  const LayerCtx<T> c{ops, cfg, ld, nullptr, opt.micro_batch, cfg.T, CPtr{}, prec, Ptr{}};
  const int l0 = shard.layer_begin, l1 = shard.end(cfg), nl = l1 - l0;
  const int n_summ = l1 - std::max(0, l0 + 1 - cfg.Lambda);
  const bool last = shard.last_stage(cfg);
  size_t slot = size_t(nl + 1 + n_summ) * N * d * res;
  if (act < res) slot += size_t(n_summ) * N * d * act;  // the summaries' GEMM operands (Slot::S_op)
  if (!opt.recompute)
    for (int l = l0; l < l1; ++l) {
      LayerActs<T> a;
      a.reserve(c, cfg.n_ctx(l));
      slot += a.arena.reserved_bytes();
    }
  if (last) slot += N * st + N * d * res;
  r.activations = size_t(opt.slots) * slot;
  if (opt.split_backward)
    for (int l = l0; l < l1; ++l) {
      LayerWeightInputs<T> k;
      k.reserve(c, cfg.n_ctx(l), opt.recompute);
      r.activations += size_t(opt.weight_slots > 0 ? opt.weight_slots : opt.slots) * k.arena.reserved_bytes();
    }
  if (opt.recompute) {
    LayerActs<T> a;
    a.reserve(c, cfg.Lambda);
    r.activations += a.arena.reserved_bytes() + N * d * res;
  }
  if (last) r.activations += N * d * act + N * size_t(ld.V) * act;
  LayerWork<T> w;
  w.reserve(c);
  r.workspace = w.arena.reserved_bytes() + size_t(n_summ + 2) * N * d * res;
  if (last) r.workspace += N * d * act + 4 * N * st;
  return r;
}

template <class T>
void Model<T>::report_ready(size_t offset, size_t size) {
  if (grad_ready_armed_ && grad_ready_ && size) grad_ready_(offset, size);
}

// ---- pipeline boundaries -------------------------------------------------------
template <class T>
int Model<T>::boundary_in() const {
  return boundary_tensors_in(cfg_, shard_);
}

template <class T>
int Model<T>::boundary_out() const {
  return boundary_tensors_out(cfg_, shard_);
}

template <class T>
std::vector<Ptr> Model<T>::fwd_in(int i) {
  Slot& sl = slot(i);
  std::vector<Ptr> out;
  if (boundary_in() == 0) return out;
  out.push_back(sl.X[0].data());
  for (int s = summary_lo(); s < shard_.layer_begin; ++s) out.push_back(sl.S[size_t(s - summary_lo())].data());
  return out;
}

template <class T>
std::vector<CPtr> Model<T>::fwd_out(int i) const {
  const Slot& sl = impl_->slots.at(size_t(i));
  std::vector<CPtr> out;
  if (boundary_out() == 0) return out;
  out.push_back(sl.X[size_t(impl_->nl)].data());
  for (int s = send_lo(); s < shard_.end(cfg_); ++s) out.push_back(sl.S[size_t(s - summary_lo())].data());
  return out;
}

template <class T>
std::vector<Ptr> Model<T>::bwd_in() {
  std::vector<Ptr> out;
  if (boundary_out() == 0) return out;
  out.push_back(impl_->dcur.data());
  for (int s = send_lo(); s < shard_.end(cfg_); ++s) out.push_back(impl_->dS[size_t(s - summary_lo())].data());
  return out;
}

template <class T>
std::vector<CPtr> Model<T>::bwd_out() const {
  std::vector<CPtr> out;
  if (boundary_in() == 0) return out;
  out.push_back(impl_->dcur.data());
  for (int s = summary_lo(); s < shard_.layer_begin; ++s) out.push_back(impl_->dS[size_t(s - summary_lo())].data());
  return out;
}

// ---- forward -----------------------------------------------------------------
// inputs_host [B, n] (first stage); n = T except in cached decoding. Other
// stages find X(l0) and the summaries below l0 in the slot (fwd_in).
template <class T>
void Model<T>::forward(Slot& sl, const int32_t* inputs_host, int n, bool training, KvCache<T>* cache) {
  Impl& m = *impl_;
  const int B = m.B, d = cfg_.d, N = B * n;
  const size_t nd = size_t(N) * d;
  const int pos0 = cache ? cache->len : 0;
  CPtr srpe = m.srpe.data();
  if (cache) {
    WIOLA_CHECK(shard_.first_stage() && shard_.last_stage(cfg_), "cached decoding needs the whole layer range");
    const auto table = srpe_table<T>(cfg_, pos0, n);
    ops_.upload(m.srpe_dec.data(), table.data(), table.size() * sizeof(T));
    srpe = m.srpe_dec.data();
  }
  // Documents (never in cached decoding: a prompt is one document).
  const int32_t* doc = nullptr;
  if (opt_.documents_eos >= 0 && !cache) {
    std::vector<int32_t> starts(static_cast<size_t>(N));
    document_starts(inputs_host, B, n, opt_.documents_eos, starts.data());
    ops_.upload(sl.doc.data(), starts.data(), starts.size() * sizeof(int32_t));
    doc = sl.doc.data();
    if (training) doc_starts_ = std::move(starts);  // for atm_stats
  }
  const LayerCtx<T> c = m.ctx(ops_, cfg_, ld_, tp_, n, srpe, prec_, doc);
  if (shard_.first_stage()) {
    check_ids(inputs_host, N, cfg_.V, "token");
    ops_.upload(sl.ids.data(), inputs_host, size_t(N) * sizeof(int32_t));
    // X(0) = E[x] (vocab-parallel: each TP rank contributes its rows).
    ops_.embedding_fwd(sl.ids.data(), N, w_.embed, ld_.v0, ld_.V, d, sl.X[0].data());
    tp_sum(tp_, sl.X[0].data(), nd);
  }
  // Summaries are prefix means of the raw residual stream (docs/model.md §2),
  // written with their GEMM operand copies (Slot::S_op) in the same pass.
  const int lo = summary_lo();
  auto op_copy = [&](int s) { return sl.S_op.empty() ? Ptr() : sl.S_op[size_t(s - lo)].data(); };
  auto summarize = [&](int s, CPtr x) {
    Ptr out = sl.S[size_t(s - lo)].data();
    if (cache) ops_.prefix_mean_carry_fwd(x, B, n, d, pos0, cache->carry[size_t(s - lo)].data(), out, op_copy(s));
    else ops_.prefix_mean_fwd(x, B, n, d, doc, out, op_copy(s));
  };
  // Summaries received from the previous stage (fwd_in, residual type as
  // sent) get their operand copies here, once.
  if (!sl.S_op.empty())
    for (int s = lo; s < shard_.layer_begin; ++s) ops_.convert(sl.S[size_t(s - lo)].data(), op_copy(s), nd);
  summarize(m.l0, sl.X[0].data());

  CPtr ctx[kMaxLambda];
  for (int l = m.l0; l < m.l1; ++l) {
    const int i = l - m.l0, nc = cfg_.n_ctx(l);
    context(sl, l, ctx, nullptr);
    LayerActs<T>& a = opt_.recompute ? m.scratch : sl.acts[size_t(i)];
    KvSlot kv;
    if (cache) kv = KvSlot{cache->k[size_t(i)].data(), cache->v[size_t(i)].data(), cache->capacity, cache->len};
    auto run = [&] {
      layer_forward(c, l, w_.layers[size_t(i)], sl.X[size_t(i)].data(), ctx, nc, training, a,
                    sl.X[size_t(i) + 1].data(), cache ? &kv : nullptr);
    };
    // As one CUDA Graph where the backend records them (Ops::graph): not with
    // TP (its sums run on the data plane's streams) nor in cached decoding
    // (the cache's length is a host value that changes every call).
    if (!tp_ && !cache) {
      LayerGraphKey k(this);
      k << kGraphForward << l << int64_t(training) << nc << m.B << n << sl.X[size_t(i)].data()
        << sl.X[size_t(i) + 1].data() << &a << a.xn1 << srpe << m.work.proj << w_.layers[size_t(i)].ln1_g
        << w_.layers[size_t(i)].wqkvg;
      for (int j = 0; j < nc; ++j) k << ctx[j];
      ops_.graph(k.key, run);
      a.atm_active = training && cfg_.atm_layer(l);  // as layer_forward sets it (a replay does not call it)
    } else {
      run();
    }
    // Keep this forward's decisions (a device-side copy; downloaded only
    // when asked for: dumps, statistics).
    atm_valid_[size_t(l)] = a.atm_active;
    if (a.atm_active) ops_.copy(atm_open_[size_t(l)].data(), a.open, size_t(N));
    if (l + 1 < m.l1) summarize(l + 1, sl.X[size_t(i) + 1].data());
  }
  if (!shard_.last_stage(cfg_)) return;

  // Final norm and tied head: logits[N, V_local] = xf E_local^T.
  ops_.rmsnorm_fwd(sl.X[size_t(m.nl)].data(), w_.norm_g, w_.norm_d, N, d, cfg_.eps, m.xf.data(), sl.rstd_f.data(),
                   nullptr);
  ops_.gemm(Trans::N, Trans::T, N, ld_.V, d, T(1), m.xf.data(), d, w_.embed, d, T(0), m.logits.data(), ld_.V);
}

// Vocab-parallel cross-entropy in three phases (max, sum-exp and target
// logit, loss) with TP reductions between them. grad: also the head's
// backward into sl.dx_top = dX(L) and the gradients of E and the final norm.
template <class T>
void Model<T>::head_loss(Slot& sl, const int32_t* targets_host, double loss_scale, bool grad) {
  Impl& m = *impl_;
  const int N = m.N, Vl = ld_.V, d = cfg_.d;
  const size_t nd = size_t(N) * d;
  ops_.upload(m.targets.data(), targets_host, size_t(N) * sizeof(int32_t));
  ops_.ce_row_max(m.logits.data(), N, Vl, m.row_max.data());
  tp_max(tp_, m.row_max.data(), size_t(N));
  ops_.ce_sumexp_target(m.logits.data(), m.targets.data(), N, Vl, ld_.v0, m.row_max.data(), m.sumexp.data(),
                        m.tgt.data());
  tp_sum(tp_, m.sumexp.data(), size_t(N));
  tp_sum(tp_, m.tgt.data(), size_t(N));
  if (!grad) {
    ops_.ce_loss(m.logits.data(), m.targets.data(), N, Vl, ld_.v0, m.row_max.data(), m.sumexp.data(), m.tgt.data(),
                 m.loss.data());
    ops_.sum(m.loss.data(), size_t(N), m.loss_sum.data());
    return;
  }
  // logits become loss_scale * dCE/dlogits (with z-loss: of CE + z lse^2)
  // in place.
  if (opt_.z_loss > 0) {
    ops_.ce_loss_grad_z(m.logits.data(), m.targets.data(), N, Vl, ld_.v0, m.row_max.data(), m.sumexp.data(),
                        m.tgt.data(), loss_scale, opt_.z_loss, m.loss.data(), m.zloss.data());
    ops_.sum(m.zloss.data(), size_t(N), m.zloss_sum.data());
  } else {
    ops_.ce_loss_grad(m.logits.data(), m.targets.data(), N, Vl, ld_.v0, m.row_max.data(), m.sumexp.data(), m.tgt.data(),
                      loss_scale, m.loss.data());
  }
  ops_.sum(m.loss.data(), size_t(N), m.loss_sum.data());
  // Head: dxf = dlogits E (TP-partial over vocab), dE += dlogits^T xf.
  ops_.gemm(Trans::N, Trans::N, N, d, Vl, T(1), m.logits.data(), Vl, w_.embed, d, T(0), m.dxf.data(), d);
  tp_sum(tp_, m.dxf.data(), nd);
  ops_.gemm(Trans::T, Trans::N, Vl, d, N, T(1), m.logits.data(), Vl, m.xf.data(), d, T(1), g_.embed, d);
  ops_.rmsnorm_bwd(sl.X[size_t(m.nl)].data(), w_.norm_g, w_.norm_d, sl.rstd_f.data(), m.dxf.data(), N, d, nullptr,
                   sl.dx_top.data(), g_.norm_g, g_.norm_d);
}

// ---- backward ----------------------------------------------------------------
// Last stage: starts from sl.dx_top. Other stages: bwd_in() was filled with
// dX(l1) and the gradients of the summaries the next stage read.
template <class T>
void Model<T>::backward(Slot& sl, std::vector<LayerWeightInputs<T>>* wk) {
  Impl& m = *impl_;
  const int B = m.B, d = cfg_.d, N = m.N;
  const size_t nd = size_t(N) * d;
  const int32_t* doc = opt_.documents_eos >= 0 ? sl.doc.data() : nullptr;
  const LayerCtx<T> c = m.ctx(ops_, cfg_, ld_, tp_, m.T_, m.srpe.data(), prec_, doc);
  const int lo = summary_lo();
  // Summary gradients not received from the next stage start at zero.
  const int recv_lo = shard_.last_stage(cfg_) ? m.l1 : send_lo();
  for (int s = lo; s < recv_lo; ++s) ops_.zero(m.dS[size_t(s - lo)].data().raw(), m.dS[size_t(s - lo)].bytes());
  if (shard_.last_stage(cfg_)) {
    ops_.copy(m.dcur.data().raw(), sl.dx_top.data().raw(), sl.dx_top.bytes());
    report_ready(norm_range_.first, norm_range_.second - norm_range_.first);
  }

  // A summary's gradient is complete once every layer reading it is done;
  // the context rows were TP-partial, so sum them before the prefix mean.
  auto summary_bwd = [&](int s, Ptr dx) {
    Ptr ds = m.dS[size_t(s - lo)].data();
    tp_sum(tp_, ds, nd);
    ops_.prefix_mean_bwd(ds, B, m.T_, d, doc, dx);
  };

  CPtr ctx[kMaxLambda];
  Ptr dctx[kMaxLambda];
  for (int l = m.l1 - 1; l >= m.l0; --l) {
    const int i = l - m.l0, nc = cfg_.n_ctx(l);
    if (l + 1 < m.l1) summary_bwd(l + 1, m.dcur.data());  // dX(l+1) complete
    context(sl, l, ctx, dctx);
    LayerActs<T>& a = opt_.recompute ? m.scratch : sl.acts[size_t(i)];
    // The recomputed forward and the backward each as one CUDA Graph where
    // the backend records them (Ops::graph; not with TP, as in forward()).
    auto graph_key = [&](LayerPass pass) {
      LayerGraphKey k(this);
      k << pass << l << (pass == kGraphBackward ? int64_t(a.atm_active) : 0) << nc << B << m.T_
        << sl.X[size_t(i)].data() << &a << a.xn1 << m.srpe.data() << m.work.proj << m.work.dxn << m.xtmp.data()
        << m.dcur.data() << m.dprev.data() << w_.layers[size_t(i)].ln1_g << w_.layers[size_t(i)].wqkvg
        << g_.layers[size_t(i)].ln1_g << g_.layers[size_t(i)].wqkvg;
      for (int j = 0; j < nc; ++j) k << ctx[j] << dctx[j];
      return k.key;
    };
    if (opt_.recompute) {
      auto run = [&] {
        layer_forward(c, l, w_.layers[size_t(i)], sl.X[size_t(i)].data(), ctx, nc, true, a, m.xtmp.data());
      };
      if (tp_) {
        run();
      } else {
        ops_.graph(graph_key(kGraphRecompute), run);
        a.atm_active = cfg_.atm_layer(l);  // as layer_forward sets it in training
      }
    }
    if (wk) {
      layer_backward_input(c, l, w_.layers[size_t(i)], g_.layers[size_t(i)], sl.X[size_t(i)].data(), ctx, nc, a, m.work,
                           m.dcur.data(), m.dprev.data(), dctx, (*wk)[size_t(i)]);
      std::swap(m.dcur, m.dprev);
      continue;  // the layer's gradients are final after its W
    }
    auto run = [&] {
      layer_backward(c, l, w_.layers[size_t(i)], g_.layers[size_t(i)], sl.X[size_t(i)].data(), ctx, nc, a, m.work,
                     m.dcur.data(), m.dprev.data(), dctx);
    };
    if (tp_) run();
    else ops_.graph(graph_key(kGraphBackward), run);
    std::swap(m.dcur, m.dprev);
    report_ready(layer_range_[size_t(i)].first, layer_range_[size_t(i)].second - layer_range_[size_t(i)].first);
  }
  summary_bwd(m.l0, m.dcur.data());
  if (shard_.first_stage()) ops_.embedding_bwd(sl.ids.data(), N, m.dcur.data(), ld_.v0, ld_.V, d, g_.embed);
}

template <class T>
void Model<T>::stage_forward(int i, const int32_t* tokens, double loss_scale, bool training) {
  Slot& sl = slot(i);
  const int B = impl_->B, T_ = cfg_.T;
  std::vector<int32_t> in, tg;
  const int32_t eos = opt_.documents_eos;
  if (shard_.first_stage() || shard_.last_stage(cfg_) || eos >= 0) {
    WIOLA_CHECK(tokens, "stage_forward: the first and last stage (with documents every stage) need the tokens");
    in.resize(size_t(B) * T_);
    tg.resize(size_t(B) * T_);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T_; ++t) {
        in[size_t(b) * T_ + t] = tokens[size_t(b) * (T_ + 1) + t];
        tg[size_t(b) * T_ + t] = tokens[size_t(b) * (T_ + 1) + t + 1];
      }
  }
  forward(sl, in.data(), T_, training, nullptr);
  if (!shard_.last_stage(cfg_)) return;
  check_ids(tg.data(), B * T_, cfg_.V, "target");
  if (eos >= 0)  // an EOS's target (the next document's first token) is masked
    for (size_t j = 0; j < tg.size(); ++j)
      if (in[j] == eos) tg[j] = -1;
  if (opt_.keep_logits) logits_host_ = download_logits(impl_->logits.size());
  head_loss(sl, tg.data(), loss_scale, training);
}

// W of a split backward: the layers' weight-gradient GEMMs, in the
// backward's layer order, on what B left in the slot.
template <class T>
void Model<T>::backward_weight(Slot& sl, const std::vector<LayerWeightInputs<T>>& wk) {
  Impl& m = *impl_;
  const LayerCtx<T> c = m.ctx(ops_, cfg_, ld_, tp_, m.T_, m.srpe.data(), prec_);
  CPtr ctx[kMaxLambda];
  Ptr dctx[kMaxLambda];
  for (int l = m.l1 - 1; l >= m.l0; --l) {
    const int i = l - m.l0;
    context(sl, l, ctx, dctx);
    // With recompute W reads the activation copies in wk, not the scratch.
    const LayerActs<T>& a = opt_.recompute ? m.scratch : sl.acts[size_t(i)];
    layer_backward_weight(c, g_.layers[size_t(i)], ctx, cfg_.n_ctx(l), a, wk[size_t(i)]);
    report_ready(layer_range_[size_t(i)].first, layer_range_[size_t(i)].second - layer_range_[size_t(i)].first);
  }
}

template <class T>
std::vector<LayerWeightInputs<T>>& Model<T>::weight_inputs(int w) {
  WIOLA_CHECK(opt_.split_backward, "a split backward needs ModelOptions::split_backward");
  WIOLA_CHECK(w >= 0 && w < int(impl_->wk.size()), "weight slot ", w, " outside 0..", impl_->wk.size() - 1);
  return impl_->wk[size_t(w)];
}

template <class T>
void Model<T>::stage_backward(int i) {
  backward(slot(i), nullptr);
}

template <class T>
void Model<T>::stage_backward_input(int i, int w) {
  backward(slot(i), &weight_inputs(w));
}

template <class T>
void Model<T>::stage_backward_weight(int i, int w) {
  backward_weight(slot(i), weight_inputs(w));
}

template <class T>
double Model<T>::train_micro_step(const int32_t* tokens, double loss_scale) {
  WIOLA_CHECK(shard_.first_stage() && shard_.last_stage(cfg_),
              "train_micro_step needs the whole layer range (use stage_forward/stage_backward)");
  stage_forward(0, tokens, loss_scale, true);
  stage_backward(0);
  return take_loss_sum();
}

template <class T>
double Model<T>::eval_loss(const int32_t* tokens) {
  WIOLA_CHECK(shard_.first_stage() && shard_.last_stage(cfg_),
              "eval_loss needs the whole layer range (use stage_forward)");
  stage_forward(0, tokens, 0.0, false);
  return take_loss_sum();
}

template <class T>
std::vector<T> Model<T>::forward_logits(const int32_t* inputs, bool training) {
  WIOLA_CHECK(shard_.first_stage() && shard_.last_stage(cfg_), "forward_logits needs the whole layer range");
  forward(slot(0), inputs, cfg_.T, training, nullptr);
  return download_logits(impl_->logits.size());
}

template <class T>
std::vector<uint8_t> Model<T>::atm_open(int l) const {
  WIOLA_CHECK(l >= 0 && l < cfg_.L, "layer ", l, " out of range");
  if (!atm_valid_[size_t(l)]) return {};
  std::vector<uint8_t> out(atm_open_[size_t(l)].size());
  ops_.download(out.data(), atm_open_[size_t(l)].data(), out.size());
  return out;
}

template <class T>
std::vector<typename Model<T>::AtmStats> Model<T>::atm_stats() const {
  std::vector<AtmStats> out;
  const int B = impl_->B, Tn = cfg_.T;
  for (int l = 0; l < cfg_.L; ++l) {
    std::vector<uint8_t> open = atm_open(l);
    if (open.empty()) continue;
    if (doc_starts_.size() == open.size()) {  // documents: each one's pairs (no group crosses a start)
      const auto [groups, visible, causal] = documents_atm_pairs(open, doc_starts_, B, Tn);
      out.push_back({l, 1.0 - double(groups) / (double(B) * Tn), double(visible) / causal});
      continue;
    }
    const AtmLayout lay = atm_layout(open, B, Tn);
    const double causal = double(B) * Tn * (Tn + 1) / 2.0;
    out.push_back({l, 1.0 - double(lay.total_groups()) / (double(B) * Tn), double(lay.visible_pairs()) / causal});
  }
  return out;
}

// ---- incremental decoding ---------------------------------------------------------
template <class T>
KvCache<T> Model<T>::make_cache(int capacity) const {
  WIOLA_CHECK(capacity >= 1, "KV cache capacity must be positive");
  KvCache<T> kc;
  kc.B = impl_->B;
  kc.capacity = capacity;
  const size_t kvd = size_t(ld_.Hkv) * ld_.dh;
  for (int i = 0; i < impl_->nl; ++i) {
    kc.k.emplace_back(ops_, prec_.act, size_t(kc.B) * capacity * kvd);
    kc.v.emplace_back(ops_, prec_.act, size_t(kc.B) * capacity * kvd);
  }
  for (int s = 0; s < n_summaries(); ++s) kc.carry.emplace_back(ops_, prec_.residual, size_t(kc.B) * cfg_.d);
  // An empty cache: zero sums, and no stale rows behind the causal mask.
  for (auto* v : {&kc.k, &kc.v, &kc.carry})
    for (DynBuffer<T>& b : *v) ops_.zero(b.data().raw(), b.bytes());
  return kc;
}

template <class T>
std::vector<T> Model<T>::forward_cached(const int32_t* ids, int n, KvCache<T>& cache) {
  WIOLA_CHECK(n >= 1 && n <= cfg_.T, "decoding chunk of ", n, " tokens: must be 1..", cfg_.T);
  WIOLA_CHECK(cache.len + n <= cache.capacity, "KV cache full: ", cache.len, " + ", n, " > capacity ", cache.capacity);
  WIOLA_CHECK(cache.B == impl_->B, "KV cache is for ", cache.B, " sequences, model for ", impl_->B);
  forward(slot(0), ids, n, false, &cache);
  cache.len += n;
  return download_logits(size_t(impl_->B) * n * size_t(ld_.V));
}

void document_starts(const int32_t* inputs, int B, int T, int32_t eos, int32_t* out) {
  for (int b = 0; b < B; ++b) {
    const int32_t* in = inputs + size_t(b) * T;
    int32_t start = 0;
    for (int t = 0; t < T; ++t) {
      if (t > 0 && in[t - 1] == eos) start = t;
      out[size_t(b) * T + t] = start;
    }
  }
}

int64_t counted_targets(const int32_t* tokens, int B, int T, int32_t eos) {
  int64_t n = int64_t(B) * T;
  if (eos >= 0)
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) n -= tokens[size_t(b) * (T + 1) + t] == eos;
  return n;
}

template class Model<float>;
template class Model<double>;

}  // namespace wiola
