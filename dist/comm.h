// The communicator interface: a group of ranks and the collectives the
// training system needs, on flat buffers (pointer + element count + dtype).
// Pure C++: nothing above dist/ includes <mpi.h>. The MPI implementation is
// dist/mpi_comm.cpp; an NCCL one (CUDA backend) follows the same contract,
// which is why buffers, counts and in-place rules follow NCCL's:
//
//   all_reduce         recv[i] = op over ranks of send[i]; in place: send == recv
//   reduce_scatter_sum recv[0..c) = sum over ranks of send[rank*c .. rank*c+c),
//                      send holds size()*c elements;
//                      in place: recv == send + rank()*c
//   all_gather         recv[r*c .. r*c+c) = send of rank r, recv holds size()*c;
//                      in place: send == recv + rank()*c
//   broadcast          buf of `root` copied to every rank
//
// Two roles (see Grid): a control-plane communicator moves host memory
// (scalars, agreement, gathers to the host) and is always MPI; a data-plane
// communicator moves backend memory (activations, gradients, parameters):
// MPI itself for host-memory backends, MPI staged through host buffers
// (dist/staged_comm.h) for backends the host cannot touch, NCCL for GPUs.
// Every
// operation is collective over the group and must be called in the same order
// on all its ranks. Every wait is bounded by the process-wide timeout
// (dist/diagnostics.h): a rank that waits longer prints one diagnostic and
// ends the whole job, so a lost collective never hangs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace wiola::dist {

// Element types are the op interface's (kernels/dtype.h): a backend buffer's
// dtype is what goes on the wire.
using wiola::DType;
using wiola::dtype_bytes;
using wiola::dtype_name;
using wiola::dtype_of;
enum class ReduceOp { Sum, Max };

// Implementation side of a pending operation.
class RequestImpl {
 public:
  virtual ~RequestImpl() = default;
  // Non-blocking: true once complete (then finishes any post-processing).
  virtual bool test() = 0;
  // Blocks until complete, bounded by the process-wide timeout.
  virtual void wait() = 0;
};

// A pending non-blocking operation; empty requests are complete. Move-only.
// Destroying a pending request waits for it (buffers must outlive it).
class Request {
 public:
  Request() = default;
  explicit Request(std::unique_ptr<RequestImpl> impl) : impl_(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& o) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  bool pending() const { return impl_ != nullptr; }
  bool test();   // true when complete
  void wait();   // no-op when empty

 private:
  std::unique_ptr<RequestImpl> impl_;
};

void wait_all(std::vector<Request>& reqs);

// What a group's operations moved from this rank since the last reset:
// operations issued, payload bytes (the caller's buffer), and the bytes this
// rank puts on the wire under the standard ring/direct algorithms
// (all_reduce 2(p-1)/p·n, reduce_scatter and all_gather (p-1)·chunk,
// broadcast n at the root, send n, receive 0), and the wall seconds this
// rank spent blocked waiting for the group's operations to complete (the
// exposed communication time; the main thread waits, nothing else does),
// and the seconds the transfers ran on a device stream (busy_s: NCCL, from
// GPU events; 0 where the host itself waits, as over MPI). busy_s - wait_s
// is the communication hidden behind compute.
struct CommTraffic {
  uint64_t ops = 0, payload_bytes = 0, wire_bytes = 0;
  double wait_s = 0, busy_s = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;

  const CommTraffic& traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = CommTraffic{}; }

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Group name for diagnostics: "world", "tp", "pp", "dp", "embed", "mp", ...
  virtual const std::string& name() const = 0;

  // ---- non-blocking collectives (the primitives) ----------------------------
  virtual Request iall_reduce(const void* send, void* recv, size_t count,
                              DType t, ReduceOp op) = 0;
  virtual Request ireduce_scatter_sum(const void* send, void* recv,
                                      size_t recv_count, DType t) = 0;
  virtual Request iall_gather(const void* send, void* recv, size_t send_count,
                              DType t) = 0;
  virtual Request ibroadcast(void* buf, size_t count, DType t, int root) = 0;
  virtual Request ibarrier() = 0;

  // ---- point-to-point (ranks are ranks of this group) ------------------------
  virtual Request isend(const void* buf, size_t count, DType t, int peer,
                        int tag) = 0;
  virtual Request irecv(void* buf, size_t count, DType t, int peer,
                        int tag) = 0;

  // ---- blocking forms: the non-blocking call + a bounded wait ------------
  void all_reduce(const void* send, void* recv, size_t count, DType t,
                  ReduceOp op) {
    iall_reduce(send, recv, count, t, op).wait();
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t recv_count,
                          DType t) {
    ireduce_scatter_sum(send, recv, recv_count, t).wait();
  }
  void all_gather(const void* send, void* recv, size_t send_count, DType t) {
    iall_gather(send, recv, send_count, t).wait();
  }
  void broadcast(void* buf, size_t count, DType t, int root) {
    ibroadcast(buf, count, t, root).wait();
  }
  void barrier() { ibarrier().wait(); }

  // ---- typed conveniences ------------------------------------------------------
  template <class T>
  void all_reduce(T* buf, size_t count, ReduceOp op) {
    all_reduce(buf, buf, count, dtype_of<T>(), op);
  }
  template <class T>
  T all_reduce_value(T x, ReduceOp op) {
    all_reduce(&x, &x, 1, dtype_of<T>(), op);
    return x;
  }
  template <class T>
  void broadcast(T* buf, size_t count, int root) {
    broadcast(buf, count, dtype_of<T>(), root);
  }

  // Adds completed operations' exposed wait to traffic() where the waits
  // happen on a device (NCCL: GPU events); a no-op where wait() blocks the
  // host, which counts at once. Grid::traffic calls it.
  virtual void settle_traffic() {}

  // Sub-groups: ranks with equal `color` form a group, ordered by (key, rank).
  // Collective over this group. `name` labels the new group in diagnostics.
  virtual std::unique_ptr<Comm> split(int color, int key,
                                      const std::string& name) = 0;

 protected:
  // Implementations call this once per operation they issue.
  void count_traffic(const char* op, size_t count, DType t, int root = -1);
  // Where an implementation's requests add the seconds they block in wait()
  // (valid while this communicator lives; requests never outlive it).
  double* wait_clock() { return &traffic_.wait_s; }
  double* busy_clock() { return &traffic_.busy_s; }

 private:
  CommTraffic traffic_;
};

// How a Grid makes its data-plane communicators from its control-plane ones
// (dist/staged_comm.h: data_plane_for). Empty: the data plane is the control
// plane (backend buffers are host memory).
using DataPlaneFactory = std::function<std::unique_ptr<Comm>(Comm& ctrl)>;

}  // namespace wiola::dist
