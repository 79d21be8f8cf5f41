#include "train/pipeline.h"

#include <algorithm>
#include <cstdio>

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
  // The chunked schedules send between the last rank and the first and both
  // ways on one link, which the NCCL plane's in-order pipeline lanes do not
  // carry: their pipeline messages go through host memory (tags match
  // them), the other groups stay on NCCL.
  const bool chunked = par.pp > 1 && dist::chunked(par.schedule);
  DataPlane plane = choose_data_plane(ops, par.data_plane, world.size(), shared_gpu, chunked);
  data_plane = plane.name;
  if (root() && !shared_gpu.empty() && par.data_plane == DataPlaneMode::Auto)
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
  cut_chunks();
  actions = par.schedule == dist::Schedule::GPipe         ? dist::schedule_gpipe(par.pp, me.pp, m)
            : par.schedule == dist::Schedule::ZbH1        ? dist::schedule_zb_h1(par.pp, me.pp, m)
            : par.schedule == dist::Schedule::Interleaved ? dist::schedule_interleaved(par.pp, me.pp, m, v)
            : par.schedule == dist::Schedule::ZbV         ? dist::schedule_zb_v(par.pp, me.pp, m)
                                            : dist::schedule_1f1b(par.pp, me.pp, m);
  // Each chunk's micro-batches go through it in order, so the ones alive
  // (forward to backward) and those waiting between B and W are windows of
  // consecutive micro-batches: slot micro % slots is free when it is reused.
  for (int c = 0; c < v; ++c) {
    const std::vector<dist::Action> mine = dist::chunk_actions(actions, c);
    chunk_slots.push_back(std::max(1, dist::max_in_flight(mine)));
    chunk_weight_slots.push_back(std::max(1, dist::max_pending_weight(mine)));
  }
  slots = *std::max_element(chunk_slots.begin(), chunk_slots.end());
}

// The layers of the p·v global chunks and which of them every rank holds,
// as the cost model cuts them (perf::chunk_cuts: the stage balancer over
// p·v stages, "compute" leaving the head's chunk fewer layers).
void Pipeline::cut_chunks() {
  const perf::Layout lay = rc.layout();
  v = perf::chunks_per_rank(lay);
  placement = perf::chunk_placement(lay);
  chunk_cuts = perf::chunk_cuts(rc.model, lay);
  stages.clear();
  for (int s = 0; s < rc.parallel.pp; ++s) stages.push_back(perf::rank_chunks(rc.model, lay, s));
  chunk_layers = stages[size_t(me.pp)];
  const int head_rank = chunk_rank(n_global_chunks() - 1);
  first = me.pp == chunk_rank(0);
  last = me.pp == head_rank;
  embed_split = head_rank != chunk_rank(0);
}

void Pipeline::build_model_and_optimizer() {
  const auto& par = rc.parallel;
  const TrainSection& tr = rc.train;
  if (par.tp > 1) tpc = std::make_unique<dist::CommTpCollectives>(grid->data(GroupKind::Tp));
  ModelOptions mo;
  mo.micro_batch = B;
  mo.recompute = tr.recompute;
  mo.split_backward = dist::split_backward(par.schedule);  // B and W as separate actions
  mo.param_align = opt.param_align;
  if (v > 1) make_store();
  for (int c = 0; c < v; ++c) {
    mo.slots = chunk_slots[size_t(c)];
    mo.weight_slots = chunk_weight_slots[size_t(c)];  // micro-batches between B and W
    const auto [a, b] = chunk_layers[size_t(c)];
    chunks.push_back(std::make_unique<Model<float>>(ops, rc.model, ModelShard{me.tp, par.tp, a, b}, tpc.get(), mo,
                                                    store.get()));
  }
  model = chunks.front().get();
  model->init(tr.seed);  // with a store: every chunk's tensors

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
  if (overlap)
    for (auto& c : chunks) c->set_grad_ready([this](size_t off, size_t n) { adam->grad_ready(off, n); });
  embed = model->layout().try_find("model.embed_tokens.weight");
  link = std::make_unique<StageLink>(ops, grid->data(GroupKind::Pp), model->boundary_dtype(),
                                     size_t(B) * T * rc.model.d);
}

