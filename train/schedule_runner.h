// The schedule runner: one step of this rank's pipeline schedule
// (train/stage_schedule.h), the forward and backward actions in the stage's
// order on the action's model chunk, with the boundary messages between
// them (received before, sent after each action, to and from the ranks
// holding the neighbouring global chunks) over a BoundaryLink
// (train/stage_link.h). It arms each chunk's gradient-ready reports for its
// last backward of the step (DP overlap) and tells its observers what runs:
// the accounting times the computes, the dump recorder reads each forward,
// the schedule trace writes the actions.
//
// A chunk is a StageChunk: the model's (ModelChunk, on a Model<float>), or
// a test's. Nothing here knows the communicator, so the runner of every
// stage can run in one process (tests/train/test_schedule_runner.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dist/schedule.h"
#include "kernels/ptr.h"
#include "train/stage_link.h"
#include "train/stage_schedule.h"

namespace wiola {

template <class T>
class Model;

// One model chunk as the runner drives it (Model's pipeline-stage interface,
// model/model.h): where each message goes or comes from, and the compute.
class StageChunk {
 public:
  virtual ~StageChunk() = default;
  virtual std::vector<Ptr> fwd_in(int slot) = 0;
  virtual std::vector<CPtr> fwd_out(int slot) const = 0;
  virtual std::vector<Ptr> bwd_in() = 0;
  virtual std::vector<CPtr> bwd_out() const = 0;
  // A training forward of the micro-batch whose tokens are `tokens`.
  virtual void forward(int slot, const int32_t* tokens, double loss_scale) = 0;
  // op: Bwd (whole), BwdInput (B of a split backward) or BwdWeight (its W).
  virtual void backward(dist::Op op, int slot, int wslot) = 0;
  // While armed, the chunk reports gradients that became final.
  virtual void arm_grad_ready(bool on) = 0;
};

// A Model<float> as a StageChunk; `training` false: evaluation forwards
// (ATM off, model/model.h).
class ModelChunk final : public StageChunk {
 public:
  explicit ModelChunk(Model<float>& model, bool training = true) : model_(model), training_(training) {}
  std::vector<Ptr> fwd_in(int slot) override;
  std::vector<CPtr> fwd_out(int slot) const override;
  std::vector<Ptr> bwd_in() override;
  std::vector<CPtr> bwd_out() const override;
  void forward(int slot, const int32_t* tokens, double loss_scale) override;
  void backward(dist::Op op, int slot, int wslot) override;
  void arm_grad_ready(bool on) override;

 private:
  Model<float>& model_;
  bool training_;
};

// What the runner reports, in this order for each action: compute_begins,
// compute_ends (after the receive, before the send), action_done (after the
// send); after the last action and the flush, schedule_done.
class ScheduleObserver {
 public:
  virtual ~ScheduleObserver() = default;
  virtual void compute_begins(const dist::Action&) {}
  virtual void compute_ends(const dist::Action&) {}
  virtual void action_done(const dist::Action&) {}
  virtual void schedule_done(int64_t /*t*/) {}
};

class ScheduleRunner {
 public:
  // chunks[c]: this rank's chunk c (schedule.v of them). Each micro-batch's
  // tokens are `mb_tokens` values; loss_scale: what each forward's CE sum
  // is scaled by (this rank's mean: 1/(B·m·T)).
  ScheduleRunner(const StageSchedule& schedule, std::vector<StageChunk*> chunks, BoundaryLink& link, size_t mb_tokens,
                 double loss_scale);

  // Observers are told in the order they were added.
  void add_observer(ScheduleObserver& o) { observers_.push_back(&o); }

  // One step's actions. tokens: the rank's m micro-batches, one after the
  // other; report_grads: arm the gradient-ready reports of each chunk's last
  // backward (the norms' and whole backward's from its last B, the layers'
  // from its last W). step_context names the step in diagnostics
  // (dist::set_context).
  void run(int64_t t, const std::string& step_context, const int32_t* tokens, bool report_grads);
  // What each forward's CE sum is scaled by from the next run on (documents:
  // it depends on the step's counted targets).
  void set_loss_scale(double s) { loss_scale_ = s; }

 private:
  void forward(const dist::Action& a, const std::string& what, const int32_t* tokens);
  void backward(const dist::Action& a, const std::string& what, bool arm);
  void compute(const dist::Action& a, StageChunk& chunk, const int32_t* tokens);
  void done(const dist::Action& a);

  const StageSchedule& s_;
  std::vector<StageChunk*> chunks_;
  BoundaryLink& link_;
  size_t mb_tokens_;
  double loss_scale_;
  std::vector<ScheduleObserver*> observers_;
  std::vector<size_t> last_b_, last_w_;  // each chunk's last B (or whole backward) and W, by action index
  std::string context_;                  // the step's, during run()
};

}  // namespace wiola
