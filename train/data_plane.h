// Which data plane carries backend tensors between ranks (parallel.data_plane,
// docs/gpu.md "Several GPUs"): NCCL for GPU backends, MPI otherwise (staged
// through host memory where the backend's memory is not host memory, and
// where ranks share a GPU, which NCCL refuses).
#pragma once

#include <string>

#include "config/run_config_keys.h"
#include "dist/comm.h"
#include "kernels/ops.h"

namespace wiola {

struct DataPlane {
  dist::DataPlaneFactory factory;  // empty: the control plane itself
  std::string name;                // "nccl", "mpi" or "mpi-staged"
};

// Two ranks of `world` whose backends run on the same GPU, in words ("ranks
// 0 and 1 share GPU host/0000:1b:00"); empty when every rank has a GPU of its
// own or the backend is not CUDA. Collective over `world`.
std::string ranks_sharing_a_gpu(Ops<float>& ops, dist::Comm& world);

// mode: parallel.data_plane (DataPlaneMode); world_size: ranks in the job; shared_gpu:
// ranks_sharing_a_gpu's finding ("auto" then stages through host memory).
// "nccl" without a CUDA backend, without libnccl.so.2, or on ranks that share
// a GPU, is an error naming why. pp_staged: the pipeline group's messages
// through host memory (MPI, matched by tag) even where NCCL carries the
// other groups: the chunked schedules send both ways on a link and from the
// last stage back to the first, which NCCL's two in-order pipeline lanes do
// not carry (dist/nccl/nccl_comm.h).
DataPlane choose_data_plane(Ops<float>& ops, DataPlaneMode mode, int world_size, const std::string& shared_gpu = "",
                            bool pp_staged = false);

}  // namespace wiola
