// ProfiledOps (kernels/profiled_ops.h) between a model and its backend: the
// step computes exactly what the bare backend computes, and every op the step
// calls is counted under its class, with times that add up inside the step.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/profiled_ops.h"
#include "model/model.h"
#include "tests/model/backend_under_test.h"
#include "util/error.h"

namespace wiola {
namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.V = 64;
  c.d = 32;
  c.L = 4;
  c.H = 4;
  c.Hkv = 2;
  c.dA = 32;
  c.dB = 64;
  c.T = 24;
  c.Lambda = 2;
  c.tau = 0.2;
  return c;
}

std::vector<int32_t> tokens(size_t n, int V) {
  std::mt19937 rng(3);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % uint32_t(V));
  return t;
}

TEST(ProfiledOps, StepIsExactAndEveryOpIsCounted) {
  const ModelConfig c = small_config();
  const int B = 2;
  const auto tok = tokens(size_t(B) * (c.T + 1), c.V);
  auto bare = test_backend<double>();
  auto inner = test_backend<double>();
  ProfiledOps<double> prof(*inner);
  EXPECT_STREQ(prof.name(), inner->name());

  Model<double> a(*bare, c, ModelShard{}, nullptr, ModelOptions{B, false, false});
  Model<double> b(prof, c, ModelShard{}, nullptr, ModelOptions{B, false, false});
  a.init(5);
  b.init(5);
  a.zero_grads();
  b.zero_grads();
  const double la = a.train_micro_step(tok.data(), 1.0 / (B * c.T));
  prof.enable(true);
  const auto t0 = std::chrono::steady_clock::now();
  const double lb = b.train_micro_step(tok.data(), 1.0 / (B * c.T));
  prof.synchronize();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  prof.enable(false);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(download_vec(*bare, a.grads(), a.n_params()), download_vec(prof, b.grads(), b.n_params()));

  const OpProfile p = prof.profile();
  for (const char* cls :
       {"gemm", "attention", "context attention", "norm", "cross-entropy", "embedding", "elementwise", "copies", "ATM"})
    EXPECT_GT(p.class_seconds(cls), 0.0) << cls;
  double sum = 0;
  long gemm_calls = 0;
  for (const OpTime& o : p.ops) {
    sum += o.seconds;
    if (o.name == "gemm") gemm_calls = o.calls;
    EXPECT_GT(o.calls, 0) << o.name;
  }
  EXPECT_NEAR(sum, p.seconds, 1e-12);
  EXPECT_LE(p.seconds, wall);
  // Per layer: the fused Q|K|V|gate projection, 1 merged context K|V GEMM per summary, o_proj,
  // 5 DSFF and 2 fusion GEMMs forward; every one of them twice backward. Plus the LM head 1 + 2.
  long expect = 3;
  for (int l = 0; l < c.L; ++l) {
    const long fwd = 1 + c.n_ctx(l) + 1 + 5 + 2;
    expect += 3 * fwd;
  }
  EXPECT_EQ(gemm_calls, expect);
  const std::string table = format_op_profile(p, wall, 1, "  ");
  EXPECT_NE(table.find("gemm"), std::string::npos) << table;
  EXPECT_NE(table.find("(between ops)"), std::string::npos) << table;

  prof.reset();
  EXPECT_EQ(prof.profile().seconds, 0.0);  // nothing timed while disabled
  b.train_micro_step(tok.data(), 1.0);
  EXPECT_EQ(prof.profile().ops.size(), 0u);
}

TEST(ProfiledOps, OpClasses) {
  EXPECT_STREQ(op_class_of("gemm_strided_batched"), "gemm");
  EXPECT_STREQ(op_class_of("attention_bwd"), "attention");
  EXPECT_STREQ(op_class_of("ce_loss_grad"), "cross-entropy");
  EXPECT_STREQ(op_class_of("copy_block"), "copies");
  EXPECT_STREQ(op_class_of("swiglu_fwd"), "elementwise");
  EXPECT_STREQ(op_class_of("rmsnorm_bwd"), "norm");
  // A name that is no op of kernels/op_list.h is an error, not "elementwise".
  EXPECT_THROW(op_class_of("srpe_split"), Error);
}

}  // namespace
}  // namespace wiola
