// The NCCL data plane as the rest of the program sees it: how to make it and
// whether it can be made, in plain C++ types (no CUDA or NCCL header), so
// that the trainer's data-plane choice (train/data_plane.cpp) includes
// nothing of dist/nccl/. Declared here, defined in dist/nccl/ (library
// wiola_dist_nccl, CUDA builds only; the CUDA emulator compiles the same
// sources over its emulated NCCL): call them only where WIOLA_HAVE_CUDA is
// defined.
#pragma once

#include <functional>
#include <string>

#include "dist/comm.h"

namespace wiola::dist {

// The data plane for a CUDA backend's stream (Ops::device_stream(), a
// cudaStream_t): NCCL for every group, with the point-to-point communicators
// in the pipeline group ("pp"). fatal ends the job with a message (never
// returns); empty: print it and exit(3) (NcclOptions, dist/nccl/nccl_comm.h).
DataPlaneFactory nccl_data_plane(void* compute_stream,
                                 std::function<void(const std::string&)> fatal = {});

// True when libnccl.so.2 loads with every symbol (never throws).
bool nccl_available();
// Loads NCCL now: a missing library or symbol is a wiola::Error naming it and
// the loader's message (the error of parallel.data_plane = "nccl" there).
void require_nccl();

}  // namespace wiola::dist
