// cuBLASLt for the CUDA emulator (tools/cuda_emu/emu.h): the entry points of
// kernels/cuda/cublaslt_lib.cuh, replacing the library the real build loads.
// The descriptors keep what the backend sets; the heuristic returns a few
// fake candidates (ids 0, 1, 2; id 2 a split-K configuration that needs a
// workspace), each of which computes as the emulated cublasGemmEx does
// (blas_emu.h: the same bits), after checking what cuBLASLt checks and,
// beyond it, that every operand and the workspace lie inside one device
// allocation. WIOLA_EMU_LT_WRONG_ALGO=<id> makes that candidate compute a
// wrong product (alpha off by 1 %): the tests' way to see the backend's
// correctness check reject a candidate.
#include <cublasLt.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/cublaslt_lib.cuh"
#include "tools/cuda_emu/blas_emu.h"
#include "util/test_hooks.h"

namespace wiola::cuda {
namespace {

constexpr int kCandidates = 3;

struct Desc {  // in cublasLtMatmulDescOpaque_t
  cublasComputeType_t compute;
  cudaDataType scale;
  cublasOperation_t ta, tb;
};
struct Layout {  // in cublasLtMatrixLayoutOpaque_t
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Pref {  // in cublasLtMatmulPreferenceOpaque_t
  uint64_t workspace;
};
// An algorithm: data[0] id, [1] tile, [2] split-K count, [3] reduction
// scheme, [4] swizzle, [5] custom option, [6] stages.
constexpr uint64_t kMagic = 0x776c7465'6d75ull;  // data[7]: made by this emulator

template <class T, class O>
T& as(O* o) {
  static_assert(sizeof(T) <= sizeof(o->data));
  return *reinterpret_cast<T*>(o->data);
}

cublasStatus_t refuse(cublasStatus_t s, const std::string& why) { return ::wiola::cuda::refuse(s, why, "cublasLt"); }

cublasStatus_t create(cublasLtHandle_t* h) {
  *h = reinterpret_cast<cublasLtHandle_t>(new int(1));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t destroy(cublasLtHandle_t h) {
  delete reinterpret_cast<int*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
size_t get_version() { return 130000; }

cublasStatus_t desc_create(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  *d = new cublasLtMatmulDescOpaque_t{};
  as<Desc>(*d) = Desc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t desc_destroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t desc_set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* buf, size_t bytes) {
  if (bytes != sizeof(int32_t)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "descriptor attribute size");
  const auto op = static_cast<cublasOperation_t>(*static_cast<const int32_t*>(buf));
  if (a == CUBLASLT_MATMUL_DESC_TRANSA) as<Desc>(d).ta = op;
  else if (a == CUBLASLT_MATMUL_DESC_TRANSB) as<Desc>(d).tb = op;
  else return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "descriptor attribute " + std::to_string(a));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t layout_create(cublasLtMatrixLayout_t* l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld) {
  *l = new cublasLtMatrixLayoutOpaque_t{};
  as<Layout>(*l) = Layout{t, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t layout_destroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t pref_create(cublasLtMatmulPreference_t* p) {
  *p = new cublasLtMatmulPreferenceOpaque_t{};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t pref_destroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t pref_set(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void* buf,
                        size_t bytes) {
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && bytes == sizeof(uint64_t))
    as<Pref>(p).workspace = *static_cast<const uint64_t*>(buf);
  else if (bytes != sizeof(uint32_t))  // the alignments: accepted, every candidate takes any
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "preference attribute size");
  return CUBLAS_STATUS_SUCCESS;
}

// The GEMM the descriptors describe: D = C (in place), sizes from the layouts.
struct Problem {
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc;
  cudaDataType at, bt, ct;
};
cublasStatus_t problem(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, Problem& p) {
  if (!d || !a || !b || !c || !dd) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a null descriptor");
  const Desc& x = as<Desc>(d);
  const Layout &la = as<Layout>(a), &lb = as<Layout>(b), &lc = as<Layout>(c), &ld = as<Layout>(dd);
  if (std::memcmp(&lc, &ld, sizeof lc) != 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "C and D differ in layout");
  if (x.scale != CUDA_R_32F) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "scale type other than 32F");
  p = Problem{x.ta, x.tb, int(lc.rows), int(lc.cols), int(x.ta == CUBLAS_OP_N ? la.cols : la.rows), int(la.ld),
              int(lb.ld), int(lc.ld), la.type, lb.type, lc.type};
  const uint64_t a_rows = x.ta == CUBLAS_OP_N ? lc.rows : uint64_t(p.k), b_rows = x.tb == CUBLAS_OP_N ? uint64_t(p.k) : lc.cols;
  const uint64_t b_cols = x.tb == CUBLAS_OP_N ? lc.cols : uint64_t(p.k);
  if (la.rows != a_rows || lb.rows != b_rows || lb.cols != b_cols)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "the layouts of A, B and C do not make one product");
  return check_shape(p.ta, p.tb, p.m, p.n, p.k, p.at, p.lda, p.bt, p.ldb, p.ct, p.ldc, x.compute, "cublasLt");
}

size_t workspace_needed(const cublasLtMatmulAlgo_t& algo, const Problem& p) {
  return algo.data[2] > 1 ? size_t(p.m) * size_t(p.n) * sizeof(float) : 0;
}

cublasStatus_t heuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                         cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                         cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t out[],
                         int* returned) {
  *returned = 0;
  if (!h || !pref) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "no handle or preference");
  Problem p{};
  if (const auto st = problem(d, a, b, c, dd, p); st != CUBLAS_STATUS_SUCCESS) return st;
  for (int id = 0; id < kCandidates && *returned < requested; ++id) {
    cublasLtMatmulHeuristicResult_t r{};
    r.algo.data[0] = uint64_t(id);
    r.algo.data[1] = uint64_t(10 + id);                               // tile
    r.algo.data[2] = id == 2 ? 4 : 1;                                 // split-K
    r.algo.data[3] = id == 2 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
    r.algo.data[7] = kMagic;
    r.workspaceSize = workspace_needed(r.algo, p);
    if (r.workspaceSize > as<Pref>(pref).workspace) continue;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.f;
    out[(*returned)++] = r;
  }
  return *returned > 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t check_algo(const cublasLtMatmulAlgo_t* algo) {
  if (!algo || algo->data[7] != kMagic || algo->data[0] >= uint64_t(kCandidates) || algo->data[2] < 1)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "an algorithm this emulator did not make");
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t algo_check(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                          cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd,
                          const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result) {
  Problem p{};
  if (const auto st = problem(d, a, b, c, dd, p); st != CUBLAS_STATUS_SUCCESS) return st;
  if (const auto st = check_algo(algo); st != CUBLAS_STATUS_SUCCESS) return st;
  *result = cublasLtMatmulHeuristicResult_t{};
  result->algo = *algo;
  result->workspaceSize = workspace_needed(*algo, p);
  result->wavesCount = 1.f;
  return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

int config_word(cublasLtMatmulAlgoConfigAttributes_t a) { return int(a) <= 6 ? int(a) : -1; }

cublasStatus_t config_get(const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t a, void* buf,
                          size_t bytes, size_t* written) {
  if (config_word(a) < 0 || bytes != sizeof(uint32_t)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "algo attribute");
  const auto v = uint32_t(algo->data[config_word(a)]);
  std::memcpy(buf, &v, sizeof v);
  if (written) *written = sizeof v;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t config_set(cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t a, const void* buf,
                          size_t bytes) {
  if (config_word(a) < 0 || bytes != sizeof(uint32_t)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "algo attribute");
  uint32_t v = 0;
  std::memcpy(&v, buf, sizeof v);
  algo->data[config_word(a)] = v;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t matmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                      cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                      const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t dd,
                      const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  if (!h) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "no handle");
  Problem p{};
  if (const auto st = problem(d, a, b, c, dd, p); st != CUBLAS_STATUS_SUCCESS) return st;
  if (const auto st = check_algo(algo); st != CUBLAS_STATUS_SUCCESS) return st;
  if (C != D) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "C and D are different buffers");
  const size_t need = workspace_needed(*algo, p);
  if (need > workspace_bytes || (need > 0 && !wiola_emu::in_device_memory(workspace, need)))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "the split-K candidate's workspace (" + std::to_string(need) +
                                                   " bytes) is not given or not inside one device allocation");
  float al = *static_cast<const float*>(alpha);
  if (const wiola::TestHook wrong(wiola::Hook::EmuLtWrongAlgo);
      wrong.set() && wrong.fields(1, 1) && uint64_t(wrong.integer(0, 0)) == algo->data[0])
    al *= 1.01f;
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
  const float be = *static_cast<const float*>(beta);  // host scalars: read now
  auto run = [=] { return gemm_one(p.ta, p.tb, p.m, p.n, p.k, al, A, p.at, p.lda, B, p.bt, p.ldb, be, D, p.ct, p.ldc,
                                   "cublasLtMatmul"); };
  // After the stream's work; while it captures a graph, recorded instead.
  if (!::wiola_emu::capturing(stream)) {
    ::wiola_emu::stream_ready(stream);
    return run();
  }
  ::wiola_emu::issue(stream, "cublasLtMatmul", [run] {
    if (run() != CUBLAS_STATUS_SUCCESS)
      ::wiola_emu::device_error("cublasLtMatmul in a graph refused its operands (the message above)");
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt c{create,     destroy,  get_version, desc_create, desc_destroy, desc_set,
                          layout_create, layout_destroy, pref_create, pref_destroy, pref_set, heuristic,
                          algo_check, config_get, config_set, matmul};
  return c;
}

}  // namespace wiola::cuda
