// cuBLAS loaded at run time: see cublas_lib.cuh.
#include "kernels/cuda/cublas_lib.cuh"
#include "util/shared_lib.h"

namespace wiola::cuda {
namespace {

Cublas load() {
  const SharedLib lib("libcublas.so.13", "cuda backend", "put the CUDA 13 libraries on LD_LIBRARY_PATH");
  Cublas c{};
  lib.bind(c.create, "cublasCreate_v2");
  lib.bind(c.destroy, "cublasDestroy_v2");
  lib.bind(c.set_stream, "cublasSetStream_v2");
  lib.bind(c.set_math_mode, "cublasSetMathMode");
  lib.bind(c.status_string, "cublasGetStatusString");
  lib.bind(c.gemm_ex, "cublasGemmEx");
  lib.bind(c.gemm_strided_batched_ex, "cublasGemmStridedBatchedEx");
  return c;
}

}  // namespace

const Cublas& cublas() {
  static const Cublas c = load();
  return c;
}

}  // namespace wiola::cuda
