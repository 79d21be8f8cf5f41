// Whole-model correctness: finite-difference gradient of every parameter in
// double, causality with ATM forced, no-merge ATM = causal attention, cached
// decoding in any chunking = full forward, recompute and micro-batching give
// the same gradients, layout-independent initialisation, schedule formulas.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "tests/model/backend_under_test.h"
#include "model/atm.h"
#include "model/model.h"
#include "train/lr_schedule.h"
#include "util/error.h"

namespace wiola {
namespace {

ModelConfig micro_config() {
  ModelConfig c;
  c.name = "micro";
  c.d = 16;
  c.L = 3;
  c.H = 2;
  c.Hkv = 1;
  c.dA = 8;
  c.dB = 16;
  c.V = 24;
  c.T = 6;
  return c;
}

std::vector<int32_t> random_tokens(size_t n, int V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(g() % uint64_t(V));
  return t;
}

template <class T>
double max_abs_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

// Central differences of the summed training loss (ATM active, every pair
// merged: tau = -1 keeps the merge decisions fixed under perturbation) for
// every parameter element, against the hand-written backward, in double; ATM
// on, off, and on with documents (docs/model.md §2: an EOS-only document,
// EOS targets masked, every piece restarting at each document).
TEST(ModelGradient, FiniteDifferenceEveryParameterDouble) {
  ModelConfig c = micro_config();
  c.tau = -1.0;
  // A larger init than 0.02 makes every gradient well above the round-off of
  // the difference quotient (~1e-10 here).
  c.init_std = 0.3;
  for (int run = 0; run < 3; ++run) {
    const bool atm = run != 1, docs = run == 2;
    c.atm = atm;
    auto ops = test_backend<double>();
    const int B = 2;
    ModelOptions mo{B, false, false};
    if (docs) mo.documents_eos = 2;
    Model<double> m(*ops, c, ModelShard{}, nullptr, mo);
    m.init(7);
    auto tok = random_tokens(size_t(B) * (c.T + 1), c.V, 3);
    if (docs) tok[1] = tok[2] = tok[size_t(c.T + 1) + 4] = 2;  // documents [0,2) [2] [3,6); [0,5) [5,6)
    m.zero_grads();
    m.train_micro_step(tok.data(), 1.0);
    const std::vector<double> g = download_vec(*ops, m.grads(), m.n_params());
    const std::vector<double> p = download_vec(*ops, m.params(), m.n_params());
    // Perturb one master element (any backend: through upload), then bring
    // the weight copy up to date as the trainer does after an update.
    auto poke = [&](size_t k, double v) {
      set_element(*ops, m.params(), k, v);
      m.refresh_weights();
    };
    const double h = 1e-5;
    double worst = 0;
    std::string worst_name;
    for (const ParamEntry& e : m.layout().entries()) {
      double scale = 1e-8;
      for (size_t i = 0; i < e.size(); ++i) scale = std::max(scale, std::abs(g[e.offset + i]));
      double err = 0;
      // Where the host cannot touch backend memory every op is slow (cpu-opaque:
      // two mprotect calls per op), so a sample of each tensor is enough; the
      // host-memory cpu backend checks every element.
      // (The documents run, a third, samples every fifth element to stay cheap.)
      const size_t stride = ops->host_accessible() ? (docs ? 5 : 1) : 17;
      for (size_t i = 0; i < e.size(); i += stride) {
        const size_t k = e.offset + i;
        const double p0 = p[k];
        poke(k, p0 + h);
        const double lp = m.train_micro_step(tok.data(), 0.0);
        poke(k, p0 - h);
        const double lm = m.train_micro_step(tok.data(), 0.0);
        poke(k, p0);
        err = std::max(err, std::abs((lp - lm) / (2 * h) - g[k]) / scale);
      }
      if (err > worst) {
        worst = err;
        worst_name = e.name;
      }
      EXPECT_LT(err, 1e-6) << e.name << " (atm " << atm << ", documents " << docs << ")";
    }
    std::printf("  FD whole model (atm %d, documents %d, %zu parameters): worst rel err %.2e at %s\n", int(atm),
                int(docs), m.n_params(), worst, worst_name.c_str());
  }
}

// Changing tokens after position t leaves logits at positions <= t unchanged
// in training mode with ATM merging (forced and data-dependent).
TEST(ModelCausality, TrainingModeWithAtm) {
  ModelConfig c = micro_config();
  c.T = 16;
  c.L = 6;
  for (double tau : {-1.0, 0.0, 0.3}) {
    c.tau = tau;
    auto ops = test_backend<float>();
    const int B = 2;
    Model<float> m(*ops, c, ModelShard{}, nullptr, ModelOptions{B, false, false});
    m.init(11);
    auto in = random_tokens(size_t(B) * c.T, c.V, 5);
    const auto ref = m.forward_logits(in.data(), true);
    bool merged = false;
    for (int l = 0; l < c.L; ++l)
      for (uint8_t o : m.atm_open(l)) merged |= o != 0;
    EXPECT_TRUE(merged || tau > 0.2) << "tau " << tau << ": ATM merged nothing";
    for (int t : {0, 3, 8, 14}) {
      auto in2 = in;
      for (int b = 0; b < B; ++b)
        for (int u = t + 1; u < c.T; ++u) in2[size_t(b) * c.T + u] = (in2[size_t(b) * c.T + u] + 7) % c.V;
      const auto out = m.forward_logits(in2.data(), true);
      double diff_past = 0, diff_future = 0;
      for (int b = 0; b < B; ++b)
        for (int u = 0; u < c.T; ++u)
          for (int v = 0; v < c.V; ++v) {
            const size_t i = (size_t(b) * c.T + u) * c.V + v;
            const double dlt = std::abs(double(out[i]) - double(ref[i]));
            (u <= t ? diff_past : diff_future) = std::max(u <= t ? diff_past : diff_future, dlt);
          }
      // Rounding only (summation order in tiled kernels), far below any leak.
      EXPECT_LT(diff_past, 1e-6) << "tau " << tau << " t " << t;
      if (t < c.T - 1) {
        EXPECT_GT(diff_future, 1e-4) << "tau " << tau << " t " << t;
      }
    }
  }
}

// Documents (docs/model.md §2): each document of a packed window gives the
// logits it gives alone at the start of a window (in training mode, ATM
// merging every pair it may), and the loss sums the targets that are not an
// EOS's.
TEST(ModelDocuments, EachDocumentAsIfAlone) {
  ModelConfig c = micro_config();
  c.T = 16;
  c.tau = -1.0;
  c.init_std = 0.1;
  const int32_t eos = 2;
  auto ops = test_backend<double>();
  ModelOptions mo{2, false, false};
  mo.documents_eos = eos;
  Model<double> m(*ops, c, ModelShard{}, nullptr, mo);
  m.init(5);
  auto in = random_tokens(size_t(2) * c.T, c.V - 3, 8);
  for (auto& x : in) x += 3;     // no EOS but where placed
  in[4] = in[5] = in[11] = eos;  // [0,5) [5,6) [6,12) [12,16)
  in[size_t(c.T) + 9] = eos;     // [0,10) [10,16)
  const auto packed = m.forward_logits(in.data(), true);
  const struct { int b, s, e; } docs[] = {{0, 0, 5}, {0, 5, 6}, {0, 6, 12}, {0, 12, 16}, {1, 0, 10}, {1, 10, 16}};
  for (const auto& d : docs) {
    auto alone = random_tokens(size_t(2) * c.T, c.V - 3, 9 + uint64_t(d.s));
    for (auto& x : alone) x += 3;
    std::copy(in.begin() + d.b * c.T + d.s, in.begin() + d.b * c.T + d.e, alone.begin());
    const auto ref = m.forward_logits(alone.data(), true);
    double diff = 0;
    for (int t = 0; t < d.e - d.s; ++t)
      for (int v = 0; v < c.V; ++v)
        diff = std::max(diff, std::abs(ref[size_t(t) * c.V + v] - packed[(size_t(d.b) * c.T + d.s + t) * c.V + v]));
    EXPECT_LT(diff, 1e-12) << "document [" << d.s << ", " << d.e << ") of sequence " << d.b;
  }
  // ATM's statistics count the pairs inside the documents (every pair merges
  // at tau = -1: about half the positions, fewer visible pairs than causal).
  for (const auto& st : m.atm_stats()) {
    EXPECT_GT(st.mu, 0.3) << st.layer;
    EXPECT_GT(st.visible_fraction, 0.0) << st.layer;
    EXPECT_LT(st.visible_fraction, 1.0) << st.layer;
  }
  EXPECT_FALSE(m.atm_stats().empty());
  // Without documents the earlier documents reach the later ones.
  Model<double> plain(*ops, c, ModelShard{}, nullptr, ModelOptions{2, false, false});
  plain.init(5);
  EXPECT_GT(max_abs_diff(plain.forward_logits(in.data(), true), packed), 1e-6);
  // The loss: every target but the four EOS positions'.
  std::vector<int32_t> tok;
  double want = 0;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t <= c.T; ++t) {
      const int32_t x = t < c.T ? in[size_t(b) * c.T + t] : 7;
      tok.push_back(x);
      if (t == 0 || in[size_t(b) * c.T + t - 1] == eos) continue;
      const double* z = &packed[(size_t(b) * c.T + t - 1) * c.V];
      double mx = *std::max_element(z, z + c.V), se = 0;
      for (int v = 0; v < c.V; ++v) se += std::exp(z[v] - mx);
      want += std::log(se) + mx - z[x];
    }
  EXPECT_EQ(counted_targets(tok.data(), 2, c.T, eos), 2 * c.T - 4);
  EXPECT_NEAR(m.train_micro_step(tok.data(), 1.0), want, 1e-10);
}

// With no pair above tau, training-mode ATM is exactly causal attention.
TEST(ModelAtm, NoMergeEqualsCausal) {
  ModelConfig c = micro_config();
  c.T = 16;
  c.L = 6;
  c.tau = 1.5;  // rho <= 1 + 1e-15 never exceeds 1.5
  auto ops = test_backend<float>();
  Model<float> m(*ops, c, ModelShard{}, nullptr, ModelOptions{2, false, false});
  m.init(3);
  const auto in = random_tokens(size_t(2) * c.T, c.V, 9);
  const auto train = m.forward_logits(in.data(), true);
  for (int l = 0; l < c.L; ++l) {
    EXPECT_EQ(m.atm_open(l).empty(), !c.atm_layer(l));
    for (uint8_t o : m.atm_open(l)) EXPECT_EQ(o, 0);
  }
  const auto eval = m.forward_logits(in.data(), false);
  EXPECT_EQ(max_abs_diff(train, eval), 0.0);
}

// Merge decisions follow Algorithm 1 (greedy, strictly above tau).
TEST(ModelAtm, MergeMapMatchesAlgorithm1) {
  const double rho1[] = {0.95, 0.95, 0.10, 0.93};  // T = 5
  EXPECT_EQ(atm_greedy_open(rho1, 5, 0.92), (std::vector<uint8_t>{1, 0, 0, 1, 0}));
  const double rho2[] = {0.92, 0.921, 0.99, 0.99, 0.99};  // equal to tau does not merge
  EXPECT_EQ(atm_greedy_open(rho2, 6, 0.92), (std::vector<uint8_t>{0, 1, 0, 1, 0, 0}));
  const double rho3[] = {0.5};
  EXPECT_EQ(atm_greedy_open(rho3, 2, 0.92), (std::vector<uint8_t>{0, 0}));
  const auto open = std::vector<uint8_t>{1, 0, 0, 1, 0};
  const auto groups = atm_merge_map(open.data(), 5);
  EXPECT_EQ(groups, (std::vector<std::vector<int>>{{0, 1}, {2}, {3, 4}}));
  const AtmLayout lay = atm_layout(open, 1, 5);
  EXPECT_EQ(lay.n_groups[0], 3);
  EXPECT_EQ(lay.total_groups(), 3);
  // Visible pairs: query t sees groups ending <= t plus its own raw key when
  // it opens a pair: t0: own(1) t1: g0(1) t2: g0,g1(2) t3: g0,g1,own(3) t4: 3.
  EXPECT_EQ(lay.visible_pairs(), 1 + 1 + 2 + 3 + 3);
}

// Cached decoding in any chunking equals the full forward (docs/model.md §2: < 1e-4).
TEST(ModelInference, CachedChunksMatchFullForward) {
  ModelConfig c = micro_config();
  c.T = 24;
  c.L = 6;
  c.d = 32;
  c.H = 4;
  c.Hkv = 2;
  auto ops = test_backend<float>();
  const int B = 2;
  Model<float> m(*ops, c, ModelShard{}, nullptr, ModelOptions{B, false, false});
  m.init(5);
  const auto in = random_tokens(size_t(B) * c.T, c.V, 1);
  const auto full = m.forward_logits(in.data(), false);
  const std::vector<std::vector<int>> chunkings = {{24}, std::vector<int>(24, 1), {12, 12}, {5, 1, 7, 3, 8}, {1, 23}};
  for (const auto& chunks : chunkings) {
    auto cache = m.make_cache(c.T);
    std::vector<float> got(full.size());
    int pos = 0;
    for (int n : chunks) {
      std::vector<int32_t> ids(size_t(B) * n);
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < n; ++i) ids[size_t(b) * n + i] = in[size_t(b) * c.T + pos + i];
      const auto lg = m.forward_cached(ids.data(), n, cache);
      for (int b = 0; b < B; ++b)
        std::copy(lg.begin() + ptrdiff_t(size_t(b) * n * c.V), lg.begin() + ptrdiff_t(size_t(b + 1) * n * c.V),
                  got.begin() + ptrdiff_t((size_t(b) * c.T + pos) * c.V));
      pos += n;
    }
    EXPECT_EQ(cache.len, c.T);
    EXPECT_LT(max_abs_diff(got, full), 1e-4) << "chunks " << chunks.size();
  }
  auto cache = m.make_cache(4);
  std::vector<int32_t> ids(size_t(B) * 5, 1);
  EXPECT_THROW(m.forward_cached(ids.data(), 5, cache), Error);
}

