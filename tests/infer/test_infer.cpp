// Sampling, batched KV-cached generation and windowed evaluation on a small
// random model: batching without padding gives each prompt what it gets
// alone, greedy decoding equals the full forward's argmax, stops (eos, max
// new tokens, context) and bad prompts, and the two evaluation paths agree.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <vector>

#include "infer/evaluate.h"
#include "infer/generate.h"
#include "infer/sampling.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "util/error.h"

namespace wiola::infer {
namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.name = "infer-test";
  c.d = 32;
  c.L = 3;
  c.H = 4;
  c.Hkv = 2;
  c.dA = 16;
  c.dB = 64;
  c.V = 40;
  c.T = 12;
  c.init_std = 0.5;  // clear argmaxes: few near-ties for the greedy checks
  return c;
}

struct Fixture {
  std::unique_ptr<Ops<float>> ops = make_backend<float>("cpu");
  Model<float> model;
  // eos >= 0: documents (ModelOptions::documents_eos).
  Fixture(int B, const ModelConfig& c = small_config(), int32_t eos = -1)
      : model(*ops, c, ModelShard{}, nullptr, options(B, eos)) {
    model.init(11);
    model.refresh_weights();
  }
  static ModelOptions options(int B, int32_t eos) {
    ModelOptions o{B, false, false};
    o.documents_eos = eos;
    return o;
  }
};

std::vector<float> row(std::initializer_list<float> v) { return v; }

TEST(Sampling, GreedyIsArgmaxLowestOnTie) {
  const auto l = row({0.5f, 2.0f, 2.0f, -1.0f});
  EXPECT_EQ(argmax(l.data(), 4), 1);
  SamplingOptions o;
  o.temperature = 0;
  EXPECT_EQ(sample_token(l.data(), 4, o, 0, 0), 1);
  o.temperature = 1;
  o.top_k = 1;
  for (uint64_t p = 0; p < 50; ++p) EXPECT_EQ(sample_token(l.data(), 4, o, 3, p), 1);
  o.top_k = 0;
  o.top_p = 1e-6;  // the nucleus keeps one id
  for (uint64_t p = 0; p < 50; ++p) EXPECT_EQ(sample_token(l.data(), 4, o, 3, p), 1);
}

TEST(Sampling, FrequenciesFollowTheTemperedSoftmax) {
  const auto l = row({1.0f, 0.0f, -1.0f, 2.0f});
  SamplingOptions o;
  o.temperature = 2.0;
  o.seed = 5;
  std::vector<double> want(4);
  double z = 0;
  for (int v = 0; v < 4; ++v) z += want[size_t(v)] = std::exp(l[size_t(v)] / 2.0);
  std::vector<int> count(4);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[size_t(sample_token(l.data(), 4, o, uint64_t(i % 7), uint64_t(i)))];
  for (int v = 0; v < 4; ++v) {
    const double p = want[size_t(v)] / z, sd = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(double(count[size_t(v)]) / n, p, 5 * sd) << "id " << v;
  }
  // top-p 0.6: the two most likely ids (0.44 + 0.27 >= 0.6) and nothing else.
  o.top_p = 0.6;
  for (int i = 0; i < 2000; ++i) {
    const int32_t id = sample_token(l.data(), 4, o, 0, uint64_t(i));
    EXPECT_TRUE(id == 3 || id == 0) << id;
  }
}

TEST(Sampling, CounterBasedAndValidated) {
  const auto l = row({0.1f, 0.2f, 0.3f, 0.4f, 0.5f});
  SamplingOptions a, b;
  a.seed = b.seed = 9;
  for (uint64_t p = 0; p < 20; ++p) EXPECT_EQ(sample_token(l.data(), 5, a, 2, p), sample_token(l.data(), 5, b, 2, p));
  b.seed = 10;
  int same = 0;
  for (uint64_t p = 0; p < 200; ++p) same += sample_token(l.data(), 5, a, 2, p) == sample_token(l.data(), 5, b, 2, p);
  EXPECT_LT(same, 150);
  for (uint64_t p = 0; p < 1000; ++p) {
    const double u = counter_uniform(1, 2, p);
    EXPECT_TRUE(u >= 0 && u < 1);
  }
  SamplingOptions bad;
  bad.temperature = -1;
  EXPECT_THROW(bad.validate(), Error);
  bad = {};
  bad.top_p = 0;
  EXPECT_THROW(bad.validate(), Error);
  bad = {};
  bad.top_k = -2;
  EXPECT_THROW(bad.validate(), Error);
}

