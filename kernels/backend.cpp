// Backends by start-up name (train.backend, wiola bench --backend). The CUDA
// names exist in builds with WIOLA_CUDA=ON; such a build still runs "cpu" on
// a machine without a GPU, and "cuda" there fails with the reason.
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/bf16_storage_ops.h"
#include "kernels/ops.h"
#include "util/env.h"
#include "util/error.h"
#ifdef WIOLA_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace wiola {

std::vector<std::string> backend_names() {
  std::vector<std::string> n = {"cpu", "cpu-opaque", "cpu-bf16"};
#ifdef WIOLA_HAVE_CUDA
  n.insert(n.end(), {"cuda", "cuda-fp32"});
#endif
  return n;
}

namespace {
std::string known() {
  std::string s;
  for (const auto& n : backend_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}
}  // namespace

int launcher_local_rank() {
  return env_first_int({"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"});
}

#ifdef WIOLA_HAVE_CUDA
// One GPU per rank: the launcher's local rank modulo the visible devices; 0
// when none is set. Where Slurm binds one GPU per task, that GPU is the only
// one visible.
int local_device() {
  const int n = cuda_device_count(), r = launcher_local_rank();
  return n > 0 && r >= 0 ? r % n : 0;
}
#endif

template <class T>
std::unique_ptr<Ops<T>> make_backend(const std::string& name, [[maybe_unused]] const BackendOptions& options) {
  if (name == "cpu") return make_cpu_ops<T>(CpuMemory::Host);
  if (name == "cpu-opaque") return make_cpu_ops<T>(CpuMemory::Opaque);
  if (name == "cpu-bf16") {
    if constexpr (std::is_same_v<T, float>) return make_cpu_bf16_ops();
    else fail("backend 'cpu-bf16' computes in float32 (double-precision checks run on cpu)");
  }
#ifdef WIOLA_HAVE_CUDA
  if (name == "cuda" || name == "cuda-fp32") {
    if constexpr (std::is_same_v<T, float>) {
      return make_cuda_ops(name == "cuda" ? CudaPrecision::BF16 : CudaPrecision::FP32, local_device(), options);
    } else {
      fail("backend '", name, "' computes in float32 (double-precision checks run on cpu)");
    }
  }
#endif
  fail("unknown backend '", name, "' (known: ", known(), ")");
}
template std::unique_ptr<Ops<float>> make_backend<float>(const std::string&, const BackendOptions&);
template std::unique_ptr<Ops<double>> make_backend<double>(const std::string&, const BackendOptions&);

}  // namespace wiola
