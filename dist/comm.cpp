// The MPI-free part of dist/comm.h: requests and traffic counting (any
// communicator implementation uses them; dist/mpi_comm.cpp is the only file
// that needs MPI).
#include <cstring>
#include <vector>

#include "dist/comm.h"

namespace wiola::dist {

// ---- Request ------------------------------------------------------------------

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    if (impl_) impl_->wait();
    impl_ = std::move(o.impl_);
  }
  return *this;
}
Request::~Request() {
  if (impl_) impl_->wait();
}
bool Request::test() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  impl_.reset();
  return true;
}
void Request::wait() {
  if (!impl_) return;
  impl_->wait();
  impl_.reset();
}
void wait_all(std::vector<Request>& reqs) {
  for (auto& r : reqs) r.wait();
}

void Comm::count_traffic(const char* op, size_t count, DType t, int root) {
  const auto is = [op](const char* name) { return std::strcmp(op, name) == 0; };
  const double n = double(count * dtype_bytes(t)), p = double(size());
  double payload = n, wire = 0;
  if (is("all_reduce")) wire = 2.0 * (p - 1) / p * n;
  else if (is("reduce_scatter_sum") || is("all_gather")) { payload = n * p; wire = (p - 1) * n; }
  else if (is("broadcast")) wire = rank() == root ? n : 0;
  else if (is("isend")) wire = n;
  else if (is("irecv")) payload = 0;
  if (p == 1) wire = 0;  // one rank puts nothing on the wire, whatever the operation
  ++traffic_.ops;
  traffic_.payload_bytes += uint64_t(payload);
  traffic_.wire_bytes += uint64_t(wire);
}

}  // namespace wiola::dist
