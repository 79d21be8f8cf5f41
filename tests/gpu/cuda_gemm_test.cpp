// The CUDA backend's GEMMs and conversions (kernels/cuda/cublas_lib.cu,
// gemm_lt.cu, gemm_tuner.cu, memory.cu) against the CPU backend and against
// cuBLAS, the tuning table's round trip, and the backend options' refusals
// (kernels/backend_options.h).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "kernels/gemm_tuning.h"
#include "util/error.h"
#include "tests/gpu/cuda_test_util.h"

namespace wiola {
namespace {

using namespace cuda_test;

TEST(CudaOps, GemmAndConvert) {
  REQUIRE_GPU();
  const int m = 70, n = 45, k = 33;
  const Vec a = randn(size_t(m) * k, 30), b = randn(size_t(n) * k, 31), c0 = randn(size_t(m) * n, 32);
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T})
      same_on_gpu("gemm", 2e-6, [&](Ops<float>& o) {
        OnBackend r(o);
        const int lda = ta == Trans::N ? k : m, ldb = tb == Trans::N ? n : k;
        float *A = r.in(a), *B = r.in(b), *C = r.in(c0);
        o.gemm(ta, tb, m, n, k, 0.7f, A, lda, B, ldb, 0.3f, C, n);
        return std::vector<Vec>{r.out(C, c0.size())};
      });
  // A column block between row lengths (the fused projection's split and join): exact.
  same_on_gpu("copy_block", 1e-30, [&](Ops<float>& o) {
    OnBackend r(o);
    float *A = r.in(a), *C = r.in(c0);
    o.copy_block(Ptr(C) + 3, n, CPtr(A) + 2, k, m, 20);
    return std::vector<Vec>{r.out(C, c0.size())};
  });
  // fp32 -> bf16 -> fp32 rounds to 8 significant bits.
  auto gpu = make_cuda_ops(CudaPrecision::BF16);
  Buffer<float> src(*gpu, a.size()), back(*gpu, a.size());
  DynBuffer<float> half(*gpu, DType::BF16, a.size());
  gpu->upload(src.data(), a.data(), src.bytes());
  gpu->convert(src.data(), half.data(), a.size());
  gpu->convert(half.data(), back.data(), a.size());
  Vec h(a.size());
  gpu->download(h.data(), back.data(), back.bytes());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(h[i], a[i], std::abs(a[i]) * 0.0079 + 1e-30);
}

// ---- the backend options and the GEMM paths (kernels/backend_options.h,
// kernels/cuda/gemm_tuner.cuh) -------------------------------------------------------

// An old switch still set is refused with the key that replaced it. (The
// options are enums: a value they do not name is refused where the text is
// read, the run config (RunConfigTest.BackendOptionValuesAreChecked) and the
// benchmarks' flags.)
TEST(CudaOps, BackendOptionsRefuseOldVariables) {
  REQUIRE_GPU();
  setenv("WIOLA_CUDA_ATTENTION", "rows", 1);
  try {
    make_cuda_ops(CudaPrecision::BF16);
    ADD_FAILURE() << "WIOLA_CUDA_ATTENTION was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.cuda_attention"), std::string::npos) << e.what();
  }
  unsetenv("WIOLA_CUDA_ATTENTION");
  // Against the model: the heads a block must divide n_heads / n_kv_heads.
  check_attention_heads_per_block({.attention_heads_per_block = HeadsPerBlock::Four}, 16, 4);
  try {
    check_attention_heads_per_block({.attention_heads_per_block = HeadsPerBlock::Four}, 16, 8);
    ADD_FAILURE() << "attention_heads_per_block = 4 with 16 / 8 heads was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be 1 or divide the query heads of a KV group, model.n_heads / "
                                         "model.n_kv_heads = 16 / 8 (got 4)"),
              std::string::npos)
        << e.what();
  }
}