// Recompute: bit-identical loss and gradients, less activation memory.
TEST(ModelRecompute, IdenticalGradients) {
  ModelConfig c = micro_config();
  c.T = 32;
  c.L = 6;
  c.d = 32;
  c.H = 4;
  c.Hkv = 2;
  c.tau = 0.2;
  auto ops = test_backend<float>();
  const int B = 2;
  Model<float> a(*ops, c, ModelShard{}, nullptr, ModelOptions{B, false, false});
  Model<float> r(*ops, c, ModelShard{}, nullptr, ModelOptions{B, true, false});
  a.init(9);
  r.init(9);
  const auto tok = random_tokens(size_t(B) * (c.T + 1), c.V, 2);
  a.zero_grads();
  r.zero_grads();
  const double la = a.train_micro_step(tok.data(), 1.0 / (B * c.T));
  const double lr = r.train_micro_step(tok.data(), 1.0 / (B * c.T));
  EXPECT_EQ(la, lr);
  EXPECT_EQ(download_vec(*ops, a.grads(), a.n_params()), download_vec(*ops, r.grads(), r.n_params()));
  EXPECT_LT(r.activation_bytes(), a.activation_bytes());
  std::printf("  activations: %zu B without recompute, %zu B with (%.1f%% saved)\n", a.activation_bytes(),
              r.activation_bytes(), 100.0 * (1.0 - double(r.activation_bytes()) / double(a.activation_bytes())));
}

