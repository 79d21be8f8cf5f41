// The Wiola model driver (docs/model.md §2): embedding -> layers (with prefix-mean
// summaries of the residual stream as GCLA context) -> final norm -> tied
// head -> cross-entropy, and the backward pass in reverse. One process holds
// a ModelShard: its TP slice of every tensor and a contiguous layer range
// (pipeline stage). The single-process entry points (train_micro_step,
// eval_loss, forward_cached) need the whole layer range; the stage pieces
// below them are what a pipeline schedule calls. Every tensor lives in backend
// memory; the host sees values only through explicit downloads (the loss sum
// once per step, logits and ATM decisions when asked for).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "model/collectives.h"
#include "model/config.h"
#include "model/layer.h"
#include "model/params.h"

namespace wiola {

// Options fixed for the lifetime of a Model.
struct ModelOptions {
  int micro_batch = 1;               // B: sequences per micro-step
  bool recompute = false;            // keep only layer inputs; rerun each layer in backward
  bool keep_logits = false;          // copy logits to the host in train_micro_step (dump)
  int slots = 1;                     // micro-batches whose activations a stage keeps at once
                                     // (pipeline schedules: 1F1B needs pp - stage)
  size_t param_align = kParamAlign;  // ParamLayout alignment (1: packed, for tests)
  // Split backward (stage_backward_input / stage_backward_weight): each of
  // weight_slots sets (0: one per slot) keeps one micro-batch's layers'
  // weight-gradient operands from its B to its W (LayerWeightInputs; with
  // recompute, copies of the activations too). A schedule needs as many as
  // micro-batches wait between B and W at once (dist::max_pending_weight).
  bool split_backward = false;
  int weight_slots = 0;
  // Documents (data.documents, docs/model.md §2 "Documents"): with an EOS id
  // >= 0 every document of a window (it ends with its EOS) is computed as if
  // alone, and the targets of EOS positions are masked (no loss, no
  // gradient); -1: each window is one document, every target counts.
  int documents_eos = -1;
  // z-loss (train.z_loss, docs/model.md §4): training adds z * lse^2 of
  // every counted target to the loss it differentiates (scaled like the
  // CE); 0: off, the cross-entropy alone (take_z_loss_sum gives 0).
  double z_loss = 0;
};

// Documents: the first position of each position's document in windows of
// T inputs, out[b T + t] (a document starts at 0 and after each input that
// is the EOS id).
void document_starts(const int32_t* inputs, int B, int T, int32_t eos, int32_t* out);
// The targets that count with documents: those of windows [B, T+1] (tokens
// as the model takes them) whose input is not the EOS id; B*T without
// documents (eos < 0).
int64_t counted_targets(const int32_t* tokens, int B, int T, int32_t eos);

// The parameters of a rank that holds several pipeline chunks (interleaved
// and V schedules, train/rank_model.h): one flat layout of every chunk's
// tensors (ParamLayout's layer-range constructor) and its buffers, which
// each chunk's Model binds its tensors in and does not own. The optimizer,
// checkpoints and gathers then see one buffer, as with one chunk; the tied
// embedding is one tensor there when the rank holds both its ends (the V
// schedule's rank 0), so its two gradients add in place as on one process.
template <class T>
struct ParamStore {
  ParamLayout layout;
  T* params = nullptr;  // [layout.total()] master parameters
  T* grads = nullptr;   // [layout.total()] gradients
  Ptr weights;          // the weight copy GEMMs read, [layout.total()]; null: they read params
};

// KV cache for incremental decoding: per layer SRPE'd keys and values of
// every earlier position, plus the running sums that give the prefix-mean
// summaries (docs/model.md §2, Inference). ATM is off. Starts zeroed.
template <class T>
struct KvCache {
  int B = 0, capacity = 0, len = 0;
  std::vector<DynBuffer<T>> k, v;   // per local layer [B, capacity, Hkv dh]
  std::vector<DynBuffer<T>> carry;  // per summary index [B, d]
};

template <class T>
class Model {
 public:
  // store: where the parameters live when the rank holds several chunks
  // (ParamStore; it must outlive the model); null: buffers of its own.
  Model(Ops<T>& ops, const ModelConfig& cfg, const ModelShard& shard, TpCollectives* tp, const ModelOptions& opt,
        const ParamStore<T>* store = nullptr);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ModelShard& shard() const { return shard_; }
  // The flat layout this model's tensors live in: its own, or the whole
  // store's (every chunk of the rank) when it binds in a ParamStore.
  const ParamLayout& layout() const { return layout_; }
  const ModelOptions& options() const { return opt_; }
  void set_keep_logits(bool on) { opt_.keep_logits = on; }
  // Length of the flat buffers: the parameters plus the layout's padding
  // (layout().n_elements() counts the parameters alone).
  size_t n_params() const { return layout_.total(); }
  // Flat master parameters and gradients [n_params] in backend memory, in
  // the compute type T (what the optimizer updates and reduces). Padding is
  // zero in both and stays zero: nothing computes or updates it.
  T* params() { return pbase_; }
  T* grads() { return gbase_; }
  // What the forward reads: matrices from the weight copy, γ/δ/φ from the
  // master (ModelParams::bind_forward).
  const ModelParams& p() const { return w_; }
  // The separate weight copy GEMMs read, [n_params] in the precision's
  // weight type (null when they read params()).
  CPtr weight_copy() const { return wbase_; }
  // The same, to write: an optimizer that keeps it up to date itself
  // (dist::DistAdamW::set_weight_copy) makes refresh_weights unnecessary.
  Ptr weight_copy() { return wbase_; }