// One GEMM of every kind the backend issues (transposes NT, NN, TN; bf16
// operands into bf16 or fp32, fp32 into fp32; beta 0 and 1), by each value
// of the option gemm: cublaslt and auto (its sweep, then its choice once
// adopted) against cublas. The emulator computes every path alike: the same
// bits; on a GPU within the tuner's own tolerance.
TEST(CudaOps, GemmPathsMatchCublas) {
  REQUIRE_GPU();
  auto gpu = make_cuda_ops(CudaPrecision::BF16);
  const int m = 70, n = 48, k = 96;
  const Vec a = randn(size_t(m) * k, 70), b = randn(size_t(k) * n, 71), c0 = randn(size_t(m) * n, 72);
  Buffer<float> a32(*gpu, a.size()), b32(*gpu, b.size()), c32(*gpu, c0.size());
  gpu->upload(a32.data(), a.data(), a32.bytes());
  gpu->upload(b32.data(), b.data(), b32.bytes());
  DynBuffer<float> a16(*gpu, DType::BF16, a.size()), b16(*gpu, DType::BF16, b.size()), c(*gpu, DType::F32, c0.size());
  gpu->convert(a32.data(), a16.data(), a.size());
  gpu->convert(b32.data(), b16.data(), b.size());
  for (auto [ta, tb] : {std::pair{Trans::N, Trans::T}, std::pair{Trans::N, Trans::N}, std::pair{Trans::T, Trans::N}})
    for (auto [ab, ct] :
         {std::pair{DType::BF16, DType::BF16}, std::pair{DType::BF16, DType::F32}, std::pair{DType::F32, DType::F32}})
      for (float beta : {0.f, 1.f}) {
        const int lda = ta == Trans::N ? k : m, ldb = tb == Trans::N ? n : k;
        const CPtr A = ab == DType::F32 ? CPtr(a32.data()) : a16.data(),
                   B = ab == DType::F32 ? CPtr(b32.data()) : b16.data();
        auto run = [&](GemmMode path, int times) {
          set_cuda_backend_options(*gpu, {.gemm = path});
          Vec out;
          for (int t = 0; t < times; ++t) {
            gpu->upload(c32.data(), c0.data(), c32.bytes());
            const Ptr C = ct == DType::F32 ? Ptr(c.data()) : Ptr(c.data().raw(), DType::BF16);
            gpu->convert(c32.data(), C, c0.size());
            gpu->gemm(ta, tb, m, n, k, 0.5f, A, lda, B, ldb, beta, C, n);
            if (t == 0 && path == GemmMode::Auto) gpu->adopt_gemm_tuning(gpu->gemm_tuning());
            out = ct == DType::F32 ? Vec(c0.size()) : bf16_download(*gpu, C, c0.size());
            if (ct == DType::F32) gpu->download(out.data(), c.data().raw(), c32.bytes());
          }
          return out;
        };
        const Vec ref = run(GemmMode::Cublas, 1), lt = run(GemmMode::Cublaslt, 1), tuned = run(GemmMode::Auto, 2);
        const std::string what = std::string(ta == Trans::T ? "T" : "N") + (tb == Trans::T ? "T " : "N ") +
                                 dtype_name(ab) + ">" + dtype_name(ct) + " beta " + std::to_string(int(beta));
#ifdef WIOLA_CUDA_EMU
        EXPECT_EQ(lt, ref) << what;
        EXPECT_EQ(tuned, ref) << what;
#else
        const double tol = ct == DType::F32 ? 1e-4 : 1e-2;
        EXPECT_LT(rel(ref, lt), tol) << what;
        EXPECT_LT(rel(ref, tuned), tol) << what;
#endif
      }
  set_cuda_backend_options(*gpu, {});
}

