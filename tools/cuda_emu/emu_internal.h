// What the CUDA emulator's runtime (emu.cpp: launches, device memory) and its
// streams, events and graphs (emu_streams.cpp) share beyond emu.h: the
// pending error and the streams' state the runtime's synchronous calls read.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

namespace wiola_emu {

// The pending error and its message: returned (and cleared) by the next
// cudaGetLastError or synchronisation, as an asynchronous fault would be.
extern thread_local cudaError_t t_pending;
extern thread_local std::string t_detail;
// Reports msg on stderr and makes e pending (unless an error already is); returns e.
cudaError_t raise(cudaError_t e, std::string msg);
// The pending error, cleared.
cudaError_t take_pending();

// Completes the work of every stream, or of every blocking one (the legacy
// stream's synchronous copies wait for those).
void streams_ready(bool blocking_only);
// The streams that capture a graph now, and whether one of them does so in
// a mode other than relaxed.
std::vector<cudaStream_t> capturing_streams(bool strict_only);

}  // namespace wiola_emu