  // Counter-based initial values (docs/model.md §3): independent of the layout.
  // With a store: every tensor of the store (one chunk's call does all).
  void init(uint64_t seed);
  // Master parameters were changed (optimizer step, init, a load): bring the
  // weight copy GEMMs read up to date. A no-op when there is no copy.
  void refresh_weights();
  void zero_grads();

  // ---- single process (whole layer range) ---------------------------------
  // tokens: host [B, T+1] (inputs are the first T, targets the last T).
  // Forward and backward of one micro-batch in training mode (ATM active);
  // gradients of loss_scale * sum(CE) accumulate into grads(). Returns the
  // sum of the B*T cross-entropies (with documents those of the targets that
  // count, counted_targets) (downloaded: a convenience for tests and
  // tools; the trainer reads take_loss_sum() once per step instead).
  double train_micro_step(const int32_t* tokens, double loss_scale);
  // Sum of the B*T cross-entropies, evaluation mode (ATM off), no gradients.
  double eval_loss(const int32_t* tokens);
  // The cross-entropy sum of every forward on the last stage since the last
  // call (accumulated in double on the backend), downloaded, and reset.
  // 0 on other stages.
  double take_loss_sum();
  // The same for the z-loss terms z * lse^2 of the training forwards (0
  // without z-loss).
  double take_z_loss_sum();
  // The B*T cross-entropies of the last forward on the last stage (host
  // copy, [B, T]; a masked target's is 0): per-token log-likelihoods for
  // task scoring (data/tasks.h).
  std::vector<T> token_losses() const;
  // Logits [B, T, V_local] of the last forward (host copy), when
  // keep_logits is set or after eval_logits.
  const std::vector<T>& last_logits() const { return logits_host_; }
  // Forward in evaluation or training mode; returns logits [B, T, V_local].
  std::vector<T> forward_logits(const int32_t* inputs /*[B,T]*/, bool training);

  // ATM merge decisions of the last training forward: open[B, T] per ATM
  // layer (global index l; downloaded), empty for other layers.
  std::vector<uint8_t> atm_open(int l) const;
  // Statistics of the last training forward, per ATM layer: mu = 1 - T'/T and
  // the fraction of causal (query, key) pairs still visible (with documents:
  // of the pairs inside each document, what ATM alone saves).
  struct AtmStats {
    int layer;
    double mu, visible_fraction;
  };
  std::vector<AtmStats> atm_stats() const;

  // ---- pipeline stage (any layer range) -------------------------------------
  // A micro-batch's activations live in a slot (0..slots-1) from its forward
  // to its backward. Boundary tensors are [B, T, d] each. The forward message
  // into a stage [l0, l1) is X(l0) followed by the summaries s in
  // [max(0, l0+1-Λ), l0-1] (S(s-1) in docs/model.md numbering) its layers read but
  // cannot compute; P(X(l0)) itself is recomputed here. The backward message
  // out of it carries their gradients (summary gradients TP-partial).
  int boundary_in() const;   // tensors in the forward message into this stage (0: first)
  int boundary_out() const;  // tensors in the forward message it sends (0: last)
  // Where the received forward message goes / what to send forward.
  std::vector<Ptr> fwd_in(int slot);
  std::vector<CPtr> fwd_out(int slot) const;
  // Where the received backward message goes (before stage_backward) / what
  // to send backward (after it, until the next stage_backward).
  std::vector<Ptr> bwd_in();
  std::vector<CPtr> bwd_out() const;
  // Storage type of the boundary tensors (all [B, T, d]).
  DType boundary_dtype() const { return prec_.residual; }
  // Forward of one micro-batch. tokens: host [B, T+1] on the first stage
  // (inputs) and the last (targets), and with documents on every stage (the
  // document starts); ignored elsewhere. On the last stage in
  // training it also runs the head's backward (gradients of loss_scale *
  // sum(CE)), so only [B,T,d] waits for stage_backward, never the logits.
  // The B*T cross-entropies add to the backend loss sum (take_loss_sum).
  void stage_forward(int slot, const int32_t* tokens, double loss_scale, bool training);
  // Backward of the micro-batch in `slot` (after its training forward).
  void stage_backward(int slot);
  // The same in two parts (split_backward; issue 37, dist/schedule.h's B and
  // W). stage_backward_input: everything the previous stage waits for (bwd_out,
  // the summaries' gradients) and the gradients of the norms, φ and the
  // embedding lookup; the layers' weight-gradient GEMMs wait in `wslot`.
  // stage_backward_weight: those GEMMs (the tied head's weight gradient runs
  // in the forward, as always). Grad-ready reports of layers come from W.
  // B then W of a slot, in order, gives stage_backward's bits; the slot is
  // busy until its W, and so is `wslot` (0..weight_slots-1), the operand set
  // B fills and W reads.
  void stage_backward_input(int slot, int wslot);
  void stage_backward_weight(int slot, int wslot);
  // Called with flat [offset, offset+size) ranges of grads() as they become
  // final during the backward passes while armed (the trainer arms it for the
  // last micro-batch of a step, to start gradient reduction early). Ranges
  // include the padding after each tensor (entry spans), so the reports and
  // the embedding's span tile the buffer. The embedding is never reported
  // (the trainer sums it between stages first).
  using GradReadyFn = std::function<void(size_t offset, size_t size)>;
  void set_grad_ready(GradReadyFn fn) { grad_ready_ = std::move(fn); }
  void arm_grad_ready(bool on) { grad_ready_armed_ = on; }

