// The CPU backend's BLAS kernels (kernels/cpu/blas.h, docs/cpu.md "BLAS
// kernels"): the core tables, the releases refused, the self-check that
// guards a selected core (it must catch the wrong products of known bugs),
// the CPU level against Highway's own detection, and switching cores.
#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu_info.h"

namespace wiola::cpu {
namespace {

TEST(Blas, CoreLevels) {
  for (const char* c : {"Prescott", "Katmai", "Core2", "Nehalem", "Barcelona", "Opteron_SSE3", "Bobcat"})
    EXPECT_EQ(openblas_core_level(c), IsaLevel::Sse) << c;
  for (const char* c : {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"})
    EXPECT_EQ(openblas_core_level(c), IsaLevel::Avx) << c;
  for (const char* c : {"Haswell", "Zen", "Excavator", "HASWELL"}) EXPECT_EQ(openblas_core_level(c), IsaLevel::Avx2) << c;
  for (const char* c : {"SkylakeX", "skylakex", "Cooperlake", "SapphireRapids"})
    EXPECT_EQ(openblas_core_level(c), IsaLevel::Avx512) << c;
  // A core this table does not know is never judged (nor replaced).
  EXPECT_FALSE(openblas_core_level("Zen5").has_value());
  EXPECT_FALSE(openblas_core_level("").has_value());
}

TEST(Blas, CoreForLevel) {
  EXPECT_STREQ(openblas_core_for(IsaLevel::Avx512), "SkylakeX");
  EXPECT_STREQ(openblas_core_for(IsaLevel::Avx2), "Haswell");
  EXPECT_EQ(openblas_core_for(IsaLevel::Avx), nullptr);
  EXPECT_EQ(openblas_core_for(IsaLevel::Sse), nullptr);
  EXPECT_STREQ(isa_level_name(IsaLevel::Avx512), "avx512");
}

TEST(Blas, KnownBadReleases) {
  EXPECT_NE(openblas_known_bad("0.3.5", "SkylakeX").find("1955"), std::string::npos);
  EXPECT_NE(openblas_known_bad("0.3.11", "SkylakeX").find("2914"), std::string::npos);
  EXPECT_NE(openblas_known_bad("0.3.11", "Cooperlake").find("2914"), std::string::npos);
  EXPECT_NE(openblas_known_bad("0.3.14", "skylakex").find("3152"), std::string::npos);
  for (const char* v : {"0.3.3", "0.3.7", "0.3.12", "0.3.15", "0.3.21", "0.3.28", "0.4.0", "garbage"})
    EXPECT_EQ(openblas_known_bad(v, "SkylakeX"), "") << v;
  // The bugs are in the AVX-512 kernels: the AVX2 ones of those releases are fine.
  EXPECT_EQ(openblas_known_bad("0.3.11", "Haswell"), "");
  EXPECT_EQ(openblas_known_bad("0.3.5", "Zen"), "");
}

TEST(Blas, SelfCheckPassesTheLinkedBlas) {
  EXPECT_EQ(gemm_self_check(blas_sgemm, blas_dgemm), "") << "kernels " << openblas_get_corename();
}

// OpenBLAS 0.3.11's and 0.3.14's empty sgemm_direct: C is left as it was.
void sgemm_leaves_c_when_beta_is_zero(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda,
                                      const float* B, int ldb, float beta, float* C, int ldc) {
  if (beta == 0.f && alpha == 1.f && m * n * k <= 16 * 16 * 16) return;
  blas_sgemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
// Zero inner dimension with beta 0 must give zeros (OpenBLAS issue 2914's case).
void sgemm_ignores_empty_k(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda,
                           const float* B, int ldb, float beta, float* C, int ldc) {
  if (k == 0) return;
  blas_sgemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
// One element off by far more than rounding, on the transposed path only.
void sgemm_one_wrong_element(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda,
                             const float* B, int ldb, float beta, float* C, int ldc) {
  blas_sgemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  if (ta && tb && m > 40) C[ldc * 7 + 3] *= 1.001f;
}
// A dgemm that rounds through float: fine for sgemm's bound, not for dgemm's.
void dgemm_in_float(bool ta, bool tb, int m, int n, int k, double alpha, const double* A, int lda,
                    const double* B, int ldb, double beta, double* C, int ldc) {
  blas_dgemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) C[size_t(i) * ldc + j] = double(float(C[size_t(i) * ldc + j]));
}
// Writes the element past each output row (a leading dimension ignored).
void sgemm_writes_padding(bool ta, bool tb, int m, int n, int k, float alpha, const float* A, int lda,
                          const float* B, int ldb, float beta, float* C, int ldc) {
  blas_sgemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  if (ldc > n) C[n] = 42.f;
}

TEST(Blas, SelfCheckCatchesWrongProducts) {
  const std::string direct = gemm_self_check(sgemm_leaves_c_when_beta_is_zero, blas_dgemm);
  EXPECT_NE(direct.find("sgemm NN"), std::string::npos) << direct;
  EXPECT_NE(direct.find("beta=0"), std::string::npos) << direct;
  const std::string empty_k = gemm_self_check(sgemm_ignores_empty_k, blas_dgemm);
  EXPECT_NE(empty_k.find("k=0"), std::string::npos) << empty_k;
  const std::string one = gemm_self_check(sgemm_one_wrong_element, blas_dgemm);
  EXPECT_NE(one.find("sgemm TT"), std::string::npos) << one;
  EXPECT_NE(one.find("C[7,3]"), std::string::npos) << one;
  const std::string dbl = gemm_self_check(blas_sgemm, dgemm_in_float);
  EXPECT_EQ(dbl.rfind("dgemm", 0), 0u) << dbl;
  const std::string pad = gemm_self_check(sgemm_writes_padding, blas_dgemm);
  EXPECT_NE(pad.find("wrote past n"), std::string::npos) << pad;
}

// Two detectors of one CPU: ours (CPUID + XGETBV, for BLAS cores) and
// Highway's (for the SIMD targets). Highway's AVX3 needs AVX-512 F/BW/DQ/VL,
// its AVX2 also BMI2 and F16C, so where it runs a target we run the level.
TEST(Blas, CpuLevelAgreesWithHighway) {
  const auto ok = simd_supported_targets();
  const auto has = [&](const char* t) { return std::find(ok.begin(), ok.end(), t) != ok.end(); };
  const IsaLevel level = cpu_isa_level();
  if (has("avx512")) EXPECT_EQ(level, IsaLevel::Avx512);
  else if (has("avx2")) EXPECT_EQ(level, IsaLevel::Avx2);
  else EXPECT_LE(int(level), int(IsaLevel::Avx));
}

TEST(Blas, StateNamesTheKernelsInUse) {
  const BlasState& s = blas_state();
  EXPECT_EQ(s.kernels, openblas_get_corename());
  EXPECT_EQ(s.library, "OpenBLAS");
  EXPECT_FALSE(s.version.empty());
  EXPECT_EQ(s.cpu, cpu_isa_level());
  EXPECT_NE(s.summary().find(s.library + " " + s.version + ", " + s.kernels + " kernels ("), std::string::npos)
      << s.summary();
  const CpuBlasInfo info = cpu_blas();
  EXPECT_EQ(info.kernels, s.kernels);
  EXPECT_EQ(info.summary, s.summary());
}

TEST(Blas, RateOnAnotherCoreSwitchesBack) {
  const std::string before = openblas_get_corename();
  const auto rate = blas_sgemm_gflops_on("Prescott", 128, 2);
  ASSERT_TRUE(rate.has_value());  // Debian's OpenBLAS is built with DYNAMIC_ARCH
  EXPECT_GT(*rate, 0.0);
  EXPECT_EQ(before, openblas_get_corename());
  EXPECT_EQ(gemm_self_check(blas_sgemm, blas_dgemm), "");
}

}  // namespace
}  // namespace wiola::cpu
