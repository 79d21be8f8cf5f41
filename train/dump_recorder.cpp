#include "train/dump_recorder.h"

#include "dist/diagnostics.h"
#include "train/gather.h"
#include "train/pipeline.h"

namespace wiola {

DumpRecorder::DumpRecorder(Pipeline& pipe, const std::vector<std::pair<int64_t, std::string>>& dumps)
    : pipe_(pipe), dumps_(dumps.begin(), dumps.end()) {}

bool DumpRecorder::begin(int64_t t) {
  active_ = due(t);
  dump_ = StepDump{};
  atm_local_.clear();
  if (!active_) return false;
  Pipeline& p = pipe_;
  p.head().set_keep_logits(p.world.size() == 1);
  dump_.params = p.gather_backend(p.model->params());
  if (t == 1) return true;
  std::vector<float> mm, vv;
  p.adam->gather_moments(mm, vv);
  dump_.m = gather_full(*p.grid, p.rc.model, p.model->layout(), mm, p.stages);
  dump_.v = gather_full(*p.grid, p.rc.model, p.model->layout(), vv, p.stages);
  return true;
}

void DumpRecorder::after_forward(const Model<float>& model) {
  if (!active_) return;
  if (model.shard().last_stage(pipe_.rc.model)) {
    const auto& lg = model.last_logits();
    dump_.logits.insert(dump_.logits.end(), lg.begin(), lg.end());
  }
  for (int l = model.shard().layer_begin; l < model.shard().end(pipe_.rc.model); ++l) {
    const auto o = model.atm_open(l);
    if (!o.empty()) atm_local_[l].insert(atm_local_[l].end(), o.begin(), o.end());
  }
}

void DumpRecorder::grads() {
  if (!active_) return;
  Pipeline& p = pipe_;
  std::vector<float> host(p.model->n_params());
  p.ops.download(host.data(), p.model->grads(), host.size() * sizeof(float));
  if (p.rc.parallel.dp > 1) {
    p.grid->dp().all_reduce(host.data(), host.size(), dist::ReduceOp::Sum);
    for (float& x : host) x /= float(p.rc.parallel.dp);
  }
  dump_.grads = gather_full(*p.grid, p.rc.model, p.model->layout(), host, p.stages);
}

// Gathers the dump's tokens and ATM decisions, checks the TP ranks agree,
// and writes the file on rank 0 (docs/model.md §7).
void DumpRecorder::finish(int64_t t, const StepOutcome& out) {
  if (!active_) return;
  active_ = false;
  Pipeline& p = pipe_;
  p.head().set_keep_logits(false);
  dist::set_context(p.step_context(t) + " dump gather");
  dump_.params_after = p.gather_backend(p.model->params());
  std::vector<uint8_t> atm_flat;  // this rank's ATM layers in order
  for (auto& [l, v] : atm_local_) atm_flat.insert(atm_flat.end(), v.begin(), v.end());
  const TrainSection& tr = p.rc.train;
  if (p.rc.parallel.tp > 1) check_atm_agrees_over_tp(*p.grid, atm_flat, t);
  gather_tokens_and_atm(*p.grid, p.rc.model, p.stages, p.batch, atm_flat, p.loader->local_batch() * size_t(p.T),
                        dump_);
  if (!p.root()) return;
  dump_.cfg = p.rc.model;
  dump_.B = int(p.GB);
  dump_.loss = out.loss;
  dump_.grad_norm = out.grad_norm;
  dump_.float_attrs = {{"lr", out.lr}, {"lr_max", tr.lr_max}, {"lr_min", tr.lr_min},
                       {"beta1", tr.beta1}, {"beta2", tr.beta2}, {"adam_eps", tr.adam_eps},
                       {"weight_decay", tr.weight_decay}, {"clip", tr.clip}};
  dump_.int_attrs = {{"step", t}, {"adam_step", out.adam_step}, {"t_max", p.budget.t_max},
                     {"warmup", p.budget.warmup}};
  dist::set_context(p.step_context(t) + " writing the numerics dump");
  write_step_dump(dumps_.at(t), full_layout(p.rc.model, p.model->layout()), dump_);
}

}  // namespace wiola