// Two micro-batches of one sequence accumulate the gradient of one batch of two.
TEST(ModelAccumulation, MicroBatchesSumToBatch) {
  ModelConfig c = micro_config();
  c.T = 16;
  c.tau = 0.2;
  auto ops = test_backend<double>();
  Model<double> one(*ops, c, ModelShard{}, nullptr, ModelOptions{2, false, false});
  Model<double> two(*ops, c, ModelShard{}, nullptr, ModelOptions{1, false, false});
  one.init(4);
  two.init(4);
  const auto tok = random_tokens(size_t(2) * (c.T + 1), c.V, 8);
  const double s = 1.0 / (2 * c.T);
  one.zero_grads();
  two.zero_grads();
  const double l1 = one.train_micro_step(tok.data(), s);
  const double l2 = two.train_micro_step(tok.data(), s) + two.train_micro_step(tok.data() + c.T + 1, s);
  EXPECT_NEAR(l1, l2, 1e-10 * std::abs(l1));
  const auto g1 = download_vec(*ops, one.grads(), one.n_params());
  const auto g2 = download_vec(*ops, two.grads(), two.n_params());
  double err = 0, scale = 0;
  for (size_t i = 0; i < g1.size(); ++i) {
    err = std::max(err, std::abs(g1[i] - g2[i]));
    scale = std::max(scale, std::abs(g1[i]));
  }
  EXPECT_LT(err / scale, 1e-12);
}