// Prompts of different lengths in one batch: each continuation equals the
// same prompt decoded alone, and greedy tokens equal the full forward's argmax.
TEST(Generate, BatchedWithoutPaddingEqualsAlone) {
  const std::vector<std::vector<int32_t>> prompts = {{3, 7, 1}, {5}, {9, 2, 4, 4, 8}};
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_new_tokens = 5;
  Fixture batch(3);
  const auto out = generate(batch.model, prompts, o);
  ASSERT_EQ(out.size(), 3u);
  Fixture one(1);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto alone = generate(one.model, {prompts[b]}, o);
    EXPECT_EQ(out[b].tokens, alone[0].tokens) << "prompt " << b;
    EXPECT_EQ(out[b].tokens.size(), 5u);
    EXPECT_EQ(out[b].stop, StopReason::MaxNewTokens);
  }
  const GreedyCheck c = check_greedy(batch.model, prompts, out);
  EXPECT_EQ(c.positions, 15);
  EXPECT_EQ(c.differ, 0) << c.first_difference;
  EXPECT_EQ(c.equal + c.exempt, 15);
  // Sampling: also batch-independent (counter-based random numbers).
  o.sampling = {0.9, 0, 1.0, 4};
  const auto s = generate(batch.model, prompts, o);
  for (size_t b = 0; b < prompts.size(); ++b) {
    GenerateOptions alone = o;
    alone.first_index = b;
    EXPECT_EQ(s[b].tokens, generate(one.model, {prompts[b]}, alone)[0].tokens) << "prompt " << b;
  }
}

// A greedy check that can fail: a token the full forward would not choose.
TEST(Generate, GreedyCheckCatchesAWrongToken) {
  Fixture f(1);
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_new_tokens = 4;
  auto out = generate(f.model, {{1, 2}}, o);
  out[0].tokens[2] = (out[0].tokens[2] + 1) % f.model.config().V;
  const GreedyCheck c = check_greedy(f.model, {{1, 2}}, out);
  EXPECT_GE(c.differ + c.exempt, 1);
  if (c.exempt == 0) {
    EXPECT_NE(c.first_difference.find("position 4"), std::string::npos) << c.first_difference;
  }
}

TEST(Generate, StopsAtEosAndAtTheContext) {
  Fixture f(2);
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_new_tokens = 100;
  // The first greedy token of prompt {1} becomes the eos: it stops after one.
  const auto first = generate(f.model, {{1}, {2}}, o);
  o.eos_id = first[0].tokens[0];
  const auto e = generate(f.model, {{1}, {2}}, o);
  EXPECT_EQ(e[0].stop, StopReason::Eos);
  EXPECT_EQ(e[0].tokens.size(), 1u);
  o.eos_id = -1;
  // T = 12: a sequence holds at most T + 1 tokens.
  const std::vector<int32_t> full(12, 3);
  const auto c = generate(f.model, {full, {4, 5}}, o);
  EXPECT_EQ(c[0].stop, StopReason::Context);
  EXPECT_EQ(c[0].tokens.size(), 1u);
  EXPECT_EQ(c[1].stop, StopReason::Context);
  EXPECT_EQ(c[1].tokens.size(), 11u);
  o.max_new_tokens = 0;
  const auto z = generate(f.model, {{1}, {2}}, o);
  EXPECT_TRUE(z[0].tokens.empty());
}

