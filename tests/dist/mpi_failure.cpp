// Failure-path driver for tests/dist/expect_failure.sh (2 ranks):
//   timeout: rank 1 never joins rank 0's all_reduce -> rank 0 times out (2 s)
//   abort:   rank 1 calls abort_job while rank 0 waits in a barrier
//   throw:   rank 1 throws inside run_or_abort while rank 0 waits
//   mpi_error: rank 1 makes an MPI call fail (a negative tag): the error comes
//            back (MPI_ERRORS_RETURN) and the message names rank, group, op
#include <cstdio>
#include <string>

#include "dist/diagnostics.h"
#include "dist/mpi_comm.h"
#include "util/error.h"

using namespace wiola::dist;

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  auto world = mpi_world_comm();
  const int r = world->rank();
  return run_or_abort([&]() -> int {
    if (mode == "timeout") {
      set_comm_timeout(r == 0 ? 2.0 : 30.0);
      set_context("step 7 fwd microbatch 3");
      double x[5] = {1, 2, 3, 4, 5};
      if (r == 0) {
        world->all_reduce(x, 5, ReduceOp::Sum);
      } else {
        double y = 0;  // never sent: waits until rank 0 ends the job
        world->irecv(&y, 1, DType::F64, 0, 99).wait();
      }
    } else if (mode == "abort") {
      set_comm_timeout(30.0);
      if (r == 1) abort_job("deliberate failure on rank 1", 5);
      world->barrier();
    } else if (mode == "throw") {
      set_comm_timeout(30.0);
      if (r == 1) wiola::fail("thrown on rank ", r);
      world->barrier();
    } else if (mode == "mpi_error") {
      set_comm_timeout(30.0);
      set_context("step 3 pipeline send");
      if (r == 1) {
        const float x = 1;
        world->isend(&x, 1, DType::F32, 0, -7).wait();  // MPI_ERR_TAG
      }
      world->barrier();
    } else {
      std::fprintf(stderr, "usage: mpi_failure timeout|abort|throw|mpi_error\n");
      return 2;
    }
    return 0;
  });
}