// Initial values depend on (seed, name, global index) only: a TP shard holds
// exactly the single-process values of its rows/columns.
TEST(ModelInit, LayoutIndependent) {
  ModelConfig c = model_preset("wiola-tiny");
  const ParamLayout full(c, ModelShard{});
  std::vector<float> fv(full.total());
  init_params_host(full, 42, fv.data());
  for (int r = 0; r < 2; ++r) {
    ModelShard s;
    s.tp_rank = r;
    s.tp_size = 2;
    const ParamLayout part(c, s);
    std::vector<float> pv(part.total());
    init_params_host(part, 42, pv.data());
    for (const ParamEntry& e : part.entries()) {
      const ParamEntry& g = full.find(e.name);
      for (int64_t i = 0; i < e.rows; ++i)
        for (int64_t j = 0; j < e.cols; ++j)
          ASSERT_EQ(pv[e.offset + size_t(i * e.cols + j)], fv[g.offset + size_t(e.global_index(i, j))])
              << e.name << " tp rank " << r;
    }
  }
  // Statistics of the normal init: mean ~ 0, std ~ init_std; constants exact.
  const ParamEntry& emb = full.find("model.embed_tokens.weight");
  double s1 = 0, s2 = 0;
  for (size_t i = 0; i < emb.size(); ++i) {
    s1 += fv[emb.offset + i];
    s2 += double(fv[emb.offset + i]) * fv[emb.offset + i];
  }
  const double n = double(emb.size()), mean = s1 / n, sd = std::sqrt(s2 / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(sd, 0.02, 0.0005);
  EXPECT_EQ(fv[full.find("model.layers.0.self_attn.ctx_gate_logit").offset], -3.0f);
  EXPECT_EQ(fv[full.find("model.norm.weight").offset], 1.0f);
  EXPECT_EQ(fv[full.find("model.norm.offset").offset], 0.0f);
  std::vector<float> other(full.total());
  init_params_host(full, 43, other.data());
  EXPECT_NE(other[emb.offset], fv[emb.offset]);
}

// The host init splits large tensors' rows over OpenMP threads: the values
// must not depend on the thread count, and each is the counter draw.
TEST(ModelInit, ThreadCountIndependent) {
  ModelConfig c = model_preset("wiola-tiny");
  c.V *= 4;  // an embedding above the threshold for threads
  const ParamLayout full(c, ModelShard{});
  const ParamEntry& emb = full.find("model.embed_tokens.weight");
  ASSERT_GT(emb.size(), size_t(1) << 16) << "the test needs a tensor large enough to go parallel";
  const int threads_before = omp_get_max_threads();
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    runs.emplace_back(full.total());
    init_params_host(full, 7, runs.back().data());
  }
  omp_set_num_threads(threads_before);
  EXPECT_TRUE(runs[0] == runs[1]);
  for (size_t i : {size_t(0), emb.size() / 2, emb.size() - 1})
    EXPECT_EQ(runs[1][emb.offset + i], float(emb.init_value * counter_normal(7, emb.name, i))) << i;
}

