// DistAdamW against a single-process reference computed on every rank from
// the same deterministic data: per-rank gradients, DP mean, global norm over
// distinct parameters, clipping, AdamW, 3 steps (one with a non-finite
// gradient, skipped). ZeRO on/off, small and large buckets, overlapped
// (grad_ready) vs synchronous, moments, shard save/load.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "dist/grid.h"
#include "dist/mpi_comm.h"
#include "dist/optimizer.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "util/error.h"

using namespace wiola;
using namespace wiola::dist;

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Uniform in [-1, 1) from a key.
float unif(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  const uint64_t h = mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
  return float(double(h >> 11) / double(1ull << 53) * 2.0 - 1.0);
}

constexpr size_t kN = 1003;  // odd: not divisible by 2 or 4
const std::vector<ParamSegment> kSegs = {
    {0, 500, true, true},
    {500, 10, false, true},     // no decay (γ, δ, φ-like)
    {510, 390, true, true},
    {900, 103, true, false}};   // replica counted elsewhere: not in the norm

float init_param(int q, size_t i) { return unif(1, uint64_t(q), i, 0); }
// Gradient of model-parallel rank q, DP rank r at step s: integers times a
// power of two, so DP sums are exact in any order and only the norm's
// summation order differs from the reference. Step 1 is clipped at clip=1
// (norm ~ 70), step 3 is not (norm ~ 0.3).
float grad(int q, int r, int s, size_t i) {
  const float scale = s == 1 ? 1.0f / 256 : (s == 2 ? 1.0f / 8192 : 1.0f / 65536);
  const int k = int(unif(2, uint64_t(q), uint64_t(r) * 100 + uint64_t(s), i) * 1024.0f);
  return float(k) * scale;
}
constexpr int kNanStep = 2;  // step 2: one rank's gradient has a NaN

struct Ref {
  std::vector<float> p, m, v;
  std::vector<double> norms;
  std::vector<bool> skipped;
};

// Serial reference for model-parallel rank q of n_mp (norm summed over all
// of them), DP size D, 3 steps.
Ref reference(const AdamWConfig& cfg, int D, int n_mp, int q, double lr) {
  Ref R;
  std::vector<std::vector<float>> p(n_mp, std::vector<float>(kN)),
      m(n_mp, std::vector<float>(kN, 0.f)), v(n_mp, std::vector<float>(kN, 0.f));
  for (int j = 0; j < n_mp; ++j)
    for (size_t i = 0; i < kN; ++i) p[j][i] = init_param(j, i);
  long applied = 0;
  for (int s = 1; s <= 3; ++s) {
    std::vector<std::vector<float>> g(n_mp, std::vector<float>(kN));
    double sq = 0;
    for (int j = 0; j < n_mp; ++j)
      for (size_t i = 0; i < kN; ++i) {
        double sum = 0;
        for (int r = 0; r < D; ++r) sum += double(grad(j, r, s, i));
        g[j][i] = float(sum) * (1.0f / float(D));
        if (i >= 900) continue;  // in_norm = false
        sq += double(g[j][i]) * double(g[j][i]);
      }
    if (s == kNanStep) sq = std::numeric_limits<double>::quiet_NaN();
    const double norm = std::sqrt(sq);
    R.norms.push_back(norm);
    R.skipped.push_back(!std::isfinite(norm));
    if (!std::isfinite(norm)) continue;
    const double coef = cfg.clip > 0 ? cfg.clip / (norm + 1e-6) : 1.0;
    const long t = ++applied;
    const double bc1 = 1 - std::pow(cfg.beta1, double(t));
    const double bc2 = 1 - std::pow(cfg.beta2, double(t));
    for (int j = 0; j < n_mp; ++j)
      for (size_t i = 0; i < kN; ++i) {
        const float gi = coef < 1.0 ? g[j][i] * float(coef) : g[j][i];
        const double wd = (i >= 500 && i < 510) ? 0.0 : cfg.weight_decay;
        const double mi = cfg.beta1 * m[j][i] + (1 - cfg.beta1) * double(gi);
        const double vi = cfg.beta2 * v[j][i] + (1 - cfg.beta2) * double(gi) * gi;
        m[j][i] = float(mi);
        v[j][i] = float(vi);
        p[j][i] = float(double(p[j][i]) * (1 - lr * wd) -
                        (lr / bc1) * mi / (std::sqrt(vi) / std::sqrt(bc2) + cfg.eps));
      }
  }
  R.p = p[q];
  R.m = m[q];
  R.v = v[q];
  return R;
}