TEST(Generate, BadPromptsAreErrors) {
  Fixture f(1);
  GenerateOptions o;
  EXPECT_THROW(generate(f.model, {{}}, o), Error);                           // empty
  EXPECT_THROW(generate(f.model, {std::vector<int32_t>(13, 1)}, o), Error);  // longer than T
  EXPECT_THROW(generate(f.model, {{1, 99}}, o), Error);                      // id outside V
  EXPECT_THROW(generate(f.model, {{1}, {2}}, o), Error);                     // batch mismatch
}

// Full windows go through the model's loss, short ones through logits and a
// host cross-entropy: both score the same window alike; with documents
// (docs/model.md §2) both leave out the targets of EOS inputs.
TEST(Evaluate, FullAndTailPathsAgree) {
  for (const int32_t eos : {-1, 3}) {
    const ModelConfig c = small_config();
    Fixture f(2, c, eos);
    std::mt19937 g(4);
    std::vector<std::vector<int32_t>> w(3, std::vector<int32_t>(size_t(c.T) + 1));
    for (auto& x : w)
      for (auto& t : x) t = int32_t(g() % uint32_t(c.V - 4)) + 4;  // no id 3 but where placed
    int masked = 0;                                                // EOS inputs in windows 0 and 1, and in window 2
    if (eos >= 0) {
      w[0][1] = w[0][2] = w[1][5] = w[2][0] = 3;
      masked = 3;
    }
    const WindowSource src = [&](int64_t i, int32_t* out) {
      std::copy(w[size_t(i)].begin(), w[size_t(i)].end(), out);
      return c.T + 1;
    };
    const EvalTotals two = evaluate_windows(f.model, 2, src);  // one full batch
    EXPECT_EQ(two.targets, 2 * c.T - masked);
    std::vector<int32_t> tok;
    for (int i = 0; i < 2; ++i) tok.insert(tok.end(), w[size_t(i)].begin(), w[size_t(i)].end());
    EXPECT_EQ(two.loss_sum, f.model.eval_loss(tok.data()));
    const EvalTotals three = evaluate_windows(f.model, 3, src);  // + a half-empty batch
    EXPECT_EQ(three.windows, 3);
    EXPECT_EQ(three.targets, 3 * c.T - masked - (eos >= 0));
    tok.assign(w[2].begin(), w[2].end());
    tok.insert(tok.end(), w[2].begin(), w[2].end());
    const double third = f.model.eval_loss(tok.data()) / 2;
    EXPECT_NEAR(three.loss_sum - two.loss_sum, third, 1e-5 * third);
    // A short tail window scores only its real targets.
    const WindowSource shorter = [&](int64_t, int32_t* out) {
      std::copy_n(w[0].begin(), 5, out);
      return 5;
    };
    const EvalTotals t = evaluate_windows(f.model, 1, shorter);
    EXPECT_EQ(t.targets, eos >= 0 ? 2 : 4);
    EXPECT_GT(t.loss_sum, 0);
    EXPECT_NEAR(t.perplexity(), std::exp(t.loss_sum / double(t.targets)), 1e-9);
  }
}

TEST(Evaluate, NpyHeader) {
  const std::string path = std::string(WIOLA_BINARY_DIR) + "/infer_test.npy";
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  write_npy(path, v.data(), {2, 3});
  std::ifstream in(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(s.size(), 10u);
  const size_t data = 10 + (uint8_t(s[8]) | size_t(uint8_t(s[9])) << 8);  // magic, version, length, header
  EXPECT_EQ(data % 64, 0u);
  ASSERT_EQ(s.size(), data + 24);
  EXPECT_EQ(s.substr(1, 5), "NUMPY");
  EXPECT_NE(s.find("'shape': (2, 3), }"), std::string::npos);
  EXPECT_EQ(s[data - 1], '\n');
  float back[6];
  std::memcpy(back, s.data() + data, sizeof back);
  EXPECT_EQ(back[5], 6.0f);
}

}  // namespace
}  // namespace wiola::infer
