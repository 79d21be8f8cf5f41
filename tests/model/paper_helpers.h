// The helpers of the paper's unit tests (tests/model/test_paper.cpp: the
// components; test_paper_model.cpp: ATM, the decoder layer, the model and the
// causal LM): small configurations, random inputs, backend buffers to and
// from the host, parameters by name, hand computations in double, and one
// layer driven through layer_forward.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"
#include "model/layer.h"
#include "model/model.h"
#include "model/params.h"
#include "model/srpe.h"
#include "tests/model/backend_under_test.h"

namespace wiola::paper {

// ---- helpers -------------------------------------------------------------------

// wiola-tiny (d=64, L=6, H=4, Hkv=2, dh=16, dA=64, dB=256) with a small
// vocabulary and window.
inline ModelConfig tiny_cfg(int V = 64, int Tn = 16) {
  ModelConfig c = model_preset("wiola-tiny");
  c.V = V;
  c.T = Tn;
  return c;
}

inline std::vector<double> randn(size_t n, uint64_t seed, double sd = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> dist(0.0, sd);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(g);
  return v;
}

inline std::vector<int32_t> rand_tokens(size_t n, int V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(g);
  return v;
}

template <class T>
std::vector<T> down(Ops<T>& ops, CPtr p, size_t n) {
  std::vector<T> h(n);
  ops.download(h.data(), p.as<T>(), n * sizeof(T));
  return h;
}

template <class T>
Buffer<T> up(Ops<T>& ops, const std::vector<T>& h) {
  Buffer<T> b(ops, h.size());
  ops.upload(b.data(), h.data(), h.size() * sizeof(T));
  return b;
}

// Index arrays (int32) in backend memory.
template <class T>
Buffer<T, int32_t> up_idx(Ops<T>& ops, const std::vector<int32_t>& h) {
  Buffer<T, int32_t> b(ops, h.size());
  ops.upload(b.data(), h.data(), h.size() * sizeof(int32_t));
  return b;
}

template <class A, class B>
double max_abs_diff(const A& a, const B& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

template <class A>
bool all_finite(const A& a) {
  for (const auto& x : a)
    if (!std::isfinite(double(x))) return false;
  return true;
}

template <class T>
std::vector<T> get_param(Model<T>& m, Ops<T>& ops, const std::string& name) {
  const ParamEntry& e = m.layout().find(name);
  return down(ops, m.params() + e.offset, e.size());
}

template <class T>
void set_param(Model<T>& m, Ops<T>& ops, const std::string& name, const std::vector<T>& v) {
  const ParamEntry& e = m.layout().find(name);
  ASSERT_EQ(v.size(), e.size()) << name;
  ops.upload(m.params() + e.offset, v.data(), v.size() * sizeof(T));
  m.refresh_weights();  // master changed: the weight copy GEMMs read follows
}

template <class T>
void set_phi_all(Model<T>& m, Ops<T>& ops, double phi) {
  for (int l = 0; l < m.config().L; ++l) set_param(m, ops, layer_param_name(l, "self_attn.ctx_gate_logit"), {T(phi)});
}

// y[N, out] = x[N, in] W[out, in]^T in double.
inline std::vector<double> matmul_t(const std::vector<double>& x, const double* W, int N, int in, int out, int ldw) {
  std::vector<double> y(size_t(N) * out, 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int i = 0; i < in; ++i) s += x[size_t(n) * in + i] * W[size_t(o) * ldw + i];
      y[size_t(n) * out + o] = s;
    }
  return y;
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// docs/model.md §2 WiolaRMSNorm of one row, by hand.
inline std::vector<double> rms_ref(const double* x, const double* g, const double* dl, int d, double eps,
                                   double* rstd = nullptr) {
  double ss = 0;
  for (int j = 0; j < d; ++j) ss += (x[j] + dl[j]) * (x[j] + dl[j]);
  const double r = 1.0 / std::sqrt(ss / d + eps);
  if (rstd) *rstd = r;
  std::vector<double> y(static_cast<size_t>(d));
  for (int j = 0; j < d; ++j) y[size_t(j)] = g[j] * (x[j] + dl[j]) * r;
  return y;
}

// One layer in double with the parameters of a Model (init std 0.02),
// driven through layer_forward directly.
struct LayerHarness {
  LayerHarness(const ModelConfig& c, int batch, uint64_t seed = 7)
      : ops(test_backend<double>()),
        cfg(c),
        B(batch),
        Tn(c.T),
        ld(c, ModelShard{}),
        model(*ops, c, ModelShard{}, nullptr, ModelOptions{batch, false, false}) {
    model.init(seed);
    srpe = up(*ops, srpe_table<double>(cfg, 0, Tn));
    proj = Buffer<double>(*ops, size_t(B) * Tn * size_t(qkvg_width(ld)));
  }
  // A LayerCtx with possibly different tau / atm flag (the model's
  // parameters do not depend on them).
  LayerCtx<double> ctx(const ModelConfig& c) const {
    return LayerCtx<double>{*ops, c, ld, nullptr, B, Tn, srpe.data(), ops->precision(), proj.data()};
  }
  size_t Nd() const { return size_t(B) * Tn * cfg.d; }
  const LayerParams& lp(int l) const { return model.p().layers[size_t(l)]; }

  std::unique_ptr<Ops<double>> ops;
  ModelConfig cfg;
  int B, Tn;
  LocalDims ld;
  Model<double> model;
  Buffer<double> srpe;
  mutable Buffer<double> proj;  // LayerCtx::proj (scratch, written through a const harness)
};

// Runs layer l; checks that nothing past the [N, d] output is written.
inline std::vector<double> run_layer(LayerHarness& h, const LayerCtx<double>& c, int l, const std::vector<double>& x,
                                     const std::vector<std::vector<double>>& ctx, bool training, LayerActs<double>& a) {
  Ops<double>& ops = *h.ops;
  const size_t nd = h.Nd(), guard = 16;
  EXPECT_EQ(x.size(), nd);
  Buffer<double> bx = up(ops, x);
  std::vector<Buffer<double>> bc;
  for (const auto& v : ctx) bc.push_back(up(ops, v));
  std::vector<CPtr> pc;
  for (const auto& b : bc) pc.push_back(b.data());
  std::vector<double> init(nd + guard, 4242.0);
  Buffer<double> out = up(ops, init);
  layer_forward(c, l, h.lp(l), bx.data(), pc.data(), int(pc.size()), training, a, out.data());
  std::vector<double> y = down(ops, out.data(), nd + guard);
  for (size_t i = nd; i < nd + guard; ++i) EXPECT_EQ(y[i], 4242.0) << "layer_forward wrote past [N, d] at " << i;
  y.resize(nd);
  return y;
}

}  // namespace wiola::paper
