#include "train/dump_recorder.h"

#include "dist/diagnostics.h"
#include "train/gather.h"
#include "train/rank_comms.h"
#include "train/rank_model.h"
#include "train/rank_optimizer.h"
#include "train/run_settings.h"
#include "train/stage_layers.h"
#include "train/train_data.h"

namespace wiola {

DumpRecorder::DumpRecorder(const RunSettings& run, const TrainData& data, RankComms& comms, RankModel& model,
                           RankOptimizer& optimizer, const StageLayers& layers,
                           const std::vector<std::pair<int64_t, std::string>>& dumps)
    : run_(run),
      data_(data),
      comms_(comms),
      model_(model),
      optimizer_(optimizer),
      layers_(layers),
      dumps_(dumps.begin(), dumps.end()) {}

std::vector<float> DumpRecorder::gather_backend(const float* buf) {
  const Model<float>& model = *model_.model;
  std::vector<float> host(model.n_params());
  run_.ops.download(host.data(), buf, host.size() * sizeof(float));
  return gather_full(*comms_.grid, run_.rc.model, model.layout(), host, layers_.stages);
}

bool DumpRecorder::begin(int64_t t) {
  active_ = due(t);
  dump_ = StepDump{};
  atm_local_.clear();
  if (!active_) return false;
  const ParamLayout& layout = model_.model->layout();
  model_.head().set_keep_logits(run_.world.size() == 1);
  dump_.params = gather_backend(model_.model->params());
  if (t == 1) return true;
  std::vector<float> mm, vv;
  optimizer_.adam->gather_moments(mm, vv);
  dump_.m = gather_full(*comms_.grid, run_.rc.model, layout, mm, layers_.stages);
  dump_.v = gather_full(*comms_.grid, run_.rc.model, layout, vv, layers_.stages);
  return true;
}

void DumpRecorder::compute_ends(const dist::Action& a) {
  if (!active_ || a.op != dist::Op::Fwd) return;
  const Model<float>& model = *model_.chunks[size_t(a.chunk)];
  if (model.shard().last_stage(run_.rc.model)) {
    const auto& lg = model.last_logits();
    dump_.logits.insert(dump_.logits.end(), lg.begin(), lg.end());
  }
  for (int l = model.shard().layer_begin; l < model.shard().end(run_.rc.model); ++l) {
    const auto o = model.atm_open(l);
    if (!o.empty()) atm_local_[l].insert(atm_local_[l].end(), o.begin(), o.end());
  }
}

void DumpRecorder::grads() {
  if (!active_) return;
  Model<float>& model = *model_.model;  // grads(): no const accessor
  const int dp = run_.rc.parallel.dp;
  std::vector<float> host(model.n_params());
  run_.ops.download(host.data(), model.grads(), host.size() * sizeof(float));
  if (dp > 1) {
    comms_.grid->dp().all_reduce(host.data(), host.size(), dist::ReduceOp::Sum);
    for (float& x : host) x /= float(dp);
  }
  dump_.grads = gather_full(*comms_.grid, run_.rc.model, model.layout(), host, layers_.stages);
}

// Gathers the dump's tokens and ATM decisions, checks the TP ranks agree,
// and writes the file on rank 0 (docs/model.md §7).
void DumpRecorder::finish(int64_t t, const StepOutcome& out) {
  if (!active_) return;
  active_ = false;
  const RunSettings& p = run_;
  model_.head().set_keep_logits(false);
  dist::set_context(p.step_context(t) + " dump gather");
  dump_.params_after = gather_backend(model_.model->params());
  std::vector<uint8_t> atm_flat;  // this rank's ATM layers in order
  for (auto& [l, v] : atm_local_) atm_flat.insert(atm_flat.end(), v.begin(), v.end());
  const TrainSection& tr = p.rc.train;
  if (p.rc.parallel.tp > 1) check_atm_agrees_over_tp(*comms_.grid, atm_flat, t);
  gather_tokens_and_atm(*comms_.grid, p.rc.model, layers_.stages, data_.batch, atm_flat,
                        data_.loader->local_batch() * size_t(p.T), dump_);
  if (!p.root()) return;
  dump_.cfg = p.rc.model;
  dump_.B = int(p.GB);
  dump_.loss = out.loss;
  dump_.grad_norm = out.grad_norm;
  dump_.float_attrs = {{"lr", out.lr},
                       {"lr_max", tr.lr_max},
                       {"lr_min", tr.lr_min},
                       {"beta1", tr.beta1},
                       {"beta2", tr.beta2},
                       {"adam_eps", tr.adam_eps},
                       {"weight_decay", tr.weight_decay},
                       {"clip", tr.clip}};
  dump_.int_attrs = {{"step", t}, {"adam_step", out.adam_step}, {"t_max", p.budget.t_max}, {"warmup", p.budget.warmup}};
  if (tr.z_loss > 0) {  // z-loss: its coefficient and the step's mean term (docs/model.md §7)
    dump_.float_attrs["z_loss"] = tr.z_loss;
    dump_.float_attrs["z_loss_term"] = out.z_loss;
  }
  if (p.documents_eos >= 0) {  // documents: the EOS id and each position's document start
    dump_.int_attrs["documents"] = 1;
    dump_.int_attrs["eos_id"] = p.documents_eos;
    dump_.doc_start.resize(size_t(dump_.B) * size_t(p.T));
    for (int b = 0; b < dump_.B; ++b)
      document_starts(dump_.tokens.data() + size_t(b) * (p.T + 1), 1, p.T, p.documents_eos,
                      dump_.doc_start.data() + size_t(b) * p.T);
  }
  dist::set_context(p.step_context(t) + " writing the numerics dump");
  write_step_dump(dumps_.at(t), full_layout(p.rc.model, model_.model->layout()), dump_);
}

}  // namespace wiola