// The distributed run: model-parallel rank q, DP comm `dp`, norm group `mp`.
struct DistRun {
  std::vector<float> p, m, v;
  std::vector<StepResult> results;
  size_t state_bytes = 0;
  std::vector<uint8_t> shard;
};

DistRun distributed(const AdamWConfig& cfg, Comm* dp, Comm* mp, int q, double lr,
                bool overlap, Ops<float>& ops) {
  const int D = dp ? dp->size() : 1, r = dp ? dp->rank() : 0;
  Buffer<float> params(ops, kN), grads(ops, kN);
  std::vector<float> host(kN);
  for (size_t i = 0; i < kN; ++i) host[i] = init_param(q, i);
  ops.upload(params.data(), host.data(), kN * sizeof(float));
  (void)D;
  DistAdamW opt(ops, params.data(), grads.data(), kN, kSegs, cfg, dp, mp);
  DistRun out;
  for (int s = 1; s <= 3; ++s) {
    for (size_t i = 0; i < kN; ++i) host[i] = grad(q, r, s, i);
    if (s == kNanStep && r == 0 && q == 0) host[kN / 2] = std::nanf("");
    if (!overlap) {
      ops.upload(grads.data(), host.data(), kN * sizeof(float));
    } else {
      // "Backward": grads become final from the end, in uneven pieces.
      size_t hi = kN;
      for (int piece = 0; hi > 0; ++piece) {
        const size_t len = std::min(hi, size_t(17 + (piece * 29) % 61));
        ops.upload(grads.data() + hi - len, host.data() + hi - len,
                   len * sizeof(float));
        opt.grad_ready(hi - len, len);
        hi -= len;
      }
    }
    out.results.push_back(opt.step(lr, opt.applied_steps() + 1));
  }
  out.p.resize(kN);
  ops.download(out.p.data(), params.data(), kN * sizeof(float));
  opt.gather_moments(out.m, out.v);
  out.state_bytes = opt.state_bytes_this_rank();
  out.shard = opt.save_shard();
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = 1e-6 * std::abs(double(want[i])) + 1e-9;
    ASSERT_NEAR(got[i], want[i], tol) << what << "[" << i << "]";
  }
}

// Every rank of c holds the bit-identical vector.
void expect_identical_over(Comm& c, const std::vector<float>& x) {
  std::vector<float> mx = x;
  c.all_reduce(mx.data(), mx.data(), mx.size(), DType::F32, ReduceOp::Max);
  EXPECT_EQ(std::memcmp(mx.data(), x.data(), x.size() * sizeof(float)), 0);
}

class DistAdamWTest : public ::testing::TestWithParam<std::tuple<bool, size_t, double>> {};

}  // namespace

