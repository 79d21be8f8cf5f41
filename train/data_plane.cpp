#include "train/data_plane.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "dist/diagnostics.h"
#include "dist/nccl_plane.h"  // defined in dist/nccl/: CUDA builds only
#include "dist/staged_comm.h"
#include "util/error.h"

namespace wiola {

std::string ranks_sharing_a_gpu(Ops<float>& ops, dist::Comm& world) {
#ifdef WIOLA_HAVE_CUDA
  // Every rank's identity, gathered as fixed-size strings. Each rank computes
  // the same answer from the same table, so all of them choose alike.
  using Id = std::array<char, 320>;
  Id mine{};
  const std::string id = ops.device_identity();
  std::memcpy(mine.data(), id.data(), std::min(id.size(), mine.size() - 1));
  std::vector<Id> all(size_t(world.size()));
  world.all_gather(mine.data(), all.data(), mine.size(), DType::U8);
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = a + 1; b < all.size(); ++b)
      if (all[a][0] && std::strcmp(all[a].data(), all[b].data()) == 0)
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " share GPU " + all[a].data();
#else
  (void)ops;
  (void)world;
#endif
  return "";
}

DataPlane choose_data_plane(Ops<float>& ops, DataPlaneMode mode, int world_size, const std::string& shared_gpu,
                            bool pp_staged) {
#ifdef WIOLA_HAVE_CUDA
  if (void* stream = ops.device_stream()) {
    WIOLA_CHECK(mode != DataPlaneMode::Nccl || shared_gpu.empty(), "parallel.data_plane = \"nccl\": ", shared_gpu,
                ", and NCCL needs a GPU per rank; set parallel.data_plane = \"staged\" (or \"auto\", which "
                "chooses it there) to pass tensors through host memory");
    // One rank alone moves nothing: NCCL would only cost its start-up.
    const bool want = mode == DataPlaneMode::Nccl ||
                      (mode == DataPlaneMode::Auto && world_size > 1 && shared_gpu.empty() && dist::nccl_available());
    if (want) {
      dist::require_nccl();  // "nccl" without the library: the loader's error
      dist::DataPlaneFactory nccl = dist::nccl_data_plane(stream, [](const std::string& m) { dist::abort_job(m, 3); });
      if (!pp_staged) return {std::move(nccl), "nccl"};
      dist::DataPlaneFactory staged = dist::data_plane_for(ops);
      return {[nccl = std::move(nccl), staged = std::move(staged)](dist::Comm& ctrl) {
                return ctrl.name() == "pp" ? staged(ctrl) : nccl(ctrl);
              },
              "nccl (pipeline: mpi-staged)"};
    }
  } else {
    WIOLA_CHECK(mode != DataPlaneMode::Nccl,
                "parallel.data_plane = \"nccl\" needs a CUDA backend (train.backend "
                "\"cuda\" or \"cuda-fp32\")");
  }
#else
  WIOLA_CHECK(mode != DataPlaneMode::Nccl,
              "parallel.data_plane = \"nccl\": this build has no CUDA backend "
              "(configure with -DWIOLA_CUDA=ON)");
  (void)world_size;
  (void)shared_gpu;
#endif
  auto staged = dist::data_plane_for(ops);
  const std::string name = staged ? "mpi-staged" : "mpi";
  return {std::move(staged), name};
}

}  // namespace wiola
