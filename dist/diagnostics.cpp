// The process-wide diagnostics state (no MPI: the NCCL data plane and the
// GPU kit use it too); world_rank and abort_job live in mpi_comm.cpp.
#include "dist/diagnostics.h"

#include "dist/rank_states.h"

namespace wiola::dist {

Diagnostics::Diagnostics() = default;

std::string Diagnostics::context() const {
  std::lock_guard<std::mutex> lock(mu_);
  return context_;
}

void Diagnostics::set_context(std::string c) {
  publish_rank_context(c);
  std::lock_guard<std::mutex> lock(mu_);
  context_ = std::move(c);
}

Diagnostics& Diagnostics::instance() {
  static Diagnostics d;
  return d;
}

}  // namespace wiola::dist