// One flat layout of every chunk's tensors and its buffers (zeroed: the
// gradients accumulate from zero, the parameters are initialised next).
void Pipeline::make_store() {
  const Precision pr = ops.precision();
  ParamLayout lay(rc.model, me.tp, rc.parallel.tp, chunk_layers, opt.param_align);
  const size_t n = lay.total();
  store_params = Buffer<float>(ops, n);
  store_grads = Buffer<float>(ops, n);
  ops.zero(store_params.data(), store_params.bytes());
  ops.zero(store_grads.data(), store_grads.bytes());
  if (pr.separate_weights || pr.weight != dtype_of<float>()) store_weights = DynBuffer<float>(ops, pr.weight, n);
  store = std::make_unique<ParamStore<float>>(
      ParamStore<float>{std::move(lay), store_params.data(), store_grads.data(), store_weights.data()});
}

Model<float>& Pipeline::head() {
  for (auto& c : chunks)
    if (c->shard().last_stage(rc.model)) return *c;
  return *chunks.front();
}

Model<float>::Memory Pipeline::memory() const {
  Model<float>::Memory r;
  for (const auto& c : chunks) {
    const auto mm = c->memory();
    r.master += mm.master; r.grads += mm.grads; r.weights += mm.weights;
    r.activations += mm.activations; r.workspace += mm.workspace;
  }
  r.master += store_params.bytes();
  r.grads += store_grads.bytes();
  r.weights += store_weights.bytes();
  return r;
}

std::vector<Model<float>::AtmStats> Pipeline::atm_stats() const {
  std::vector<Model<float>::AtmStats> all;
  for (const auto& c : chunks) {
    const auto mine = c->atm_stats();
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  return all;
}

double Pipeline::world_loss(const AtmSaving& mine, AtmSaving& job) {
  const double local = head().take_loss_sum();
  double sums[4] = {(last && me.tp == 0) ? local : 0.0, mine.mu_sum, mine.layers, mine.saved_flops};
  if (world.size() > 1) world.all_reduce(sums, 4, ReduceOp::Sum);
  job = {sums[1], sums[2], sums[3]};
  return sums[0];
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
  nlohmann::json st = nlohmann::json::array();  // the global chunks' layers (one per stage: the stages')
  for (const auto& [a, b] : chunk_cuts) st.push_back({a, b});
  const auto pr = ops.precision();
  return {{"config", run_config_to_toml(rc)},
          {"layout", {{"tp", par.tp}, {"pp", par.pp}, {"dp", par.dp}, {"zero", zero}, {"stages", st},
                      {"chunks_per_rank", v},
                      {"chunk_placement", placement == dist::ChunkPlacement::V ? "v" : "interleaved"}}},
          {"backend", ops.name()},
          {"backend_options", backend_option_fields(rc.train.backend_options)},
          {"precision", {{"activations", dist::dtype_name(pr.act)}, {"residual", dist::dtype_name(pr.residual)},
                         {"weights", dist::dtype_name(pr.weight)}}},
          {"threads_per_rank", cpu_threads()},
          {"simd", cpu_simd_target()},  // the kernels' run-time target on this rank
          {"cpu", host_cpu_model()},
          {"blas", ops.device_name().empty() ? cpu_blas_json() : nlohmann::json()},  // the CPU backend's kernels
          {"schedule", {{"t_max", budget.t_max}, {"warmup", budget.warmup}, {"lr_max", rc.train.lr_max},
                        {"lr_min", rc.train.lr_min}}},
          {"data_path", rc.data.path},
          {"data_blend", blend_json(rc.data.blend)}};
}

}  // namespace wiola
