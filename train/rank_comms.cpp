#include "train/rank_comms.h"

#include <cstdio>
#include <vector>

#include "dist/agree.h"
#include "kernels/backend.h"
#include "train/data_plane.h"
#include "train/run_settings.h"
#include "util/error.h"

namespace wiola {

using dist::DType;
using dist::GroupKind;

void RankComms::open(const RunSettings& run) {
  const auto& par = run.rc.parallel;
  Ops<float>& ops = run.ops;
  // Ranks that share a GPU (several ranks on one device) cannot use NCCL.
  const std::string shared_gpu = run.world.size() > 1 ? ranks_sharing_a_gpu(ops, run.world) : "";
  // The chunked schedules send between the last rank and the first and both
  // ways on one link, which the NCCL plane's in-order pipeline lanes do not
  // carry: their pipeline messages go through host memory (tags match
  // them), the other groups stay on NCCL.
  const bool chunked = par.pp > 1 && dist::chunked(par.schedule);
  DataPlane plane = choose_data_plane(ops, par.data_plane, run.world.size(), shared_gpu, chunked);
  data_plane = plane.name;
  if (run.root() && !shared_gpu.empty() && par.data_plane == DataPlaneMode::Auto)
    std::fprintf(stderr,
                 "wiola train: %s: tensors between ranks go through host memory (NCCL needs a GPU "
                 "per rank)\n",
                 shared_gpu.c_str());
  grid = std::make_unique<dist::Grid>(dist::GridConfig{par.tp, par.pp, par.dp}, run.world, plane.factory);
  placement = dist::gather_placement(grid->config(), run.world);
  // TP ranks compute the TP-replicated tensors (norm γ/δ, φ, W_f) each on
  // its own; OpenBLAS's results depend on the thread count, so replicas
  // stay bit-identical only when a TP group shares one (checkpoints write
  // them once and check they agree).
  if (par.tp > 1) {
    const int64_t mine = cpu_threads();
    std::vector<int64_t> all(size_t(par.tp));
    grid->tp().all_gather(&mine, all.data(), 1, DType::I64);
    for (int r = 0; r < par.tp; ++r)
      if (all[size_t(r)] != mine) {
        if (run.me.tp != 0) throw dist::SetupFailed();
        fail("the TP ranks of stage ", run.me.pp, " (dp ", run.me.dp, ") use different thread counts (", mine, " and ",
             all[size_t(r)], "); set train.threads (or OMP_NUM_THREADS) the same on every rank of a TP group");
      }
    tpc = std::make_unique<dist::CommTpCollectives>(grid->data(GroupKind::Tp));
  }
}

void RankComms::open_link(const RunSettings& run, DType t) {
  link = std::make_unique<StageLink>(run.ops, grid->data(GroupKind::Pp), t, size_t(run.B) * run.T * run.rc.model.d);
}

}  // namespace wiola
