// Distributed AdamW (docs/model.md §4, §5) with optional ZeRO sharding of the fp32
// master weights and moments over the data-parallel group. Works on one flat
// parameter buffer and its gradient buffer; knows nothing about the model
// beyond the segment table (decay on/off, counted in the norm or not).
//
// Layout. The flat buffer [0, n) is cut into buckets of B elements (B a
// multiple of DP, from AdamWConfig::bucket_bytes; the last bucket may be
// shorter). With ZeRO, each bucket is padded to a multiple of DP and split
// into DP equal chunks; DP rank r owns chunk r of every bucket. Its shard is
// the concatenation of those chunks: ceil(n/DP) elements of master weights,
// m and v. Gradients are reduce-scattered and parameters all-gathered bucket
// by bucket (the reduction partition is the same whether or not the trainer
// overlaps them with backward, so both give bit-identical results).
//
// Precision: master weights, gradients and moments are fp32 (Ops<float>) in
// every mode; a lower-precision weight copy for GEMMs belongs to the model
// (Model::refresh_weights after each step, or set_weight_copy: the step
// keeps it up to date itself). Buffers are backend memory: the
// host sees one double per step (the squared gradient norm, for clipping
// and the non-finite check).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dist/comm.h"
#include "kernels/ops.h"

namespace wiola::dist {

// A contiguous run of parameters with one optimizer treatment. in_norm=false:
// a replica counted by another rank (e.g. TP-replicated γ/δ on tp rank ≠ 0,
// the tied-embedding copy on the last stage). padding: the zeros between
// tensors (model/params.h), reduced with their bucket but never scaled,
// counted in the norm or updated, so they stay zero.
struct ParamSegment {
  size_t offset = 0, size = 0;
  bool decay = true;
  bool in_norm = true;
  bool padding = false;
};

// AdamW segments of a flat parameter layout: decay per docs/model.md §4. A
// tensor counts in the gradient norm on exactly one rank: TP-replicated
// tensors only on tp rank 0, and the tied embedding only where embed_in_norm
// (the first stage; the last stage holds a copy when pp > 1). The padding
// after a tensor is a padding segment (never updated). `entries`: the
// model's layout entries (model/params.h ParamEntry: name, offset, size(),
// span, decay, tp_replicated), taken by shape so that dist/ needs no model/.
template <class Entries>
std::vector<ParamSegment> optimizer_segments(const Entries& entries, int tp_rank = 0, bool embed_in_norm = true) {
  std::vector<ParamSegment> segs;
  for (const auto& e : entries) {
    bool in_norm = !(e.tp_replicated && tp_rank != 0);
    if (e.name == "model.embed_tokens.weight") in_norm = embed_in_norm;
    segs.push_back({e.offset, e.size(), e.decay, in_norm});
    if (e.span > e.size()) segs.push_back({e.offset + e.size(), e.span - e.size(), false, false, true});
  }
  return segs;
}

// The default gradient bucket (fp32 bytes); the cost model (perf/) sizes
// DP traffic and ZeRO padding with the same figure.
inline constexpr size_t kDefaultBucketBytes = size_t(25) << 20;

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, clip = 1.0;
  bool zero = true;             // shard master weights + moments over DP
  bool nonfinite_fatal = false; // throw instead of skipping the step
  // step() leaves the gradients zero for the next step's accumulation (in
  // AdamW's own pass where this rank updates every element), so the caller
  // need not zero them (Model::zero_grads) before the next step.
  bool zero_grads = false;
  size_t bucket_bytes = kDefaultBucketBytes;  // gradient bucket (fp32 bytes)
};

struct StepResult {
  double grad_norm = 0;  // global L2 norm of the DP-mean gradient, before clipping
  bool skipped = false;  // norm not finite: nothing changed
};

// The gradient buckets of a flat buffer of n elements: bucket_bytes of fp32
// rounded down to a multiple of dp, the last one shorter; each reduces as dp
// chunks of `chunk` elements (the last chunk zero-padded). The optimizer and
// the cost model (perf/) share this plan, so predicted DP traffic is exact.
struct BucketSpan {
  size_t start = 0, len = 0, chunk = 0;
};
size_t bucket_elems(size_t bucket_bytes, int dp);
std::vector<BucketSpan> bucket_spans(size_t n, int dp, size_t bucket_bytes);
// Elements DP reduces per step: the sum over buckets of dp * chunk.
size_t zero_padded_elems(size_t n, int dp, size_t bucket_bytes);

class DistAdamW {
 public:
  // params, grads: flat fp32 buffers of n elements in backend memory; every
  // DP rank holds the full replica. segments cover [0, n) in order (the
  // layout's padding too, as padding segments).
  // dp: data-parallel group, data plane (gradient buckets, parameter shards;
  // nullptr or size 1: no DP). norm_group: control-plane group over which
  // distinct parameters' squared norms are summed (the tp×pp ranks of one dp
  // index, Grid::mp(); nullptr: none). dp_ctrl: the DP group's control plane
  // (host scalars); nullptr: dp itself (a host-memory data plane). All must
  // outlive this.
  DistAdamW(Ops<float>& ops, float* params, float* grads, size_t n,
            std::vector<ParamSegment> segments, AdamWConfig cfg, Comm* dp,
            Comm* norm_group, Comm* dp_ctrl = nullptr);
  ~DistAdamW();
  DistAdamW(const DistAdamW&) = delete;
  DistAdamW& operator=(const DistAdamW&) = delete;

