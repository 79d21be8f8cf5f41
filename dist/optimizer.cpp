#include "dist/optimizer.h"
// (docs/model.md §4: AdamW, clipping, the non-finite skip.)

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"
#include "util/trace.h"

namespace wiola::dist {

size_t bucket_elems(size_t bucket_bytes, int dp) {
  const size_t D = size_t(dp);
  return std::max<size_t>(1, bucket_bytes / sizeof(float) / D) * D;
}

std::vector<BucketSpan> bucket_spans(size_t n, int dp, size_t bucket_bytes) {
  const size_t D = size_t(dp), bucket = bucket_elems(bucket_bytes, dp);
  std::vector<BucketSpan> out;
  for (size_t s = 0; s < n; s += bucket) {
    const size_t len = std::min(bucket, n - s);
    out.push_back({s, len, (len + D - 1) / D});
  }
  return out;
}

size_t zero_padded_elems(size_t n, int dp, size_t bucket_bytes) {
  size_t total = 0;
  for (const BucketSpan& b : bucket_spans(n, dp, bucket_bytes)) total += b.chunk * size_t(dp);
  return total;
}

DistAdamW::DistAdamW(Ops<float>& ops, float* params, float* grads, size_t n, std::vector<ParamSegment> segments,
                     AdamWConfig cfg, Comm* dp, Comm* norm_group, Comm* dp_ctrl)
    : ops_(ops),
      params_(params),
      grads_(grads),
      n_(n),
      segs_(std::move(segments)),
      cfg_(cfg),
      dp_(dp),
      norm_(norm_group),
      dp_ctrl_(dp_ctrl ? dp_ctrl : dp) {
  WIOLA_CHECK(n_ > 0, "DistAdamW: empty parameter buffer");
  size_t at = 0;
  for (const ParamSegment& s : segs_) {
    WIOLA_CHECK(s.offset == at && s.size > 0,
                "DistAdamW: segments must cover [0, n) in order without gaps; "
                "segment at ",
                s.offset, " (size ", s.size, ") after ", at);
    at += s.size;
  }
  WIOLA_CHECK(at == n_, "DistAdamW: segments cover ", at, " of ", n_, " elements");
  if (dp_) {
    dp_size_ = dp_->size();
    dp_rank_ = dp_->rank();
  }
  const size_t D = size_t(dp_size_);
  bucket_ = dist::bucket_elems(cfg_.bucket_bytes, dp_size_);
  for (const BucketSpan& sp : bucket_spans(n_, dp_size_, cfg_.bucket_bytes)) {
    Bucket b;
    b.start = sp.start;
    b.len = sp.len;
    b.chunk = sp.chunk;
    b.padded = b.chunk * D != b.len;
    b.local = shard_elems_;
    shard_elems_ += zero_active() ? b.chunk : b.len;
    buckets_.push_back(std::move(b));
  }

  // Pieces: the segments intersected with what this rank updates.
  for (int k = 0; k < int(buckets_.size()); ++k) {
    const Bucket& b = buckets_[k];
    const size_t g0 = zero_active() ? b.start + size_t(dp_rank_) * b.chunk : b.start;
    const size_t g1 = zero_active() ? g0 + chunk_real(b) : b.start + b.len;
    const size_t l0 = zero_active() ? b.local : b.start;
    for (const ParamSegment& s : segs_) {
      const size_t lo = std::max(g0, s.offset), hi = std::min(g1, s.offset + s.size);
      if (lo >= hi || s.padding) continue;  // padding: no piece, never touched
      pieces_.push_back({lo, hi - lo, l0 + (lo - g0), k, s.decay, s.in_norm});
    }
  }

  if (zero_active()) {
    master_ = Buffer<float>(ops_, shard_elems_);
    const Bucket& last = buckets_.back();
    if (last.padded) tmp_ = Buffer<float>(ops_, last.chunk * D);
  }
  m_ = Buffer<float>(ops_, shard_elems_);
  v_ = Buffer<float>(ops_, shard_elems_);
  ops_.zero(m_.data(), m_.bytes());
  ops_.zero(v_.data(), v_.bytes());
  sq_ = Buffer<float, double>(ops_, 1);
  reload_master();
  next_launch_ = int(buckets_.size()) - 1;
}

DistAdamW::~DistAdamW() {
  for (Bucket& b : buckets_) b.req.wait();
}

size_t DistAdamW::chunk_real(const Bucket& b) const {
  const size_t c0 = size_t(dp_rank_) * b.chunk;
  return c0 >= b.len ? 0 : std::min(b.chunk, b.len - c0);
}

float* DistAdamW::grad_at(const Piece& p) {
  const Bucket& b = buckets_[p.bucket];
  if (zero_active() && b.padded) return tmp_.data() + (p.global - b.start);
  return grads_ + p.global;
}

void DistAdamW::launch(int k) {
  Bucket& b = buckets_[k];
  if (dp_size_ == 1) return;
  const trace::Span span("reduce", trace::wanted() ? "DP reduction start, bucket " + std::to_string(k) : "");
  float* g = grads_ + b.start;
  if (!zero_active()) {
    b.req = dp_->iall_reduce(g, g, b.len, DType::F32, ReduceOp::Sum);
    return;
  }
  if (b.padded) {  // copy into the zero-padded workspace first
    ops_.zero(tmp_.data(), tmp_.bytes());
    ops_.copy(tmp_.data(), g, b.len * sizeof(float));
    g = tmp_.data();
  }
  b.req = dp_->ireduce_scatter_sum(g, g + size_t(dp_rank_) * b.chunk, b.chunk, DType::F32);
}

void DistAdamW::launch_ready() {
  while (next_launch_ >= 0 && buckets_[next_launch_].ready == buckets_[next_launch_].len) launch(next_launch_--);
}

void DistAdamW::grad_ready(size_t offset, size_t size) {
  WIOLA_CHECK(offset + size <= n_, "DistAdamW::grad_ready: range [", offset, ", ", offset + size, ") outside [0, ", n_,
              ")");
  for (Bucket& b : buckets_) {
    const size_t lo = std::max(offset, b.start);
    const size_t hi = std::min(offset + size, b.start + b.len);
    if (lo >= hi) continue;
    b.ready += hi - lo;
    WIOLA_CHECK(b.ready <= b.len, "DistAdamW::grad_ready: elements of bucket at ", b.start,
                " declared ready more than once this step");
  }
  launch_ready();
  progress();
}

void DistAdamW::progress() {
  for (Bucket& b : buckets_) b.req.test();
}

double DistAdamW::sum_over(Comm* c, double x) {
  if (!c || c->size() == 1) return x;
  // Gather and add in rank order: every rank gets the bit-identical sum.
  std::vector<double> all(size_t(c->size()));
  c->all_gather(&x, all.data(), 1, DType::F64);
  double s = 0;
  for (double v : all) s += v;
  return s;
}

StepResult DistAdamW::step(double lr, long t) {
  WIOLA_CHECK(t >= 1, "DistAdamW::step: bias-correction step t must be >= 1, got ", t);
  // 1. DP reduction of every bucket (those not started by grad_ready now).
  while (next_launch_ >= 0) launch(next_launch_--);
  trace::Span wait("reduce", dp_size_ > 1 ? "DP gradient reduction (wait)" : "");
  for (Bucket& b : buckets_) {
    b.req.wait();
    b.ready = 0;
  }
  wait.end();
  next_launch_ = int(buckets_.size()) - 1;

  // 2. Mean over DP, on what this rank updates.
  if (dp_size_ > 1) {
    const float inv = 1.0f / float(dp_size_);
    for (const Piece& p : pieces_) ops_.scale(grad_at(p), inv, p.size);
  }

  // 3. Global norm: each parameter once, summed on the backend; the host
  // gets one double (for clipping and the non-finite check).
  ops_.zero(sq_.data(), sq_.bytes());
  for (const Piece& p : pieces_)
    if (p.in_norm) ops_.sum_squares(grad_at(p), p.size, sq_.data());
  double sq = 0;
  trace::Span norm("reduce", "gradient norm");
  ops_.download(&sq, sq_.data(), sizeof sq);
  if (zero_active()) sq = sum_over(dp_ctrl_, sq);
  sq = sum_over(norm_, sq);
  norm.end();
  StepResult r;
  r.grad_norm = std::sqrt(sq);
  if (!std::isfinite(r.grad_norm)) {
    WIOLA_CHECK(!cfg_.nonfinite_fatal, "non-finite gradient norm (", r.grad_norm, ") at optimizer step ", t,
                " (train.nonfinite_fatal is set)");
    r.skipped = true;
    if (cfg_.zero_grads) ops_.zero(grads_, n_ * sizeof(float));
    return r;
  }

  // 4. Clip (PyTorch clip_grad_norm_).
  if (cfg_.clip > 0) {
    const double coef = cfg_.clip / (r.grad_norm + 1e-6);
    if (coef < 1.0)
      for (const Piece& p : pieces_) ops_.scale(grad_at(p), float(coef), p.size);
  }

  // 5. AdamW on the owned pieces. Where they are every parameter of the
  // buffer (no ZeRO sharding over several ranks; the padding is never
  // touched and stays zero), the same pass writes the weight copy and
  // zeroes the gradient: no refresh or zeroing pass over the whole buffer.
  const double bc1 = 1.0 - std::pow(cfg_.beta1, double(t));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, double(t));
  float* master = zero_active() ? master_.data() : params_;
  const bool fused = !zero_active() || dp_size_ == 1;
  for (const Piece& p : pieces_)
    ops_.adamw(master + p.local, grad_at(p), m_.data() + p.local, v_.data() + p.local, p.size, lr, cfg_.beta1,
               cfg_.beta2, cfg_.eps, p.decay ? cfg_.weight_decay : 0.0, bc1, bc2,
               fused && weights_ ? weights_ + p.global : nullptr, fused && cfg_.zero_grads);
  ++applied_;

