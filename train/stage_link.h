// Point-to-point messages between neighbouring pipeline stages, on the
// pipeline group's data plane. A message is several [N, d] tensors packed
// into one backend buffer. Sends are non-blocking from a private backend
// copy (the model reuses its buffers at once), so no send ever waits for the
// peer: the schedule alone orders the job, as in dist::simulate_pipeline.
// Tags: the caller's (train/pipeline.h link_tag: one per micro-batch,
// direction and chunk boundary). A message to this rank itself (two chunks
// of one rank next to each other: the V schedule's middle, or one rank
// holding every chunk) stays in a local mailbox, keyed by its tag.
#pragma once

#include <deque>
#include <map>
#include <vector>

#include "dist/comm.h"
#include "kernels/ops.h"

namespace wiola {

class StageLink {
 public:
  // pp_data: the data-plane communicator of the pipeline group; every tensor
  // holds `tensor_elems` elements of type `t`.
  StageLink(Ops<float>& ops, dist::Comm& pp_data, DType t, size_t tensor_elems);
  ~StageLink();
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;

  void send(const std::vector<CPtr>& ts, int peer, int tag);
  // Blocking (bounded by the communication timeout); unpacks into ts.
  void recv(const std::vector<Ptr>& ts, int peer, int tag);
  // Waits for every pending send.
  void flush();

 private:
  struct Pending {
    DynBuffer<float> data;
    dist::Request req;
  };
  Ops<float>& ops_;
  dist::Comm& pp_;
  DType t_;
  size_t each_;
  std::deque<Pending> pending_;  // stable addresses
  DynBuffer<float> staging_;
  std::map<int, DynBuffer<float>> mailbox_;  // messages to this rank, by tag
};

}  // namespace wiola
