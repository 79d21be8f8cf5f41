// The NCCL data-plane communicator: backend (GPU) buffers between the ranks
// of one process-grid group, one GPU per rank; MPI stays the control plane
// (dist/comm.h). Same contract as the MPI communicator, with GPU streams:
//
// - Ordering without host waits: an operation starts on its own stream once
//   the compute stream has reached the point where it was issued (an event),
//   and Request::wait() makes the compute stream wait for its completion
//   event; the host never blocks, so the DP reduce-scatter of one bucket runs
//   while the backward pass computes the next. test() asks whether it is done.
// - Streams: collectives on one; in the pipeline group, sends and receives
//   towards higher ranks on a second communicator and stream, towards lower
//   ranks on a third, so a send never queues behind a receive that waits for
//   it (each direction is acyclic along the pipeline, NCCL keeps per-pair
//   order, and the schedule posts both sides in the same order). Tags are
//   ignored: messages between two ranks in one direction match in order.
// - Exposed time: the seconds the compute stream stood waiting for an
//   operation (from the moment it reached the wait to the operation's end,
//   both GPU events) go to CommTraffic::wait_s once both events completed;
//   the seconds the operation ran on its stream go to busy_s.
// - Failures: a watchdog thread polls every communicator's asynchronous
//   error and every started operation's age; an error, or an operation
//   running longer than the communication timeout (dist/diagnostics.h),
//   aborts the NCCL communicators and ends the job with one message naming
//   the world rank, group, operation, element count and the context the
//   trainer had set when the operation was issued.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "dist/comm.h"
#include "dist/nccl_plane.h"  // nccl_data_plane, nccl_available, require_nccl

namespace wiola::dist {

struct NcclOptions {
  void* compute_stream = nullptr;  // the backend's cudaStream_t
  bool p2p = false;                // make the two point-to-point communicators
  // Ends the job with this message (never returns). Default: print it to
  // stderr and exit(3) at once (mpirun then ends the other ranks); the
  // trainer passes dist::abort_job.
  std::function<void(const std::string&)> fatal;
};

// Collective over `ctrl` (rank 0 makes the NCCL id, ctrl broadcasts it).
// Needs the CUDA device chosen (the backend's) and libnccl.so.2. split() is
// not offered: split the control plane and wrap the parts.
std::unique_ptr<Comm> nccl_comm(Comm& ctrl, NcclOptions opt);

}  // namespace wiola::dist