  // 6. ZeRO: all-gather the updated parameters bucket by bucket.
  if (zero_active()) {
    const trace::Span gather("reduce", "ZeRO parameter all-gather");
    const size_t D = size_t(dp_size_);
    for (int k = int(buckets_.size()) - 1; k >= 0; --k) {
      Bucket& b = buckets_[k];
      float* base = b.padded ? tmp_.data() : params_ + b.start;
      float* mine = base + size_t(dp_rank_) * b.chunk;
      const size_t real = chunk_real(b);
      if (real) ops_.copy(mine, master_.data() + b.local, real * sizeof(float));
      if (D > 1) {
        if (b.padded && real < b.chunk)  // keep padding defined
          ops_.zero(mine + real, (b.chunk - real) * sizeof(float));
        b.req = dp_->iall_gather(mine, base, b.chunk, DType::F32);
      }
    }
    for (Bucket& b : buckets_) {
      b.req.wait();
      if (b.padded) ops_.copy(params_ + b.start, tmp_.data(), b.len * sizeof(float));
    }
  }
  // 7. Sharded over several ranks: the copy and the zeroing as passes of their
  // own, over the gathered parameters and the whole gradient buffer.
  if (!fused) {
    if (weights_) ops_.convert(params_, weights_, n_);
    if (cfg_.zero_grads) ops_.zero(grads_, n_ * sizeof(float));
  }
  return r;
}

