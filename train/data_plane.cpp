#include "train/data_plane.h"

#include "dist/diagnostics.h"
#include "dist/staged_comm.h"
#include "util/error.h"
#ifdef WIOLA_HAVE_CUDA
#include "dist/nccl/nccl_comm.h"
#include "dist/nccl/nccl_lib.h"
#include "kernels/cuda/cuda_ops.h"
#endif

namespace wiola {

DataPlane choose_data_plane(Ops<float>& ops, const std::string& mode, int world_size) {
#ifdef WIOLA_HAVE_CUDA
  if (void* stream = cuda_stream_of(ops)) {
    // One rank alone moves nothing: NCCL would only cost its start-up.
    const bool want = mode == "nccl" || (mode == "auto" && world_size > 1 && dist::nccl_available());
    if (want) {
      dist::nccl();  // "nccl" without the library: the loader's error
      return {dist::nccl_data_plane(stream, [](const std::string& m) { dist::abort_job(m, 3); }), "nccl"};
    }
  } else {
    WIOLA_CHECK(mode != "nccl", "parallel.data_plane = \"nccl\" needs a CUDA backend (train.backend "
                "\"cuda\" or \"cuda-fp32\")");
  }
#else
  WIOLA_CHECK(mode != "nccl", "parallel.data_plane = \"nccl\": this build has no CUDA backend "
              "(configure with -DWIOLA_CUDA=ON)");
  (void)world_size;
#endif
  auto staged = dist::data_plane_for(ops);
  const std::string name = staged ? "mpi-staged" : "mpi";
  return {std::move(staged), name};
}

}  // namespace wiola
