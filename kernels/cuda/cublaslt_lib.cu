// cuBLASLt loaded at run time: see cublaslt_lib.cuh.
#include "kernels/cuda/cublaslt_lib.cuh"
#include "util/shared_lib.h"

namespace wiola::cuda {
namespace {

CublasLt load() {
  const SharedLib lib("libcublasLt.so.13", "cuda backend (gemm = cublaslt or auto)",
                      "put the CUDA 13 libraries on LD_LIBRARY_PATH");
  CublasLt c{};
  lib.bind(c.create, "cublasLtCreate");
  lib.bind(c.destroy, "cublasLtDestroy");
  lib.bind(c.get_version, "cublasLtGetVersion");
  lib.bind(c.matmul_desc_create, "cublasLtMatmulDescCreate");
  lib.bind(c.matmul_desc_destroy, "cublasLtMatmulDescDestroy");
  lib.bind(c.matmul_desc_set_attribute, "cublasLtMatmulDescSetAttribute");
  lib.bind(c.matrix_layout_create, "cublasLtMatrixLayoutCreate");
  lib.bind(c.matrix_layout_destroy, "cublasLtMatrixLayoutDestroy");
  lib.bind(c.preference_create, "cublasLtMatmulPreferenceCreate");
  lib.bind(c.preference_destroy, "cublasLtMatmulPreferenceDestroy");
  lib.bind(c.preference_set_attribute, "cublasLtMatmulPreferenceSetAttribute");
  lib.bind(c.algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic");
  lib.bind(c.algo_check, "cublasLtMatmulAlgoCheck");
  lib.bind(c.algo_config_get_attribute, "cublasLtMatmulAlgoConfigGetAttribute");
  lib.bind(c.algo_config_set_attribute, "cublasLtMatmulAlgoConfigSetAttribute");
  lib.bind(c.matmul, "cublasLtMatmul");
  return c;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt c = load();
  return c;
}

}  // namespace wiola::cuda