size_t DistAdamW::state_bytes_this_rank() const { return 3 * shard_elems_ * sizeof(float); }

size_t DistAdamW::workspace_bytes() const { return tmp_.bytes(); }

std::vector<DistAdamW::Range> DistAdamW::owned_ranges() const {
  std::vector<Range> out;
  for (const Bucket& b : buckets_) {
    const size_t real = zero_active() ? chunk_real(b) : b.len;
    const size_t g0 = zero_active() ? b.start + size_t(dp_rank_) * b.chunk : b.start;
    if (!real) continue;
    if (!out.empty() && out.back().offset + out.back().size == g0) out.back().size += real;
    else out.push_back({g0, real});
  }
  return out;
}

void DistAdamW::reload_master() {
  if (!zero_active()) return;
  for (const Bucket& b : buckets_) {
    const size_t real = chunk_real(b);
    if (real) ops_.copy(master_.data() + b.local, params_ + b.start + size_t(dp_rank_) * b.chunk, real * sizeof(float));
  }
}

void DistAdamW::gather_moments(std::vector<float>& m_full, std::vector<float>& v_full) {
  m_full.assign(n_, 0.0f);
  v_full.assign(n_, 0.0f);
  if (!zero_active()) {
    ops_.download(m_full.data(), m_.data(), n_ * sizeof(float));
    ops_.download(v_full.data(), v_.data(), n_ * sizeof(float));
    return;
  }
  const size_t D = size_t(dp_size_);
  Buffer<float> work(ops_, bucket_);
  for (const Bucket& b : buckets_) {
    for (int which = 0; which < 2; ++which) {
      const float* src = (which == 0 ? m_ : v_).data() + b.local;
      float* mine = work.data() + size_t(dp_rank_) * b.chunk;
      ops_.copy(mine, src, b.chunk * sizeof(float));
      if (D > 1) dp_->all_gather(mine, work.data(), b.chunk, DType::F32);
      ops_.download((which == 0 ? m_full : v_full).data() + b.start, work.data(), b.len * sizeof(float));
    }
  }
}

void DistAdamW::set_moments(const std::vector<float>& m_full, const std::vector<float>& v_full, long applied) {
  WIOLA_CHECK(m_full.size() == n_ && v_full.size() == n_, "DistAdamW::set_moments: expected ", n_, " elements, got ",
              m_full.size(), " and ", v_full.size());
  ops_.zero(m_.data(), m_.bytes());
  ops_.zero(v_.data(), v_.bytes());
  for (const Bucket& b : buckets_) {
    const size_t real = zero_active() ? chunk_real(b) : b.len;
    const size_t g0 = zero_active() ? b.start + size_t(dp_rank_) * b.chunk : b.start;
    if (!real) continue;
    ops_.upload(m_.data() + b.local, m_full.data() + g0, real * sizeof(float));
    ops_.upload(v_.data() + b.local, v_full.data() + g0, real * sizeof(float));
  }
  applied_ = applied;
  reload_master();
}

