// This rank's communicators: the process grid (control plane MPI, data
// plane for the backend's memory: train/data_plane.h), the model's TP
// collectives and the stage link that carries the pipeline's boundary
// messages.
#pragma once

#include <memory>
#include <string>

#include "dist/grid.h"
#include "dist/placement.h"
#include "dist/tp_collectives.h"
#include "kernels/dtype.h"
#include "train/stage_link.h"

namespace wiola {

struct RunSettings;

struct RankComms {
  std::unique_ptr<dist::Grid> grid;
  std::string data_plane;                        // what carries backend tensors: "nccl", "mpi", "mpi-staged"
  std::unique_ptr<dist::CommTpCollectives> tpc;  // tp > 1
  std::unique_ptr<StageLink> link;
  dist::Placement placement;  // every rank's node, each dimension's links

  // The grid on the chosen data plane (collective), the TP ranks' thread
  // counts checked equal, the TP collectives.
  void open(const RunSettings& run);
  // The stage link for boundary tensors of type `t` ([B, T, d] each).
  void open_link(const RunSettings& run, DType t);
};

}  // namespace wiola
