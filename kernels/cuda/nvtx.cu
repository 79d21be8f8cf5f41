// NVTX ranges for the timeline's spans (util/trace.h, train.trace_steps):
// where the CUDA backend is made, every span of the host threads (the
// schedule's actions, messages, reductions, optimizer, checkpoint writes)
// is also an NVTX range of the same name, so Nsight Systems shows them
// beside the kernels. NVTX 3 is header-only (it finds a tool through
// NVTX_INJECTION64_PATH and costs a load and a branch without one). Under
// the CUDA emulator (no Nsight) the hooks stay unset.
#include "kernels/cuda/kernels.cuh"
#include "util/trace.h"

#ifndef WIOLA_CUDA_EMULATOR
#include <nvtx3/nvToolsExt.h>
#endif

namespace wiola::cuda {

void install_nvtx_ranges() {
#ifndef WIOLA_CUDA_EMULATOR
  trace::set_range_hooks({[](const char* name) { nvtxRangePushA(name); }, [] { nvtxRangePop(); }});
#endif
}

}  // namespace wiola::cuda
