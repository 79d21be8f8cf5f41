#include "train/rank_model.h"

#include <algorithm>

#include "train/run_settings.h"
#include "train/stage_layers.h"
#include "train/stage_schedule.h"

namespace wiola {

void RankModel::build(const RunSettings& run, const StageLayers& layers, const StageSchedule& schedule,
                      TpCollectives* tpc) {
  const RunConfig& rc = run.rc;
  ModelOptions mo;
  mo.micro_batch = run.B;
  mo.recompute = rc.train.recompute;
  mo.split_backward = dist::split_backward(rc.parallel.schedule);  // B and W as separate actions
  mo.param_align = run.opt.param_align;
  mo.documents_eos = run.documents_eos;
  mo.z_loss = rc.train.z_loss;
  if (layers.v > 1) make_store(run, layers.chunk_layers);
  for (int c = 0; c < layers.v; ++c) {
    mo.slots = schedule.chunk_slots[size_t(c)];
    mo.weight_slots = schedule.chunk_weight_slots[size_t(c)];  // micro-batches between B and W
    const auto [a, b] = layers.chunk_layers[size_t(c)];
    chunks.push_back(std::make_unique<Model<float>>(run.ops, rc.model, ModelShard{run.me.tp, rc.parallel.tp, a, b}, tpc,
                                                    mo, store.get()));
  }
  model = chunks.front().get();
  model->init(rc.train.seed);  // with a store: every chunk's tensors
  embed = model->layout().try_find("model.embed_tokens.weight");
}

// One flat layout of every chunk's tensors and its buffers (zeroed: the
// gradients accumulate from zero, the parameters are initialised next).
void RankModel::make_store(const RunSettings& run, const LayerRanges& layers) {
  Ops<float>& ops = run.ops;
  const Precision pr = ops.precision();
  ParamLayout lay(run.rc.model, run.me.tp, run.rc.parallel.tp, layers, run.opt.param_align);
  const size_t n = lay.total();
  store_params = Buffer<float>(ops, n);
  store_grads = Buffer<float>(ops, n);
  ops.zero(store_params.data(), store_params.bytes());
  ops.zero(store_grads.data(), store_grads.bytes());
  if (pr.separate_weights || pr.weight != dtype_of<float>()) store_weights = DynBuffer<float>(ops, pr.weight, n);
  store = std::make_unique<ParamStore<float>>(
      ParamStore<float>{std::move(lay), store_params.data(), store_grads.data(), store_weights.data()});
}

Model<float>& RankModel::head() {
  for (auto& c : chunks)
    if (c->shard().last_stage(c->config())) return *c;
  return *chunks.front();
}

Model<float>::Memory RankModel::memory() const {
  Model<float>::Memory r;
  for (const auto& c : chunks) {
    const auto mm = c->memory();
    r.master += mm.master;
    r.grads += mm.grads;
    r.weights += mm.weights;
    r.activations += mm.activations;
    r.workspace += mm.workspace;
  }
  r.master += store_params.bytes();
  r.grads += store_grads.bytes();
  r.weights += store_weights.bytes();
  return r;
}

std::vector<Model<float>::AtmStats> RankModel::atm_stats() const {
  std::vector<Model<float>::AtmStats> all;
  for (const auto& c : chunks) {
    const auto mine = c->atm_stats();
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  return all;
}

}  // namespace wiola
