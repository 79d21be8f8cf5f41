// Point-to-point messages between neighbouring pipeline stages, on the
// pipeline group's data plane. A message is several [N, d] tensors packed
// into one backend buffer. Sends are non-blocking from a private backend
// copy (the model reuses its buffers at once), so no send ever waits for the
// peer: the schedule alone orders the job, as in dist::simulate_pipeline.
// Tags: tag() below, one per micro-batch, direction and chunk boundary. A
// message to this rank itself (two chunks of one rank next to each other:
// the V schedule's middle, or one rank holding every chunk) stays in a
// local mailbox, keyed by its tag; its buffers are reused.
#pragma once

#include <deque>
#include <map>
#include <vector>

#include "dist/comm.h"
#include "kernels/ops.h"

namespace wiola {

// Messages across model-chunk boundaries, as the schedule runner
// (train/schedule_runner.h) and the validator use them: StageLink below on
// the pipeline group's data plane, or an in-process queue in tests.
class BoundaryLink {
 public:
  virtual ~BoundaryLink() = default;
  virtual void send(const std::vector<CPtr>& ts, int peer, int tag) = 0;
  // Blocking; unpacks into ts.
  virtual void recv(const std::vector<Ptr>& ts, int peer, int tag) = 0;
  // Waits for every pending send.
  virtual void flush() = 0;
};

class StageLink final : public BoundaryLink {
 public:
  // pp_data: the data-plane communicator of the pipeline group; every tensor
  // holds `tensor_elems` elements of type `t`.
  StageLink(Ops<float>& ops, dist::Comm& pp_data, DType t, size_t tensor_elems);
  ~StageLink() override;
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;

  // The tag of batch i of n (a step's micro-batches, or the evaluation's
  // batches) across the boundary between global chunks g − 1 and g, forward
  // or backward: unique among a step's messages on any link.
  static int tag(int g, int i, int n, bool backward) { return 2 * (g * n + i) + (backward ? 1 : 0); }

  void send(const std::vector<CPtr>& ts, int peer, int tag) override;
  // Blocking (bounded by the communication timeout); unpacks into ts.
  void recv(const std::vector<Ptr>& ts, int peer, int tag) override;
  void flush() override;

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
  std::vector<DynBuffer<float>> spare_;      // mailbox buffers received, for the next sends
};

}  // namespace wiola
