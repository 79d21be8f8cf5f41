// cuBLAS loaded at run time: see cublas_lib.cuh.
#include <dlfcn.h>

#include "kernels/cuda/cublas_lib.cuh"
#include "util/error.h"

namespace wiola::cuda {
namespace {

constexpr const char* kSoname = "libcublas.so.13";

template <class F>
void bind(void* lib, F& fn, const char* symbol) {
  dlerror();
  void* p = dlsym(lib, symbol);
  const char* err = dlerror();
  WIOLA_CHECK(p && !err, "cuda backend: ", kSoname, " has no symbol ", symbol, err ? ": " : "",
              err ? err : "");
  fn = reinterpret_cast<F>(p);
}

Cublas load() {
  void* lib = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  const char* err = lib ? nullptr : dlerror();
  WIOLA_CHECK(lib, "cuda backend: cannot load ", kSoname, " (", err ? err : "unknown error",
              "); put the CUDA 13 libraries on LD_LIBRARY_PATH");
  Cublas c{};
  bind(lib, c.create, "cublasCreate_v2");
  bind(lib, c.destroy, "cublasDestroy_v2");
  bind(lib, c.set_stream, "cublasSetStream_v2");
  bind(lib, c.set_math_mode, "cublasSetMathMode");
  bind(lib, c.status_string, "cublasGetStatusString");
  bind(lib, c.gemm_ex, "cublasGemmEx");
  bind(lib, c.gemm_strided_batched_ex, "cublasGemmStridedBatchedEx");
  return c;  // the library stays loaded for the life of the process
}

}  // namespace

const Cublas& cublas() {
  static const Cublas c = load();
  return c;
}

}  // namespace wiola::cuda
