// Failure paths of the NCCL communicator (dist/nccl/nccl_comm.cpp) on the
// emulated NCCL across 2 ranks, for tests/dist/expect_failure.sh: the job
// must end on every rank, non-zero, within seconds, with one message naming
// the world rank, the group, the operation and the trainer's context.
//   timeout: rank 1 never joins rank 0's all-reduce: rank 0's watchdog finds
//            the operation older than the timeout (2 s) and ends the job
//   race:    rank 0 overwrites the buffer of a send before waiting for it;
//            the emulator reports the write as the communicator's
//            asynchronous error, which the watchdog turns into the job's end
// Both end through the watchdog's thread, calling MPI_Abort from outside
// the thread that initialised MPI (MPI_THREAD_FUNNELED): what a real GPU run
// would do, and what no GPU run has confirmed yet.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "dist/diagnostics.h"
#include "dist/mpi_comm.h"
#include "dist/nccl/nccl_comm.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"

using namespace wiola;
using namespace wiola::dist;

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  auto world = mpi_world_comm();
  const int r = world->rank();
  return run_or_abort([&]() -> int {
    auto ops = make_cuda_ops(CudaPrecision::FP32, r);
    NcclOptions o;
    o.compute_stream = cuda_stream_of(*ops);
    o.p2p = true;
    o.fatal = [](const std::string& m) { abort_job(m, 3); };
    auto nc = nccl_comm(*world, std::move(o));
    Buffer<float> x(*ops, 5);
    ops->zero(x.data(), x.bytes());
    if (mode == "timeout") {
      set_comm_timeout(r == 0 ? 2.0 : 30.0);
      set_context("step 7 fwd microbatch 3");
      if (r == 0) {
        nc->iall_reduce(x.data(), x.data(), 5, DType::F32, ReduceOp::Sum).wait();
        ops->synchronize();  // blocks: rank 1 never joins
      } else {
        double y = 0;  // never sent: waits until rank 0 ends the job
        world->irecv(&y, 1, DType::F64, 0, 99).wait();
      }
    } else if (mode == "race") {
      set_comm_timeout(30.0);
      set_context("step 3 pipeline send");
      if (r == 0) {
        Request q = nc->isend(x.data(), 5, DType::F32, 1, 0);
        const float ones[5] = {1, 1, 1, 1, 1};
        ops->upload(x.data(), ones, sizeof ones);  // the bug: the buffer is still being sent
        q.wait();
        ops->synchronize();
      } else {
        Buffer<float> y(*ops, 5);
        nc->irecv(y.data(), 5, DType::F32, 0, 0).wait();
        ops->synchronize();
      }
      std::this_thread::sleep_for(std::chrono::seconds(20));  // the watchdog ends the job first
    } else {
      std::fprintf(stderr, "usage: nccl_failure timeout|race\n");
      return 2;
    }
    return 0;
  });
}