TEST(ModelInput, TokenOutOfRangeIsAnError) {
  ModelConfig c = micro_config();
  auto ops = test_backend<float>();
  Model<float> m(*ops, c, ModelShard{}, nullptr, ModelOptions{1, false, false});
  m.init(1);
  auto tok = random_tokens(size_t(c.T + 1), c.V, 1);
  tok[3] = c.V;
  EXPECT_THROW(m.train_micro_step(tok.data(), 1.0), Error);
  tok[3] = -1;
  EXPECT_THROW(m.eval_loss(tok.data()), Error);
}

TEST(Schedule, WarmupCosineAndChinchilla) {
  EXPECT_EQ(default_warmup(100), 5);
  EXPECT_EQ(default_warmup(9), 0);
  EXPECT_EQ(default_warmup(10), 1);
  EXPECT_EQ(default_warmup(29), 1);
  EXPECT_EQ(default_warmup(30), 2);
  const int64_t tm = 1000, tw = default_warmup(tm);
  EXPECT_EQ(tw, 50);
  EXPECT_DOUBLE_EQ(lr_at(1, tm, tw, 3e-4, 0), 3e-4 / 50);
  EXPECT_DOUBLE_EQ(lr_at(tw, tm, tw, 3e-4, 0), 3e-4);
  EXPECT_NEAR(lr_at(tm, tm, tw, 3e-4, 1e-5), 1e-5, 1e-18);
  EXPECT_NEAR(lr_at(525, tm, tw, 3e-4, 0), 1.5e-4, 1e-12);  // half way through the cosine
  // wiola-360m, global batch 256 x 2048: D = 20 N = 6,360,965,440 tokens.
  EXPECT_EQ(chinchilla_steps(318048272, 256, 2048), 12133);
  EXPECT_EQ(steps_for_tokens(1000, 4, 10), 25);
  EXPECT_EQ(steps_for_tokens(1001, 4, 10), 26);
}

}  // namespace
}  // namespace wiola
