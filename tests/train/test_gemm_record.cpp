// The record of the run's GEMM choices (train/gemm_record.h): what the run
// report and each checkpoint manifest say the matrix products ran, and how
// a resume tells that it computes otherwise than the checkpoint's run.
#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "kernels/gemm_tuning.h"
#include "kernels/ops.h"
#include "train/gemm_record.h"

namespace wiola {
namespace {

// A record of the auto mode whose table (key `device`) holds `choices`.
nlohmann::json auto_record(const std::string& device, const std::map<std::string, GemmChoice>& choices) {
  const std::string text = gemm_tuning_json(GemmTable{device, choices});
  nlohmann::json r = {
      {"mode", "auto"},         {"device", "NVIDIA H100 80GB HBM3"},   {"default", "cublas default"},
      {"table_device", device}, {"choices", nlohmann::json::object()}, {"tuning", nlohmann::json::parse(text)}};
  for (const auto& [k, c] : choices) r["choices"][k] = c.algo;
  return r;
}

GemmChoice lt(uint64_t word) {
  GemmChoice c;
  c.algo = "cublaslt";
  c.lt_algo = {word, 0, 0, 0, 0, 0, 0, 0};
  c.config = "id " + std::to_string(word);
  return c;
}

TEST(GemmRecord, CpuBackendHasNoChoice) {
  auto ops = make_backend<float>("cpu");
  BackendOptions o;
  o.gemm = GemmMode::Auto;  // a CPU backend records no choice whatever the option says
  const nlohmann::json r = gemm_record(*ops, o);
  EXPECT_EQ(r["mode"], "none");
  EXPECT_TRUE(r["choices"].empty());
  EXPECT_TRUE(r["tuning"].is_null());
  EXPECT_EQ(r["table_device"], "");
  EXPECT_NE(r["default"].get<std::string>().find("no choice"), std::string::npos);
  EXPECT_EQ(gemm_record_difference(r, gemm_record(*make_backend<float>("cpu-opaque"), o)), "");
  EXPECT_EQ(gemm_record_difference(nullptr, r), "");  // a checkpoint from before the record
}

TEST(GemmRecord, DifferencesThatChangeTheBits) {
  const std::string dev = "NVIDIA H100 80GB HBM3, sm_90, cuBLASLt 130100";
  const std::string k1 = "NT 8192x1024x1024 ld 1024/1024/1024 bf16>bf16 beta0 align256";
  const std::string k2 = "TN 1024x1024x8192 ld 1024/1024/1024 bf16>f32 beta1 align256";
  const nlohmann::json a = auto_record(dev, {{k1, lt(7)}, {k2, GemmChoice{}}});
  EXPECT_EQ(gemm_record_difference(a, auto_record(dev, {{k1, lt(7)}, {k2, GemmChoice{}}})), "");
  // Another cuBLASLt algorithm for one shape: named.
  std::string d = gemm_record_difference(a, auto_record(dev, {{k1, lt(9)}, {k2, GemmChoice{}}}));
  EXPECT_NE(d.find(k1), std::string::npos) << d;
  EXPECT_EQ(d.find(k2), std::string::npos) << d;
  // A shape the run now has no choice for (it would run cublasGemmEx).
  d = gemm_record_difference(a, auto_record(dev, {{k2, GemmChoice{}}}));
  EXPECT_NE(d.find(k1), std::string::npos) << d;
  // Another card or library version: the table key.
  d = gemm_record_difference(a, auto_record("NVIDIA H200, sm_90, cuBLASLt 130100", {{k1, lt(7)}}));
  EXPECT_NE(d.find("NVIDIA H200"), std::string::npos) << d;
  // Another mode.
  nlohmann::json c = a;
  c["mode"] = "cublas";
  c["tuning"] = nullptr;
  d = gemm_record_difference(a, c);
  EXPECT_NE(d.find("mode auto then, cublas now"), std::string::npos) << d;
  // The same non-tuning mode on another device.
  nlohmann::json e = c;
  e["device"] = "NVIDIA A100-SXM4-80GB";
  d = gemm_record_difference(c, e);
  EXPECT_NE(d.find("A100"), std::string::npos) << d;
  EXPECT_EQ(gemm_record_difference(c, c), "");
}

}  // namespace
}  // namespace wiola
