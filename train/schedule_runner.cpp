#include "train/schedule_runner.h"

#include <utility>

#include "dist/diagnostics.h"
#include "model/model.h"

namespace wiola {

using dist::Action;
using dist::Op;

// ---- ModelChunk -------------------------------------------------------------------
std::vector<Ptr> ModelChunk::fwd_in(int slot) { return model_.fwd_in(slot); }
std::vector<CPtr> ModelChunk::fwd_out(int slot) const { return model_.fwd_out(slot); }
std::vector<Ptr> ModelChunk::bwd_in() { return model_.bwd_in(); }
std::vector<CPtr> ModelChunk::bwd_out() const { return model_.bwd_out(); }
void ModelChunk::forward(int slot, const int32_t* tokens, double loss_scale) {
  model_.stage_forward(slot, tokens, loss_scale, training_);
}
void ModelChunk::backward(Op op, int slot, int wslot) {
  if (op == Op::BwdWeight) model_.stage_backward_weight(slot, wslot);
  else if (op == Op::BwdInput) model_.stage_backward_input(slot, wslot);
  else model_.stage_backward(slot);
}
void ModelChunk::arm_grad_ready(bool on) { model_.arm_grad_ready(on); }

// ---- ScheduleRunner ---------------------------------------------------------------
// Gradient-ready reports come from each chunk's last backward in the step
// (its whole backward, or with a split one the norm's from the last B and
// the layers' from the last W): each range once.
ScheduleRunner::ScheduleRunner(const StageSchedule& schedule, std::vector<StageChunk*> chunks, BoundaryLink& link,
                               size_t mb_tokens, double loss_scale)
    : s_(schedule),
      chunks_(std::move(chunks)),
      link_(link),
      mb_tokens_(mb_tokens),
      loss_scale_(loss_scale),
      last_b_(size_t(schedule.v), schedule.actions.size()),
      last_w_(size_t(schedule.v), schedule.actions.size()) {
  for (size_t k = 0; k < s_.actions.size(); ++k) {
    const Action& a = s_.actions[k];
    if (a.op == Op::BwdWeight) last_w_[size_t(a.chunk)] = k;
    else if (a.op != Op::Fwd) last_b_[size_t(a.chunk)] = k;
  }
}

void ScheduleRunner::run(int64_t t, const std::string& step_context, const int32_t* tokens, bool report_grads) {
  context_ = step_context;
  for (size_t k = 0; k < s_.actions.size(); ++k) {
    const Action& a = s_.actions[k];
    const int g = s_.global_chunk(a.chunk);
    const std::string what =
        " micro-batch " + std::to_string(a.micro) + (s_.v > 1 ? " chunk " + std::to_string(g) : "");
    if (a.op == Op::Fwd) {
      forward(a, what, tokens + size_t(a.micro) * mb_tokens_);
    } else {
      const size_t last = a.op == Op::BwdWeight ? last_w_[size_t(a.chunk)] : last_b_[size_t(a.chunk)];
      backward(a, what, report_grads && k == last);
    }
  }
  link_.flush();
  for (ScheduleObserver* o : observers_) o->schedule_done(t);
}

void ScheduleRunner::forward(const Action& a, const std::string& what, const int32_t* tokens) {
  StageChunk& chunk = *chunks_[size_t(a.chunk)];
  const int g = s_.global_chunk(a.chunk), slot = a.micro % s_.chunk_slots[size_t(a.chunk)];
  dist::set_context(context_ + " forward" + what);
  if (g > 0) link_.recv(chunk.fwd_in(slot), s_.chunk_rank(g - 1), StageLink::tag(g, a.micro, s_.m, false));
  compute(a, chunk, tokens);
  if (g + 1 < s_.n_global_chunks())
    link_.send(chunk.fwd_out(slot), s_.chunk_rank(g + 1), StageLink::tag(g + 1, a.micro, s_.m, false));
  done(a);
}

// The whole backward, B of a split one (the input gradients: received from
// the next chunk, sent to the previous), or W (the weight-gradient GEMMs,
// no messages).
void ScheduleRunner::backward(const Action& a, const std::string& what, bool arm) {
  StageChunk& chunk = *chunks_[size_t(a.chunk)];
  const int g = s_.global_chunk(a.chunk);
  const bool weight = a.op == Op::BwdWeight;
  dist::set_context(context_ + (weight ? " weight gradients" : " backward") + what);
  if (!weight && g + 1 < s_.n_global_chunks())
    link_.recv(chunk.bwd_in(), s_.chunk_rank(g + 1), StageLink::tag(g + 1, a.micro, s_.m, true));
  chunk.arm_grad_ready(arm);
  compute(a, chunk, nullptr);
  chunk.arm_grad_ready(false);
  if (!weight && g > 0) link_.send(chunk.bwd_out(), s_.chunk_rank(g - 1), StageLink::tag(g, a.micro, s_.m, true));
  done(a);
}

void ScheduleRunner::compute(const Action& a, StageChunk& chunk, const int32_t* tokens) {
  const int slot = a.micro % s_.chunk_slots[size_t(a.chunk)];
  const int wslot = a.micro % s_.chunk_weight_slots[size_t(a.chunk)];
  for (ScheduleObserver* o : observers_) o->compute_begins(a);
  if (a.op == Op::Fwd) chunk.forward(slot, tokens, loss_scale_);
  else chunk.backward(a.op, slot, wslot);
  for (ScheduleObserver* o : observers_) o->compute_ends(a);
}

void ScheduleRunner::done(const Action& a) {
  for (ScheduleObserver* o : observers_) o->action_done(a);
}

}  // namespace wiola
