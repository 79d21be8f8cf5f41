// The split backward (issue 37): a stage's backward as B (input gradients,
// the GCLA summaries' gradients, the norms, φ, the embedding lookup) and W
// (the layers' weight-gradient GEMMs, on operands kept in the slot). B then
// W, micro-batch by micro-batch, gives stage_backward's bits: on one stage
// and across a two-stage pipeline (the summaries cross the boundary), with
// and without recompute. W deferred behind later micro-batches (ZB-H1's
// order) changes only the order of the embedding's sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/params.h"
#include "tests/model/backend_under_test.h"
#include "util/error.h"

namespace wiola {
namespace {

// 6 layers, Λ 3 (every stage boundary carries summaries), ATM active.
ModelConfig split_config() {
  ModelConfig c;
  c.name = "split";
  c.d = 32; c.L = 6; c.H = 4; c.Hkv = 2; c.dA = 16; c.dB = 32; c.V = 40; c.T = 16;
  c.Lambda = 3; c.tau = 0.2;
  c.validate();
  return c;
}

std::vector<int32_t> tokens(size_t n, int V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(g() % uint64_t(V));
  return t;
}

ModelOptions options(bool recompute, bool split) {
  ModelOptions o;
  o.micro_batch = 1;
  o.recompute = recompute;
  o.slots = 2;
  o.split_backward = split;
  return o;
}

// Copy a list of boundary tensors (all [B, T, d] of one type) into another.
template <class T>
void pass(Ops<T>& ops, const std::vector<CPtr>& from, const std::vector<Ptr>& to, size_t bytes) {
  ASSERT_EQ(from.size(), to.size());
  for (size_t i = 0; i < from.size(); ++i) ops.copy(to[i].raw(), from[i].raw(), bytes);
}

template <class T>
std::vector<T> download_bytes(Ops<T>& ops, CPtr p, size_t bytes) {
  std::vector<T> h((bytes + sizeof(T) - 1) / sizeof(T));
  ops.download(h.data(), p.raw(), bytes);
  return h;
}

// A pipeline of stages [0, cut) and [cut, L) (cut = L: one stage) running
// `order` per micro-batch: "BW" (B then W), "whole" (stage_backward).
struct Pipeline {
  Ops<float>& ops;
  std::vector<std::unique_ptr<Model<float>>> stages;
  std::vector<std::vector<float>> sent_back;  // every backward message of stage 1, downloaded
  Pipeline(Ops<float>& o, const ModelConfig& c, int cut, const ModelOptions& opt) : ops(o) {
    if (cut == c.L) {
      stages.push_back(std::make_unique<Model<float>>(o, c, ModelShard{}, nullptr, opt));
    } else {
      stages.push_back(std::make_unique<Model<float>>(o, c, ModelShard{0, 1, 0, cut}, nullptr, opt));
      stages.push_back(std::make_unique<Model<float>>(o, c, ModelShard{0, 1, cut, -1}, nullptr, opt));
    }
    for (auto& s : stages) {
      s->init(5);
      s->zero_grads();
    }
  }
  size_t msg_bytes() const {
    const auto& c = stages[0]->config();
    return size_t(stages[0]->options().micro_batch) * c.T * c.d * dtype_bytes(stages[0]->boundary_dtype());
  }
  void forward(int slot, const int32_t* tok, double scale) {
    for (size_t s = 0; s < stages.size(); ++s) {
      if (s > 0) pass(ops, stages[s - 1]->fwd_out(slot), stages[s]->fwd_in(slot), msg_bytes());
      stages[s]->stage_forward(slot, tok, scale, true);
    }
  }
  // split: B only (W later, weight()); else the whole backward.
  void backward(int slot, bool split) {
    for (size_t s = stages.size(); s-- > 0;) {
      if (s + 1 < stages.size()) pass(ops, stages[s + 1]->bwd_out(), stages[s]->bwd_in(), msg_bytes());
      if (split) stages[s]->stage_backward_input(slot, slot);
      else stages[s]->stage_backward(slot);
      if (s == 1)
        for (CPtr t : stages[s]->bwd_out()) sent_back.push_back(download_bytes(ops, t, msg_bytes()));
    }
  }
  void weight(int slot) {
    for (auto& s : stages) s->stage_backward_weight(slot, slot);
  }
  std::vector<float> grads(size_t s) { return download_vec(ops, stages[s]->grads(), stages[s]->n_params()); }
  double loss() { return stages.back()->take_loss_sum(); }
};

constexpr int kMicro = 3;

TEST(ModelSplitBackward, BThenWIsTheWholeBackwardBitForBit) {
  const ModelConfig c = split_config();
  auto ops = test_backend<float>();
  const auto tok = tokens(size_t(kMicro) * (c.T + 1), c.V, 11);
  const double scale = 1.0 / (kMicro * c.T);
  for (bool recompute : {false, true})
    for (int cut : {c.L, 3}) {
      SCOPED_TRACE(testing::Message() << "recompute " << recompute << " stages cut at " << cut);
      Pipeline whole(*ops, c, cut, options(recompute, false)), split(*ops, c, cut, options(recompute, true));
      for (int i = 0; i < kMicro; ++i) {  // 1F1B-like reuse of the two slots
        const int32_t* t = tok.data() + size_t(i) * (c.T + 1);
        whole.forward(i % 2, t, scale);
        whole.backward(i % 2, false);
        split.forward(i % 2, t, scale);
        split.backward(i % 2, true);
        split.weight(i % 2);
      }
      EXPECT_EQ(whole.loss(), split.loss());
      EXPECT_EQ(whole.sent_back, split.sent_back);  // residual and summary gradients into stage 0
      for (size_t s = 0; s < whole.stages.size(); ++s) EXPECT_EQ(whole.grads(s), split.grads(s)) << "stage " << s;
    }
}

TEST(ModelSplitBackward, DeferredWeightGradientsOnlyReorderTheEmbeddingSums) {
  // ZB-H1's order on one stage: F0 F1 B0 B1 W0 W1 against F0 B0 F1 B1.
  const ModelConfig c = split_config();
  auto ops = test_backend<float>();
  const auto tok = tokens(size_t(2) * (c.T + 1), c.V, 12);
  const double scale = 1.0 / (2 * c.T);
  const int32_t* t1 = tok.data() + (c.T + 1);
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(testing::Message() << "recompute " << recompute);
    Pipeline whole(*ops, c, c.L, options(recompute, false)), zb(*ops, c, c.L, options(recompute, true));
    whole.forward(0, tok.data(), scale);
    whole.backward(0, false);
    whole.forward(1, t1, scale);
    whole.backward(1, false);
    zb.forward(0, tok.data(), scale);
    zb.forward(1, t1, scale);
    zb.backward(0, true);
    zb.backward(1, true);
    zb.weight(0);
    zb.weight(1);
    EXPECT_EQ(whole.loss(), zb.loss());
    const auto gw = whole.grads(0), gz = zb.grads(0);
    const ParamLayout& lay = whole.stages[0]->layout();
    double scale_g = 0;
    for (float x : gw) scale_g = std::max(scale_g, double(std::abs(x)));
    for (const ParamEntry& e : lay.entries()) {
      const bool embed = e.name.find("embed") != std::string::npos;
      for (size_t j = e.offset; j < e.offset + e.span; ++j) {
        if (embed) ASSERT_NEAR(gw[j], gz[j], 1e-6 * scale_g) << e.name;
        else ASSERT_EQ(gw[j], gz[j]) << e.name << " element " << j - e.offset;
      }
    }
  }
}

TEST(ModelSplitBackward, MemoryPlannedAndOptionRequired) {
  const ModelConfig c = split_config();
  auto ops = test_backend<float>();
  for (bool recompute : {false, true}) {
    Model<float> plain(*ops, c, ModelShard{0, 1, 2, 5}, nullptr, options(recompute, false));
    Model<float> split(*ops, c, ModelShard{0, 1, 2, 5}, nullptr, options(recompute, true));
    const auto got = split.memory();
    const auto want = Model<float>::plan_memory(*ops, c, ModelShard{0, 1, 2, 5}, options(recompute, true),
                                                ops->precision());
    EXPECT_EQ(got.activations, want.activations);
    EXPECT_EQ(got.workspace, want.workspace);
    EXPECT_GT(split.activation_bytes(), plain.activation_bytes());
    EXPECT_THROW(plain.stage_backward_input(0, 0), Error);
    EXPECT_THROW(plain.stage_backward_weight(0, 0), Error);
    EXPECT_THROW(split.stage_backward_input(0, 2), Error);  // two weight slots (one per slot)
    // One weight slot: the operands of one micro-batch between B and W.
    ModelOptions one = options(recompute, true);
    one.weight_slots = 1;
    Model<float> lean(*ops, c, ModelShard{0, 1, 2, 5}, nullptr, one);
    EXPECT_EQ(lean.memory().activations,
              Model<float>::plan_memory(*ops, c, ModelShard{0, 1, 2, 5}, one, ops->precision()).activations);
    EXPECT_LT(lean.activation_bytes(), split.activation_bytes());
    EXPECT_GT(lean.activation_bytes(), plain.activation_bytes());
  }
}

}  // namespace
}  // namespace wiola