// The tuning table: what the backend measured round-trips through its text
// and is taken back unchanged; a table for another device or library
// version is ignored (with a message) and changes nothing; two backends
// given the same table make the same choice for the same GEMM; and (on the
// emulator, whose candidate 0 computes wrong with WIOLA_EMU_LT_WRONG_ALGO=0)
// a choice that fails its check against cublasGemmEx never wins.
TEST(CudaOps, GemmTuningTable) {
  REQUIRE_GPU();
#ifdef WIOLA_CUDA_EMU
  setenv("WIOLA_EMU_LT_WRONG_ALGO", "0", 1);
#endif
  auto sweep = [&] {
    auto gpu = make_cuda_ops(CudaPrecision::BF16, 0, {.gemm = GemmMode::Auto});
    const int m = 64, n = 32, k = 4096;  // few output tiles, deep: split-K candidates
    DynBuffer<float> A(*gpu, DType::BF16, size_t(k) * m), B(*gpu, DType::BF16, size_t(k) * n),
        C(*gpu, DType::F32, size_t(m) * n);
    Buffer<float> tmp(*gpu, size_t(k) * m);
    const Vec h = randn(size_t(k) * m, 80);
    gpu->upload(tmp.data(), h.data(), tmp.bytes());
    gpu->convert(tmp.data(), A.data(), A.size());
    gpu->convert(tmp.data(), B.data(), B.size());
    gpu->zero(C.data().raw(), C.bytes());
    gpu->gemm(Trans::T, Trans::N, m, n, k, 1.f, A.data(), m, B.data(), n, 1.f, C.data(), n);
    gpu->synchronize();
    return gpu->gemm_tuning();
  };
  const std::string text = sweep();
  const auto file = nlohmann::json::parse(text);
  ASSERT_EQ(file["tables"].size(), 1u) << text;
  const std::string device = file["tables"][0]["device"];
  const GemmTable t = gemm_table_for(text, device, "test");
  ASSERT_EQ(t.choices.size(), 1u) << text;
  const GemmChoice& won = t.choices.begin()->second;
  EXPECT_GT(won.us, 0) << text;
  EXPECT_GE(won.tried.size(), 2u) << text;
#ifdef WIOLA_CUDA_EMU
  EXPECT_NE(won.config.rfind("id 0 ", 0), 0u) << "the wrong candidate won: " << text;
  bool rejected = false, split = false;
  for (const auto& c : won.tried) {
    rejected = rejected || (c.rfind("cublaslt id 0 ", 0) == 0 && c.find("rejected") != std::string::npos);
    split = split || c.find("splitk 4") != std::string::npos;
  }
  EXPECT_TRUE(rejected) << text;
  EXPECT_TRUE(split) << text;
  unsetenv("WIOLA_EMU_LT_WRONG_ALGO");
#endif
  // Round trip: the text read back is the same table; merged into a file
  // with another device's table, each device finds its own.
  EXPECT_EQ(gemm_table_for(gemm_tuning_json(t), device, "again").choices, t.choices);
  GemmTable other{"Another card, sm_80, cuBLASLt 1", {{"x", GemmChoice{}}}};
  const std::string both = merge_gemm_tuning(text, other);
  EXPECT_EQ(gemm_table_for(both, device, "both").choices, t.choices);
  std::string why;
  EXPECT_TRUE(gemm_table_for(gemm_tuning_json(other), device, "other", &why).choices.empty());
  EXPECT_NE(why.find("Another card"), std::string::npos) << why;
  // A backend given the table takes its choice, every time; another card's
  // table leaves it as it was.
  for (int run = 0; run < 2; ++run) {
    auto gpu = make_cuda_ops(CudaPrecision::BF16, 0, {.gemm = GemmMode::Auto});
    gpu->adopt_gemm_tuning(text);
    gpu->adopt_gemm_tuning(gemm_tuning_json(other));  // ignored, with a message
    const GemmTable got = gemm_table_for(gpu->gemm_tuning(), device, "adopted");
    ASSERT_EQ(got.choices.size(), 1u);
    EXPECT_EQ(got.choices.begin()->second, won) << "run " << run;
  }
}

}  // namespace
}  // namespace wiola
