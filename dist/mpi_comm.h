// MPI implementation of dist::Comm (dist/comm.h), for the CPU backend: buffers
// are host memory. This header does not include <mpi.h>, so the trainer can
// include it. Every operation is the non-blocking MPI call followed by an
// MPI_Test polling loop with a deadline (Diagnostics::timeout_s); on timeout
// the rank prints one line naming world rank, group, operation, element count
// and context, then calls MPI_Abort(MPI_COMM_WORLD, 3).
#pragma once

#include <memory>

#include "dist/comm.h"

namespace wiola::dist {

// RAII for MPI: MPI_Init_thread (FUNNELED: only the main thread calls MPI)
// and MPI_Finalize. Works without mpirun (Open MPI singleton: world size 1).
// If MPI is already initialised, neither initialises nor finalises.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  MpiRuntime() : MpiRuntime(nullptr, nullptr) {}
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }

 private:
  bool owns_ = false;
  int rank_ = 0, size_ = 1;
};

// A Comm over MPI_COMM_WORLD (named "world"). MPI must be initialised.
std::unique_ptr<Comm> mpi_world_comm();

// Aborts every rank when an exception escapes `fn`: prints
// "rank R: <what>" and MPI_Abort(world, code). Use around main's body.
template <class Fn>
int run_or_abort(Fn&& fn, int code = 1);

}  // namespace wiola::dist

#include <exception>

#include "dist/diagnostics.h"

template <class Fn>
int wiola::dist::run_or_abort(Fn&& fn, int code) {
  try {
    return fn();
  } catch (const std::exception& e) {
    abort_job(e.what(), code);
  } catch (...) {
    abort_job("unknown exception", code);
  }
}
