// cuBLASLt GEMMs: see gemm_lt.cuh.
#include "kernels/cuda/gemm_lt.cuh"

#include <algorithm>
#include <string>

#include "kernels/cuda/cublaslt_lib.cuh"
#include "util/error.h"

namespace wiola::cuda {

size_t BlasGemm::c_bytes() const {
  const size_t es = ct == CUDA_R_32F ? 4 : 2;
  return m > 0 && n > 0 ? (size_t(n - 1) * size_t(ldc) + size_t(m)) * es : 0;
}

void check_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt error in ", what, ": status ", int(st));
}

// The descriptors of one GEMM (host objects, made per call).
struct GemmLt::Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  explicit Descs(const BlasGemm& g) {
    const CublasLt& lt = cublaslt();
    check_lt(lt.matmul_desc_create(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const int32_t ta = g.ta, tb = g.tb;
    check_lt(lt.matmul_desc_set_attribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "transa");
    check_lt(lt.matmul_desc_set_attribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "transb");
    const bool an = g.ta == CUBLAS_OP_N, bn = g.tb == CUBLAS_OP_N;
    check_lt(lt.matrix_layout_create(&a, g.at, uint64_t(an ? g.m : g.k), uint64_t(an ? g.k : g.m), g.lda), "layout A");
    check_lt(lt.matrix_layout_create(&b, g.bt, uint64_t(bn ? g.k : g.n), uint64_t(bn ? g.n : g.k), g.ldb), "layout B");
    check_lt(lt.matrix_layout_create(&c, g.ct, uint64_t(g.m), uint64_t(g.n), g.ldc), "layout C");
  }
  ~Descs() {
    const CublasLt& lt = cublaslt();
    if (a) lt.matrix_layout_destroy(a);
    if (b) lt.matrix_layout_destroy(b);
    if (c) lt.matrix_layout_destroy(c);
    if (op) lt.matmul_desc_destroy(op);
  }
  Descs(const Descs&) = delete;
  Descs& operator=(const Descs&) = delete;
};

GemmLt::GemmLt(CachingAllocator& mem, cudaStream_t stream) : mem_(mem), stream_(stream) {
  check_lt(cublaslt().create(&handle_), "cublasLtCreate");
  workspace_ = mem_.alloc(kWorkspace, "the cuBLASLt workspace");
}

GemmLt::~GemmLt() {
  if (workspace_) mem_.free(workspace_);
  if (handle_) cublaslt().destroy(handle_);
}

size_t GemmLt::version() { return cublaslt().get_version(); }

std::vector<LtAlgo> GemmLt::candidates(const BlasGemm& g, int align, int n, int sms) {
  const CublasLt& lt = cublaslt();
  const Descs d(g);
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(lt.preference_create(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = kWorkspace;
  const uint32_t al = uint32_t(align);
  cublasStatus_t st = lt.preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  const cublasLtMatmulPreferenceAttributes_t aligns[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; ++i)
    st = lt.preference_set_attribute(pref, aligns[i], &al, sizeof al);
  cublasLtMatmulHeuristicResult_t res[kMaxCandidates];
  int got = 0;
  n = std::min(n, kMaxCandidates);
  if (st == CUBLAS_STATUS_SUCCESS) st = lt.algo_get_heuristic(handle_, d.op, d.a, d.b, d.c, d.c, pref, n, res, &got);
  lt.preference_destroy(pref);
  std::vector<LtAlgo> out;
  if (st != CUBLAS_STATUS_SUCCESS) return out;  // no candidate: the caller keeps cublasGemmEx
  for (int i = 0; i < got; ++i)
    if (res[i].state == CUBLAS_STATUS_SUCCESS) out.push_back({res[i].algo});
  const long tiles = long((g.m + 127) / 128) * long((g.n + 127) / 128);
  const size_t first = out.size();
  for (size_t i = 0; i < std::min<size_t>(first, 2) && tiles < sms; ++i)
    for (uint32_t split = 2; split <= 16; split *= 2) {
      if (g.k / int(split) < 256) break;
      cublasLtMatmulAlgo_t a = out[i].algo;
      const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      cublasLtMatmulHeuristicResult_t r{};
      if (lt.algo_config_set_attribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split) ==
              CUBLAS_STATUS_SUCCESS &&
          lt.algo_config_set_attribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) ==
              CUBLAS_STATUS_SUCCESS &&
          lt.algo_check(handle_, d.op, d.a, d.b, d.c, d.c, &a, &r) == CUBLAS_STATUS_SUCCESS &&
          r.workspaceSize <= kWorkspace)
        out.push_back({a});
    }
  return out;
}

cublasStatus_t GemmLt::run(const BlasGemm& g, const cublasLtMatmulAlgo_t& algo) {
  const Descs d(g);
  return cublaslt().matmul(handle_, d.op, &g.alpha, g.A, d.a, g.B, d.b, &g.beta, g.C, d.c, g.C, d.c, &algo,
                           workspace_, kWorkspace, stream_);
}

std::string GemmLt::describe(const cublasLtMatmulAlgo_t& algo) {
  const char* const names[] = {"id", "tile", "splitk", "reduction", "swizzle", "custom", "stages"};
  const cublasLtMatmulAlgoConfigAttributes_t attrs[] = {
      CUBLASLT_ALGO_CONFIG_ID,          CUBLASLT_ALGO_CONFIG_TILE_ID,       CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
      CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
      CUBLASLT_ALGO_CONFIG_STAGES_ID};
  std::string s;
  for (int i = 0; i < 7; ++i) {
    uint32_t v = 0;
    size_t written = 0;
    if (cublaslt().algo_config_get_attribute(&algo, attrs[i], &v, sizeof v, &written) == CUBLAS_STATUS_SUCCESS)
      s.append(s.empty() ? "" : " ").append(names[i]).append(" ").append(std::to_string(v));
  }
  return s;
}

}  // namespace wiola::cuda