  // Overlap: during backward, declare grads[offset, offset+size) final (each
  // element at most once per step). Complete buckets start their non-blocking
  // reduction, always in descending bucket order (the order backward
  // produces them), so every DP rank issues the same sequence.
  void grad_ready(size_t offset, size_t size);
  // Drive pending reductions (MPI progresses only inside MPI calls); cheap,
  // call between layers.
  void progress();

  // One step at bias-correction step t (1-based) with learning rate lr:
  // DP mean of the gradients, global norm, clip, AdamW, parameter all-gather.
  // Not finite norm: skipped (params, m, v unchanged) or wiola::Error if
  // nonfinite_fatal. Gradient contents afterwards are unspecified, or zero
  // with AdamWConfig::zero_grads (after a skipped step too).
  StepResult step(double lr, long t);

  // The model's weight copy (Model::weight_copy: n elements in its own
  // storage type; null: none). Each applied step then leaves it holding the
  // updated parameters, as Model::refresh_weights would: written by AdamW's
  // own pass where this rank updates every element (no ZeRO sharding over
  // several ranks), else converted from the parameters once gathered.
  void set_weight_copy(Ptr w) { weights_ = w; }

  // Steps actually applied (not skipped). PyTorch's bias-correction step after
  // a skip is applied_steps() + 1, which the trainer passes as t.
  long applied_steps() const { return applied_; }

  // fp32 master weights + m + v held by this rank: ZeRO 3·4·ceil(n/DP);
  // without ZeRO 3·4·n (the params buffer itself is the master copy).
  size_t state_bytes_this_rank() const;
  // Temporary buffer for the padded last bucket (ZeRO only).
  size_t workspace_bytes() const;
  size_t shard_elems() const { return shard_elems_; }
  size_t bucket_elems() const { return bucket_; }

  struct Range {
    size_t offset = 0, size = 0;
  };
  // Flat ranges whose optimizer state this rank holds (all of [0,n) without ZeRO).
  std::vector<Range> owned_ranges() const;

  // Full (unsharded) moments, length n on the host. Collective over dp.
  void gather_moments(std::vector<float>& m_full, std::vector<float>& v_full);
  // Restore from full moments (any former layout); re-reads master from params.
  void set_moments(const std::vector<float>& m_full,
                   const std::vector<float>& v_full, long applied_steps);

  // The moments of owned_ranges(), concatenated in range order, to and from
  // host memory (checkpoints write and read them in global coordinates).
  // upload_owned also sets the applied-step count and re-reads master from
  // params.
  void download_owned(std::vector<float>& m, std::vector<float>& v) const;
  void upload_owned(const std::vector<float>& m, const std::vector<float>& v, long applied_steps);

  // Sharded checkpoint of this rank's (m, v, applied steps): a header
  // (n, DP size and rank, ZeRO flag, bucket size) and the shard. load_shard
  // checks the header matches this layout and re-reads master from params.
  std::vector<uint8_t> save_shard() const;
  void load_shard(const std::vector<uint8_t>& blob);

  // Copy the current params into the master shard (after params were loaded
  // or changed outside the optimizer). Called by the constructor.
  void reload_master();

 private:
  struct Bucket {
    size_t start = 0, len = 0;  // flat range
    size_t chunk = 0;           // ZeRO chunk per rank (padded len / DP)
    size_t local = 0;           // offset of this rank's chunk in the shard
    bool padded = false;        // goes through tmp_ (len % DP != 0)
    size_t ready = 0;
    Request req;
  };
  struct Piece {                // segment ∩ owned chunk
    size_t global = 0, size = 0, local = 0;
    int bucket = 0;
    bool decay = true, in_norm = true;
  };

  bool zero_active() const { return cfg_.zero; }
  float* grad_at(const Piece& p);
  size_t chunk_real(const Bucket& b) const;  // real elements of this rank's chunk
  void launch(int k);
  void launch_ready();
  double sum_over(Comm* c, double x);

  Ops<float>& ops_;
  float* params_;
  float* grads_;
  size_t n_;
  std::vector<ParamSegment> segs_;
  AdamWConfig cfg_;
  Comm* dp_;
  Comm* norm_;
  Comm* dp_ctrl_;
  int dp_size_ = 1, dp_rank_ = 0;
  size_t bucket_ = 0, shard_elems_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<Piece> pieces_;
  int next_launch_ = -1;  // next bucket to launch (descending), -1: all launched
  Buffer<float> master_, m_, v_, tmp_;
  Buffer<float, double> sq_;  // [1] squared gradient norm of this rank's pieces
  Ptr weights_;               // the weight copy kept up to date (null: none)
  long applied_ = 0;
};

}  // namespace wiola::dist
