// The model in the GPU's bf16 precision mode, on the cpu-bf16 debug backend
// (kernels/cpu/bf16_storage_ops.h): bf16 activations and weight copies, fp32
// residual stream and master weights. The checks the GPU suite makes of the
// cuda backend (tests/gpu/cuda_model_test.cpp, CudaModel.*; shared code in
// precision_checks.h), here in CI: a short bf16 training run tracks the fp32
// one, cached decoding in bf16 equals the full bf16 forward, and ATM's
// decisions flip only near tau.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "tests/model/precision_checks.h"
#include "util/error.h"

namespace wiola {
namespace {

// wiola-tiny widened to head dim 32, as the GPU tests (shorter sequences:
// cpu-bf16's shadows make every op a few times slower than on cpu).
ModelConfig tiny_config() {
  ModelConfig c = model_preset("wiola-tiny");
  c.d = 128;
  c.dA = 128;
  c.dB = 512;
  c.T = 64;
  return c;
}

std::vector<int32_t> tokens(size_t n, uint64_t seed) {
  std::mt19937_64 rg(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rg() % 64);  // a small vocabulary is learnable in 30 steps
  return t;
}

checks::MakeOps backend(const char* name) {
  return [name] { return make_backend<float>(name); };
}

// These tests choose their backends; ctest's second pass of the suite on
// another backend (WIOLA_TEST_BACKEND=cpu-opaque) has nothing to add.
#define ONLY_ON_THE_DEFAULT_PASS() \
  do { \
    const char* b = std::getenv("WIOLA_TEST_BACKEND"); \
    if (b && *b && std::string(b) != "cpu") GTEST_SKIP() << "runs on the cpu pass only"; \
  } while (0)

TEST(Bf16Storage, BackendReportsTheGpuBf16Mode) {
  auto ops = make_backend<float>("cpu-bf16");
  const Precision p = ops->precision();
  EXPECT_EQ(p.act, DType::BF16);
  EXPECT_EQ(p.residual, DType::F32);
  EXPECT_EQ(p.weight, DType::BF16);
  EXPECT_TRUE(p.separate_weights);
  EXPECT_STREQ(ops->name(), "cpu-bf16");
  EXPECT_THROW(make_backend<double>("cpu-bf16"), Error);
}

// 30 steps from the same init and data: every loss within 5 % of fp32's,
// and both curves go down by a tenth.
TEST(Bf16Storage, TrainingTracksFp32) {
  ONLY_ON_THE_DEFAULT_PASS();
  const ModelConfig c = tiny_config();
  const int B = 2, steps = 30;
  const auto tok = tokens(size_t(B) * (c.T + 1) * steps, 9);
  const auto f = checks::training_losses(backend("cpu"), c, B, steps, tok);
  const auto h = checks::training_losses(backend("cpu-bf16"), c, B, steps, tok);
  double worst = 0;
  for (int s = 0; s < steps; ++s) worst = std::max(worst, std::abs(f[s] - h[s]) / f[s]);
  std::printf("  loss fp32 %.4f -> %.4f, bf16 %.4f -> %.4f; worst step rel diff %.2e\n", f.front(), f.back(), h.front(),
              h.back(), worst);
  EXPECT_LT(f.back(), 0.9 * f.front());
  EXPECT_LT(h.back(), 0.9 * h.front());
  EXPECT_LT(worst, 0.05);
  EXPECT_GT(worst, 0.0);  // bf16 storage is in effect: the runs are not the same
}

// The KV cache holds bf16 keys and values: decoding in chunks of 5 gives the
// full forward's logits up to bf16 rounding of activations whose GEMMs saw
// other row counts.
TEST(Bf16Storage, CachedDecodingMatchesFullForward) {
  ONLY_ON_THE_DEFAULT_PASS();
  auto ops = make_backend<float>("cpu-bf16");
  double mag = 0;
  const double d = checks::cached_decoding_diff(*ops, model_preset("wiola-tiny"), &mag);
  std::printf("  cached decoding in bf16: max |logit diff| %.2e (max |logit| %.2e)\n", d, mag);
  EXPECT_LT(d, 2e-2 * mag);
}

// ATM's merge decisions in bf16 against fp32 from the same parameters and
// tokens: X-tilde is kept in fp32, so only upstream bf16 rounding can flip a
// pair near tau. The rate is printed; the bound only catches a broken path.
TEST(Bf16Storage, AtmFlipRate) {
  ONLY_ON_THE_DEFAULT_PASS();
  ModelConfig c = tiny_config();
  c.tau = 0.5;  // merges in the ATM layers
  const int B = 4;
  const auto tok = tokens(size_t(B) * (c.T + 1), 11);
  const checks::Flips r = checks::count_flips(checks::atm_decisions(backend("cpu"), c, B, tok),
                                              checks::atm_decisions(backend("cpu-bf16"), c, B, tok));
  std::printf("  ATM decisions bf16 vs fp32: %zu of %zu flipped (%.3f %%); fp32 opened %zu merges\n", r.flips, r.total,
              r.total ? 100.0 * double(r.flips) / double(r.total) : 0.0, r.merges);
  ASSERT_TRUE(r.same_shape);
  EXPECT_GT(r.merges, 0u);
  EXPECT_LT(double(r.flips), 0.1 * double(r.total));
}

}  // namespace
}  // namespace wiola
