// A data-plane communicator for backends whose memory the host cannot touch
// (the cpu-opaque debug backend; a GPU without NCCL): every operation copies
// its backend buffers into host staging memory, runs on the control-plane
// communicator it wraps (MPI), and copies the result back when the operation
// completes. Same contract as dist/comm.h (NCCL's in-place rules included);
// traffic is counted once, by the wrapped communicator.
#pragma once

#include <functional>
#include <memory>

#include "dist/comm.h"
#include "kernels/ops.h"

namespace wiola::dist {

struct HostStaging {
  std::function<void(void* dst_backend, const void* src_host, size_t bytes)> upload;
  std::function<void(void* dst_host, const void* src_backend, size_t bytes)> download;
};

// `inner` must outlive the result. split() is not offered: split the
// control-plane communicator and wrap the parts.
std::unique_ptr<Comm> host_staged_comm(Comm& inner, HostStaging staging);

// The data plane for a backend: MPI on its buffers directly when the host
// can touch them, MPI staged through host memory otherwise. `ops` must
// outlive every communicator made.
template <class T>
DataPlaneFactory data_plane_for(Ops<T>& ops) {
  if (ops.host_accessible()) return {};
  return [&ops](Comm& ctrl) {
    HostStaging s{[&ops](void* d, const void* h, size_t b) { ops.upload(d, h, b); },
                  [&ops](void* h, const void* d, size_t b) { ops.download(h, d, b); }};
    return host_staged_comm(ctrl, std::move(s));
  };
}

}  // namespace wiola::dist
