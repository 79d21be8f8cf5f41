#include "train/rank_optimizer.h"

#include "train/rank_comms.h"
#include "train/rank_model.h"
#include "train/run_settings.h"

namespace wiola {

void RankOptimizer::build(const RunSettings& run, RankComms& comms, RankModel& model, bool first) {
  const auto& par = run.rc.parallel;
  const TrainSection& tr = run.rc.train;
  Model<float>& m = *model.model;
  dist::Grid& grid = *comms.grid;
  dist::AdamWConfig ac;
  ac.beta1 = tr.beta1;
  ac.beta2 = tr.beta2;
  ac.eps = tr.adam_eps;
  ac.weight_decay = tr.weight_decay;
  ac.clip = tr.clip;
  ac.zero = zero = par.zero && par.dp > 1;
  ac.nonfinite_fatal = tr.nonfinite_fatal;
  ac.zero_grads = true;  // each step leaves them zero for the next (the model starts with them zero)
  dp = par.dp;
  const bool dp_group = par.dp > 1;
  adam = std::make_unique<dist::DistAdamW>(
      run.ops, m.params(), m.grads(), m.n_params(),
      dist::optimizer_segments(m.layout().entries(), run.me.tp, !(par.pp > 1 && !first)), ac,
      dp_group ? &grid.data(dist::GroupKind::Dp) : nullptr, run.world.size() > 1 ? &grid.mp() : nullptr,
      dp_group ? &grid.dp() : nullptr);
  adam->set_weight_copy(m.weight_copy());  // no Model::refresh_weights after a step
  // Overlap: the last micro-batch's backward reports finished layers, whose
  // buckets start their DP reduction while earlier layers still compute.
  overlap = par.overlap && dp_group;
  if (overlap)
    for (auto& c : model.chunks) c->set_grad_ready([this](size_t off, size_t n) { adam->grad_ready(off, n); });
}

size_t RankOptimizer::padded_params(const RankModel& model) const {
  return zero ? adam->shard_elems() * size_t(dp) : model.model->n_params();
}

}  // namespace wiola