  // ---- incremental decoding (ATM off) -------------------------------------
  KvCache<T> make_cache(int capacity) const;
  // Feed n new tokens per sequence (ids host [B, n], n <= T, len+n <=
  // capacity); returns their logits [B, n, V_local] on the host.
  std::vector<T> forward_cached(const int32_t* ids, int n, KvCache<T>& cache);

  // Bytes of saved activations for one micro-batch (reports what recompute
  // saves) and of parameter + gradient buffers (0 with a store: it owns none).
  size_t activation_bytes() const;
  size_t param_bytes() const { return params_.bytes() + grads_.bytes() + weights_.bytes(); }
  // This rank's model memory by class (reports): master parameters,
  // gradients, the weight copy GEMMs read, saved activations of every slot
  // (activation_bytes()), and the backward's scratch (gradient arena,
  // residual and summary gradients, head statistics).
  struct Memory {
    size_t master = 0, grads = 0, weights = 0, activations = 0, workspace = 0;
  };
  Memory memory() const;
  // The same figures for a model that is never built (the planner, perf/):
  // sizes only, nothing allocated; `ops` only serves the layer contexts.
  static Memory plan_memory(Ops<T>& ops, const ModelConfig& cfg, const ModelShard& shard, const ModelOptions& opt,
                            const Precision& prec);

 private:
  struct Impl;
  struct Slot;
  void forward(Slot& sl, const int32_t* inputs_host, int n, bool training, KvCache<T>* cache);
  void head_loss(Slot& sl, const int32_t* targets_host, double loss_scale, bool grad);
  std::vector<T> download_logits(size_t count) const;
  void backward(Slot& sl, std::vector<LayerWeightInputs<T>>* wk);
  void backward_weight(Slot& sl, const std::vector<LayerWeightInputs<T>>& wk);
  std::vector<LayerWeightInputs<T>>& weight_inputs(int wslot);
  Slot& slot(int i);
  int n_summaries() const;  // summary slots held by this stage
  int summary_lo() const;   // lowest summary index s held
  int send_lo() const;      // lowest summary index sent to the next stage
  void context(const Slot& sl, int l, CPtr* ctx, Ptr* dctx);
  void report_ready(size_t offset, size_t size);

  Ops<T>& ops_;
  ModelConfig cfg_;
  ModelShard shard_;
  TpCollectives* tp_;
  ModelOptions opt_;
  Precision prec_;
  ParamLayout layout_;
  LocalDims ld_;
  Buffer<T> params_, grads_;  // master parameters, gradients (empty with a store)
  DynBuffer<T> weights_;      // the weight copy (empty: GEMMs read params_, or a store)
  T* pbase_ = nullptr;        // what the model binds in: its own buffers or the store's
  T* gbase_ = nullptr;
  Ptr wbase_;          // the weight copy (null: none)
  ModelParams w_, g_;  // forward view, gradients
  std::unique_ptr<Impl> impl_;
  std::vector<T> logits_host_;
  std::vector<Buffer<T, uint8_t>> atm_open_;            // per layer: decisions of the last training forward
  std::vector<bool> atm_valid_;                         // per layer: ATM acted in the last forward
  std::vector<int32_t> doc_starts_;                     // documents: the last training forward's starts [B, T]
  std::vector<std::pair<size_t, size_t>> layer_range_;  // flat [begin, end) per local layer
  std::pair<size_t, size_t> norm_range_{0, 0};
  GradReadyFn grad_ready_;
  bool grad_ready_armed_ = false;
};

}  // namespace wiola
