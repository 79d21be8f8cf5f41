// Which data plane carries backend tensors between ranks (parallel.data_plane,
// docs/gpu.md "Several GPUs"): NCCL for GPU backends, MPI otherwise (staged
// through host memory where the backend's memory is not host memory).
#pragma once

#include <string>

#include "dist/comm.h"
#include "kernels/ops.h"

namespace wiola {

struct DataPlane {
  dist::DataPlaneFactory factory;  // empty: the control plane itself
  std::string name;                // "nccl", "mpi" or "mpi-staged"
};

// mode: "auto", "nccl" or "staged"; world_size: ranks in the job. "nccl"
// without a CUDA backend, or without libnccl.so.2, is an error naming why.
DataPlane choose_data_plane(Ops<float>& ops, const std::string& mode, int world_size);

}  // namespace wiola