TEST_P(DistAdamWTest, MatchesSerialReference) {
  const auto [zero, bucket_bytes, clip] = GetParam();
  auto world = mpi_world_comm();
  auto ops = make_cpu_ops<float>();
  AdamWConfig cfg;
  cfg.zero = zero;
  cfg.bucket_bytes = bucket_bytes;
  cfg.clip = clip;
  const double lr = 1e-2;
  const int D = world->size();
  const Ref ref = reference(cfg, D, 1, 0, lr);
  const DistRun run = distributed(cfg, world.get(), nullptr, 0, lr, false, *ops);

  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(run.results[s].skipped, bool(ref.skipped[s])) << "step " << s + 1;
    if (!ref.skipped[s]) {
      EXPECT_NEAR(run.results[s].grad_norm, ref.norms[s], 1e-6 * ref.norms[s]);
    }
  }
  expect_close(run.p, ref.p, "params");
  expect_close(run.m, ref.m, "m");
  expect_close(run.v, ref.v, "v");
  expect_identical_over(*world, run.p);
  const size_t shard = zero ? (kN + D - 1) / D : kN;
  EXPECT_EQ(run.state_bytes, shard * 3 * 4);

  // Overlapped path: bit-identical to the synchronous one.
  const DistRun ov = distributed(cfg, world.get(), nullptr, 0, lr, true, *ops);
  EXPECT_EQ(std::memcmp(ov.p.data(), run.p.data(), kN * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(ov.m.data(), run.m.data(), kN * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(ov.v.data(), run.v.data(), kN * sizeof(float)), 0);
  for (int s = 0; s < 3; ++s)
    if (!run.results[s].skipped) {
      EXPECT_EQ(ov.results[s].grad_norm, run.results[s].grad_norm);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DistAdamWTest,
    ::testing::Combine(::testing::Bool(),                        // ZeRO
                       ::testing::Values(size_t(160), size_t(25) << 20),  // bucket
                       ::testing::Values(1.0, 100.0, 0.0)));     // clip

TEST(DistAdamW, NormGroupSumsDistinctParameters) {
  // 2 model-parallel ranks × DP (world/2): each mp rank owns distinct
  // parameters; the norm is over both.
  auto world = mpi_world_comm();
  if (world->size() % 2) GTEST_SKIP() << "needs an even number of ranks";
  Grid grid({2, 1, world->size() / 2}, *world);
  auto ops = make_cpu_ops<float>();
  for (bool zero : {true, false}) {
    AdamWConfig cfg;
    cfg.zero = zero;
    cfg.bucket_bytes = 96;
    const int q = grid.coord().tp;
    const Ref ref = reference(cfg, grid.config().dp, 2, q, 1e-2);
    const DistRun run = distributed(cfg, &grid.dp(), &grid.mp(), q, 1e-2, false, *ops);
    for (int s = 0; s < 3; ++s)
      if (!ref.skipped[s]) {
        EXPECT_NEAR(run.results[s].grad_norm, ref.norms[s], 1e-6 * ref.norms[s]);
      }
    expect_close(run.p, ref.p, "params");
    expect_close(run.m, ref.m, "m");
  }
}

TEST(DistAdamW, NonFiniteFatalThrowsOnEveryRank) {
  auto world = mpi_world_comm();
  auto ops = make_cpu_ops<float>();
  AdamWConfig cfg;
  cfg.nonfinite_fatal = true;
  Buffer<float> p(*ops, kN), g(*ops, kN);
  DistAdamW opt(*ops, p.data(), g.data(), kN, kSegs, cfg, world.get(), nullptr);
  std::vector<float> h(kN, 0.5f);
  if (world->rank() == 0) h[3] = std::numeric_limits<float>::infinity();
  ops->upload(g.data(), h.data(), kN * sizeof(float));
  EXPECT_THROW(opt.step(1e-3, 1), wiola::Error);
  EXPECT_EQ(opt.applied_steps(), 0);
}

TEST(DistAdamW, ShardSaveLoadAndFullMomentsRoundTrip) {
  auto world = mpi_world_comm();
  auto ops = make_cpu_ops<float>();
  AdamWConfig cfg;
  cfg.bucket_bytes = 200;
  const DistRun run = distributed(cfg, world.get(), nullptr, 0, 1e-2, false, *ops);

  Buffer<float> p(*ops, kN), g(*ops, kN);
  ops->upload(p.data(), run.p.data(), kN * sizeof(float));
  {
    DistAdamW opt(*ops, p.data(), g.data(), kN, kSegs, cfg, world.get(), nullptr);
    opt.load_shard(run.shard);
    EXPECT_EQ(opt.applied_steps(), 2);
    std::vector<float> m, v;
    opt.gather_moments(m, v);
    EXPECT_EQ(m, run.m);
    EXPECT_EQ(v, run.v);
  }
  {  // Another layout (no ZeRO, other bucket) from the full moments.
    AdamWConfig other = cfg;
    other.zero = false;
    other.bucket_bytes = 64;
    DistAdamW opt(*ops, p.data(), g.data(), kN, kSegs, other, world.get(), nullptr);
    EXPECT_THROW(opt.load_shard(run.shard), wiola::Error);
    opt.set_moments(run.m, run.v, 2);
    std::vector<float> m, v;
    opt.gather_moments(m, v);
    EXPECT_EQ(m, run.m);
    EXPECT_EQ(v, run.v);
  }
}

TEST(DistAdamW, OwnedRangesPartitionTheBuffer) {
  auto world = mpi_world_comm();
  auto ops = make_cpu_ops<float>();
  AdamWConfig cfg;
  cfg.bucket_bytes = 120;
  Buffer<float> p(*ops, kN), g(*ops, kN);
  DistAdamW opt(*ops, p.data(), g.data(), kN, kSegs, cfg, world.get(), nullptr);
  std::vector<int32_t> owner(kN, 0);
  size_t total = 0;
  for (const auto& r : opt.owned_ranges()) {
    for (size_t i = r.offset; i < r.offset + r.size; ++i) owner[i] += 1;
    total += r.size;
  }
  EXPECT_LE(total, opt.shard_elems());
  world->all_reduce(owner.data(), kN, ReduceOp::Sum);
  for (size_t i = 0; i < kN; ++i) ASSERT_EQ(owner[i], 1) << "element " << i;
}

TEST(DistAdamW, RejectsBadSegments) {
  auto ops = make_cpu_ops<float>();
  Buffer<float> p(*ops, 10), g(*ops, 10);
  EXPECT_THROW(DistAdamW(*ops, p.data(), g.data(), 10, {{0, 4}, {5, 5}}, {},
                         nullptr, nullptr),
               wiola::Error);
  EXPECT_THROW(DistAdamW(*ops, p.data(), g.data(), 10, {{0, 4}}, {}, nullptr,
                         nullptr),
               wiola::Error);
}

// The parameter layout's padding (model/params.h) as a padding segment: never
// scaled, counted or updated, so whatever gradient lands there its values
// and moments keep what they were, and the rest of the buffer steps bit for
// bit as when the padding is an ordinary no-decay segment with zero gradient
// (ZeRO chunks and buckets cut through it; step 1 is clipped).
TEST(DistAdamW, PaddingSegmentIsNeverTouched) {
  auto world = mpi_world_comm();
  auto ops = make_cpu_ops<float>();
  std::vector<ParamSegment> padded = kSegs;
  padded[1].padding = true;  // [500, 510)
  auto run = [&](const std::vector<ParamSegment>& segs, bool junk_in_padding, const AdamWConfig& cfg) {
    Buffer<float> p(*ops, kN), g(*ops, kN);
    std::vector<float> host(kN);
    for (size_t i = 0; i < kN; ++i) host[i] = init_param(0, i);
    ops->upload(p.data(), host.data(), kN * sizeof(float));
    DistAdamW opt(*ops, p.data(), g.data(), kN, segs, cfg, world.get(), nullptr);
    DistRun out;
    for (int s = 1; s <= 3; ++s) {
      for (size_t i = 0; i < kN; ++i) host[i] = grad(0, world->rank(), s, i);
      for (size_t i = 500; i < 510; ++i) host[i] = junk_in_padding ? 1e3f * float(i) : 0.0f;
      ops->upload(g.data(), host.data(), kN * sizeof(float));
      out.results.push_back(opt.step(1e-2, opt.applied_steps() + 1));
    }
    out.p.resize(kN);
    ops->download(out.p.data(), p.data(), kN * sizeof(float));
    opt.gather_moments(out.m, out.v);
    return out;
  };
  for (bool zero : {true, false}) {
    SCOPED_TRACE(zero ? "ZeRO" : "no ZeRO");
    AdamWConfig cfg;
    cfg.zero = zero;
    cfg.bucket_bytes = 160;
    const DistRun pad = run(padded, true, cfg), plain = run(kSegs, false, cfg);
    for (size_t i = 500; i < 510; ++i) {
      EXPECT_EQ(pad.p[i], init_param(0, i)) << i;
      EXPECT_EQ(pad.m[i], 0.0f) << i;
      EXPECT_EQ(pad.v[i], 0.0f) << i;
    }
    EXPECT_EQ(std::memcmp(pad.p.data(), plain.p.data(), kN * sizeof(float)), 0);
    EXPECT_EQ(pad.m, plain.m);
    EXPECT_EQ(pad.v, plain.v);
    for (int s = 0; s < 3; ++s) EXPECT_EQ(pad.results[s].grad_norm, plain.results[s].grad_norm) << "step " << s + 1;
    EXPECT_LT(1.0, pad.results[0].grad_norm) << "step 1 should be clipped";
  }
}