namespace {
struct ShardHeader {
  char magic[8] = {'W', 'I', 'O', 'L', 'A', 'O', 'P', 'T'};
  uint64_t version = 1;
  uint64_t n = 0, dp_size = 0, dp_rank = 0, zero = 0, bucket = 0, shard = 0;
  int64_t applied = 0;
};
}  // namespace

// Owned ranges are the buckets' real chunk elements in bucket order, which is
// also their order in the shard (b.local); without ZeRO the whole buffer.
void DistAdamW::download_owned(std::vector<float>& m, std::vector<float>& v) const {
  size_t total = 0;
  for (const Range& r : owned_ranges()) total += r.size;
  m.resize(total);
  v.resize(total);
  if (!zero_active()) {
    ops_.download(m.data(), m_.data(), n_ * sizeof(float));
    ops_.download(v.data(), v_.data(), n_ * sizeof(float));
    return;
  }
  size_t pos = 0;
  for (const Bucket& b : buckets_) {
    const size_t real = chunk_real(b);
    if (!real) continue;
    ops_.download(m.data() + pos, m_.data() + b.local, real * sizeof(float));
    ops_.download(v.data() + pos, v_.data() + b.local, real * sizeof(float));
    pos += real;
  }
}

void DistAdamW::upload_owned(const std::vector<float>& m, const std::vector<float>& v, long applied) {
  size_t total = 0;
  for (const Range& r : owned_ranges()) total += r.size;
  WIOLA_CHECK(m.size() == total && v.size() == total, "DistAdamW::upload_owned: expected ", total, " elements, got ",
              m.size(), " and ", v.size());
  if (!zero_active()) {
    ops_.upload(m_.data(), m.data(), n_ * sizeof(float));
    ops_.upload(v_.data(), v.data(), n_ * sizeof(float));
  } else {
    ops_.zero(m_.data(), m_.bytes());  // padding stays zero
    ops_.zero(v_.data(), v_.bytes());
    size_t pos = 0;
    for (const Bucket& b : buckets_) {
      const size_t real = chunk_real(b);
      if (!real) continue;
      ops_.upload(m_.data() + b.local, m.data() + pos, real * sizeof(float));
      ops_.upload(v_.data() + b.local, v.data() + pos, real * sizeof(float));
      pos += real;
    }
  }
  applied_ = applied;
  reload_master();
}

std::vector<uint8_t> DistAdamW::save_shard() const {
  ShardHeader h;
  h.n = n_;
  h.dp_size = uint64_t(dp_size_);
  h.dp_rank = uint64_t(dp_rank_);
  h.zero = zero_active() ? 1 : 0;
  h.bucket = bucket_;
  h.shard = shard_elems_;
  h.applied = applied_;
  const size_t sb = shard_elems_ * sizeof(float);
  std::vector<uint8_t> out(sizeof(h) + 2 * sb);
  std::memcpy(out.data(), &h, sizeof(h));
  ops_.download(out.data() + sizeof(h), m_.data(), sb);
  ops_.download(out.data() + sizeof(h) + sb, v_.data(), sb);
  return out;
}

void DistAdamW::load_shard(const std::vector<uint8_t>& blob) {
  ShardHeader h, want;
  WIOLA_CHECK(blob.size() >= sizeof(h), "optimizer shard: truncated (", blob.size(), " bytes)");
  std::memcpy(&h, blob.data(), sizeof(h));
  WIOLA_CHECK(std::memcmp(h.magic, want.magic, 8) == 0 && h.version == 1,
              "optimizer shard: not a wiola optimizer shard (bad magic/version)");
  WIOLA_CHECK(h.n == n_ && h.dp_size == uint64_t(dp_size_) && h.dp_rank == uint64_t(dp_rank_) &&
                  h.zero == uint64_t(zero_active()) && h.bucket == bucket_,
              "optimizer shard: saved with n=", h.n, " dp=", h.dp_size, " rank=", h.dp_rank, " zero=", h.zero,
              " bucket=", h.bucket, ", this run has n=", n_, " dp=", dp_size_, " rank=", dp_rank_,
              " zero=", zero_active(), " bucket=", bucket_,
              "; resume from full moments (set_moments) to change layout");
  const size_t sb = shard_elems_ * sizeof(float);
  WIOLA_CHECK(blob.size() == sizeof(h) + 2 * sb, "optimizer shard: size ", blob.size(), " bytes, expected ",
              sizeof(h) + 2 * sb);
  ops_.upload(m_.data(), blob.data() + sizeof(h), sb);
  ops_.upload(v_.data(), blob.data() + sizeof(h) + sb, sb);
  applied_ = h.applied;
  reload_master();
}

}  // namespace wiola::dist
