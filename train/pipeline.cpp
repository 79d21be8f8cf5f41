#include "train/pipeline.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "dist/agree.h"
#include "kernels/backend.h"
#include "kernels/cpu_info.h"
#include "perf/cost_model.h"
#include "train/accounting.h"
#include "train/data_plane.h"
#include "train/gather.h"
#include "util/error.h"

namespace wiola {
namespace {

using dist::DType;
using dist::GroupKind;
using dist::ReduceOp;

nlohmann::json blend_json(const std::vector<BlendSource>& blend) {
  nlohmann::json j = nlohmann::json::array();
  for (const BlendSource& b : blend) j.push_back({{"path", b.path}, {"weight", b.weight}});
  return j;
}

}  // namespace

Pipeline::Pipeline(const RunConfig& r, const TrainOptions& o, Ops<float>& b, dist::Comm& w)
    : rc(r), opt(o), ops(b), world(w), budget(StepBudget::of(r)), B(r.train.micro_batch), T(r.model.T),
      m(r.train.grad_accum), GB(r.global_batch()) {
  const auto& par = rc.parallel;
  me = dist::grid_coord(dist::GridConfig{par.tp, par.pp, par.dp}, world.rank());
}

void Pipeline::open_loader(uint64_t data_seed) {
  const auto& par = rc.parallel;
  loader = std::make_unique<TokenLoader>(rc.data_sources(), "train", T, int(GB), me.dp, par.dp, data_seed,
                                         rc.data.shuffle, rc.data.prefetch > 0, size_t(rc.data.max_open_shards));
  loader->expect(uint32_t(rc.model.V));
}

// The communicators (control plane MPI; data plane for the backend's
// memory), this rank's pipeline stage and its schedule.
void Pipeline::build_grid_and_schedule() {
  const auto& par = rc.parallel;
  // Ranks that share a GPU (several ranks on one device) cannot use NCCL.
  const std::string shared_gpu = world.size() > 1 ? ranks_sharing_a_gpu(ops, world) : "";
  DataPlane plane = choose_data_plane(ops, par.data_plane, world.size(), shared_gpu);
  data_plane = plane.name;
  if (root() && !shared_gpu.empty() && par.data_plane == "auto")
    std::fprintf(stderr, "wiola train: %s: tensors between ranks go through host memory (NCCL needs a GPU "
                 "per rank)\n", shared_gpu.c_str());
  grid = std::make_unique<dist::Grid>(dist::GridConfig{par.tp, par.pp, par.dp}, world, plane.factory);
  // TP ranks compute the TP-replicated tensors (norm γ/δ, φ, W_f) each on
  // its own; OpenBLAS's results depend on the thread count, so replicas
  // stay bit-identical only when a TP group shares one (checkpoints write
  // them once and check they agree).
  if (par.tp > 1) {
    const int64_t mine = cpu_threads();
    std::vector<int64_t> all(size_t(par.tp));
    grid->tp().all_gather(&mine, all.data(), 1, DType::I64);
    for (int r = 0; r < par.tp; ++r)
      if (all[size_t(r)] != mine) {
        if (me.tp != 0) throw dist::SetupFailed();
        fail("the TP ranks of stage ", me.pp, " (dp ", me.dp, ") use different thread counts (", mine, " and ",
             all[size_t(r)], "); set train.threads (or OMP_NUM_THREADS) the same on every rank of a TP group");
      }
  }
  stages = perf::pipeline_stages(rc.model, par.pp, par.stage_balance);
  std::tie(l0, l1) = stages[size_t(me.pp)];
  first = grid->first_stage();
  last = grid->last_stage();
  actions = par.schedule == "gpipe"   ? dist::schedule_gpipe(par.pp, me.pp, m)
            : par.schedule == "zb-h1" ? dist::schedule_zb_h1(par.pp, me.pp, m)
                                      : dist::schedule_1f1b(par.pp, me.pp, m);
  slots = std::max(1, dist::max_in_flight(actions));
}

void Pipeline::build_model_and_optimizer() {
  const auto& par = rc.parallel;
  const TrainSection& tr = rc.train;
  if (par.tp > 1) tpc = std::make_unique<dist::CommTpCollectives>(grid->data(GroupKind::Tp));
  ModelOptions mo;
  mo.micro_batch = B;
  mo.recompute = tr.recompute;
  mo.slots = slots;
  mo.split_backward = par.schedule == "zb-h1";  // B and W as separate actions
  mo.weight_slots = std::max(1, dist::max_pending_weight(actions));  // micro-batches between B and W
  mo.param_align = opt.param_align;
  model = std::make_unique<Model<float>>(ops, rc.model, ModelShard{me.tp, par.tp, l0, l1}, tpc.get(), mo);
  model->init(tr.seed);

  dist::AdamWConfig ac;
  ac.beta1 = tr.beta1; ac.beta2 = tr.beta2; ac.eps = tr.adam_eps;
  ac.weight_decay = tr.weight_decay; ac.clip = tr.clip;
  ac.zero = zero = par.zero && par.dp > 1;
  ac.nonfinite_fatal = tr.nonfinite_fatal;
  ac.zero_grads = true;  // each step leaves them zero for the next (the model starts with them zero)
  const bool dp = par.dp > 1;
  adam = std::make_unique<dist::DistAdamW>(
      ops, model->params(), model->grads(), model->n_params(),
      dist::optimizer_segments(model->layout().entries(), me.tp, !(par.pp > 1 && !first)), ac,
      dp ? &grid->data(GroupKind::Dp) : nullptr, world.size() > 1 ? &grid->mp() : nullptr,
      dp ? &grid->dp() : nullptr);
  adam->set_weight_copy(model->weight_copy());  // no Model::refresh_weights after a step
  // Overlap: the last micro-batch's backward reports finished layers, whose
  // buckets start their DP reduction while earlier layers still compute.
  overlap = par.overlap && dp;
  if (overlap) model->set_grad_ready([this](size_t off, size_t n) { adam->grad_ready(off, n); });
  embed = model->layout().try_find("model.embed_tokens.weight");
  link = std::make_unique<StageLink>(ops, grid->data(GroupKind::Pp), model->boundary_dtype(),
                                     size_t(B) * T * rc.model.d);
}

double Pipeline::world_loss(const AtmSaving& mine, AtmSaving& job) {
  const double local = model->take_loss_sum();
  double v[4] = {(last && me.tp == 0) ? local : 0.0, mine.mu_sum, mine.layers, mine.saved_flops};
  if (world.size() > 1) world.all_reduce(v, 4, ReduceOp::Sum);
  job = {v[1], v[2], v[3]};
  return v[0];
}

std::vector<float> Pipeline::gather_backend(const float* buf) {
  std::vector<float> host(model->n_params());
  ops.download(host.data(), buf, host.size() * sizeof(float));
  return gather_full(*grid, rc.model, model->layout(), host, stages);
}

size_t Pipeline::padded_params() const {
  return zero ? adam->shard_elems() * size_t(rc.parallel.dp) : model->n_params();
}

// What a manifest records about the run besides its identity (informative:
// resume checks only the identity).
nlohmann::json Pipeline::checkpoint_info() const {
  const auto& par = rc.parallel;
  nlohmann::json st = nlohmann::json::array();
  for (const auto& [a, b] : stages) st.push_back({a, b});
  const auto pr = ops.precision();
  return {{"config", run_config_to_toml(rc)},
          {"layout", {{"tp", par.tp}, {"pp", par.pp}, {"dp", par.dp}, {"zero", zero}, {"stages", st}}},
          {"backend", ops.name()},
          {"backend_options", backend_option_fields(rc.train.backend_options)},
          {"precision", {{"activations", dist::dtype_name(pr.act)}, {"residual", dist::dtype_name(pr.residual)},
                         {"weights", dist::dtype_name(pr.weight)}}},
          {"threads_per_rank", cpu_threads()},
          {"simd", cpu_simd_target()},  // the kernels' run-time target on this rank
          {"cpu", host_cpu_model()},
          {"schedule", {{"t_max", budget.t_max}, {"warmup", budget.warmup}, {"lr_max", rc.train.lr_max},
                        {"lr_min", rc.train.lr_min}}},
          {"data_path", rc.data.path},
          {"data_blend", blend_json(rc.data.blend)}};
}

}  // namespace wiola
