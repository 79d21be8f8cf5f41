#include "perf/cost_model.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "dist/grid.h"
#include "dist/optimizer.h"
#include "kernels/backend.h"
#include "model/flops.h"
#include "model/model.h"
#include "model/params.h"
#include "util/error.h"

namespace wiola::perf {

std::string Layout::name() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "tp%d pp%d dp%d, %dx%d%s%s%s", tp, pp, dp, micro_batch, micro_batches,
                zero_active() ? ", zero" : "", recompute ? ", recompute" : "",
                schedule == dist::Schedule::OneFOneB ? "" : (", " + std::string(to_string(schedule))).c_str());
  if (schedule == dist::Schedule::Interleaved) return buf + (" v" + std::to_string(virtual_stages));
  return buf;
}

std::vector<std::pair<int, int>> pipeline_stages(const ModelConfig& c, int pp, StageBalance balance) {
  if (balance == StageBalance::Layers) {
    std::vector<std::pair<int, int>> out;
    for (int s = 0; s < pp; ++s) out.push_back(dist::stage_layers(c.L, pp, s));
    return out;
  }
  // FLOPs per token, forward + backward: 6 per parameter of a layer plus
  // causal attention (QK and PV over ~T/2 keys, 6·T·d); the tied head
  // 6·V·d. The embedding lookup costs nothing comparable.
  const int64_t per_layer = (c.param_count() - int64_t(c.V) * c.d - 2 * c.d) / c.L;
  const double layer = 6.0 * double(per_layer) + 6.0 * c.T * c.d;
  return dist::balanced_stages(std::vector<double>(size_t(c.L), layer), 0.0, 6.0 * c.V * c.d, pp);
}

ModelShard stage_shard(const ModelConfig& c, const Layout& lay, int stage) {
  ModelShard s;
  s.tp_rank = 0;
  s.tp_size = lay.tp;
  if (int(lay.cuts.size()) == lay.pp + 1) {  // the chunk balancer's cut (a layout of p·v units)
    bool increasing = lay.cuts.front() == 0 && lay.cuts.back() == c.L;
    for (size_t k = 1; k < lay.cuts.size(); ++k) increasing = increasing && lay.cuts[k - 1] < lay.cuts[k];
    WIOLA_CHECK(increasing, "layout cuts: need 0 = cut_0 < cut_1 < ... < cut_n = L (", c.L, ")");
    s.layer_begin = lay.cuts[size_t(stage)];
    s.layer_end = lay.cuts[size_t(stage) + 1];
    return s;
  }
  const auto st = pipeline_stages(c, lay.pp, lay.stage_balance);
  s.layer_begin = st[size_t(stage)].first;
  s.layer_end = st[size_t(stage)].second;
  return s;
}

std::vector<dist::Action> stage_schedule(const Layout& lay, int stage) {
  const int m = lay.micro_batches;
  switch (lay.schedule) {
    case dist::Schedule::OneFOneB: return dist::schedule_1f1b(lay.pp, stage, m);
    case dist::Schedule::GPipe: return dist::schedule_gpipe(lay.pp, stage, m);
    case dist::Schedule::Interleaved: return dist::schedule_interleaved(lay.pp, stage, m, lay.virtual_stages);
    case dist::Schedule::ZbH1: return dist::schedule_zb_h1(lay.pp, stage, m);
    case dist::Schedule::ZbV: return dist::schedule_zb_v(lay.pp, stage, m);
  }
  fail("unknown pipeline schedule ", int(lay.schedule));
}

int chunks_per_rank(const Layout& lay) {
  return lay.schedule == dist::Schedule::Interleaved ? lay.virtual_stages : lay.schedule == dist::Schedule::ZbV ? 2 : 1;
}

dist::ChunkPlacement chunk_placement(const Layout& lay) {
  return lay.schedule == dist::Schedule::ZbV ? dist::ChunkPlacement::V : dist::ChunkPlacement::Interleaved;
}

std::vector<std::pair<int, int>> chunk_cuts(const ModelConfig& c, const Layout& lay) {
  const int n = lay.pp * chunks_per_rank(lay);
  if (int(lay.cuts.size()) == n + 1) {
    Layout units = lay;
    units.pp = n;
    std::vector<std::pair<int, int>> out;
    for (int g = 0; g < n; ++g) {
      const ModelShard s = stage_shard(c, units, g);
      out.push_back({s.layer_begin, s.end(c)});
    }
    return out;
  }
  return pipeline_stages(c, n, lay.stage_balance);
}

LayerRanges rank_chunks(const ModelConfig& c, const Layout& lay, int stage) {
  const auto cuts = chunk_cuts(c, lay);
  LayerRanges out;
  for (int k = 0; k < chunks_per_rank(lay); ++k)
    out.push_back(cuts[size_t(dist::global_chunk(lay.pp, stage, k, chunk_placement(lay)))]);
  return out;
}

int stage_slots(const Layout& lay, int stage) {
  const int v = chunks_per_rank(lay);
  return std::max(1, (dist::max_in_flight(stage_schedule(lay, stage)) + v - 1) / v);
}

size_t rank_params(const ModelConfig& c, const Layout& lay, int stage) {
  return ParamLayout(c, 0, lay.tp, rank_chunks(c, lay, stage)).total();
}

size_t params_reduced(const ModelConfig& c, const Layout& lay, int stage, size_t bucket_bytes) {
  const size_t n = rank_params(c, lay, stage);
  return lay.zero_active() ? dist::zero_padded_elems(n, lay.dp, bucket_bytes) : n;
}

// One chunk's TP bytes (its layers and the embedding's and head's ends it holds).
static double chunk_tp_bytes(const ModelConfig& c, const Layout& lay, const ModelShard& s, double N, double d, double m,
                             double f) {
  if (lay.tp <= 1) return 0;
  const double nl = s.end(c) - s.layer_begin;
  // Per micro-batch: 3 all-reduces of [N,d] per layer forward (A, a, b),
  // 2 in backward (column-parallel input gradients), 3 more when the
  // backward recomputes the forward; one per summary gradient made here;
  // the embedding output (first stage); CE max/sum-exp/target [N] and the
  // head input gradient [N,d] (last stage); dφ (one double per layer).
  double elems = nl * (5 + (lay.recompute ? 3 : 0)) * N * d + nl * N * d;
  if (s.first_stage()) elems += N * d;
  if (s.last_stage(c)) elems += 3 * N + N * d;
  const double bytes = m * (elems * f + nl * 8);
  return 2.0 * (lay.tp - 1) / lay.tp * bytes;
}

Traffic rank_traffic(const ModelConfig& c, const Layout& lay, int stage, double padded_params, size_t elem_bytes) {
  const double N = double(lay.micro_batch) * c.T, d = c.d, m = lay.micro_batches, f = double(elem_bytes);
  const int v = chunks_per_rank(lay), n_chunks = lay.pp * v;
  const dist::ChunkPlacement pl = chunk_placement(lay);
  const LayerRanges chunks = rank_chunks(c, lay, stage);
  Traffic t;
  for (int k = 0; k < v; ++k) {
    const int g = dist::global_chunk(lay.pp, stage, k, pl);
    const ModelShard s{0, lay.tp, chunks[size_t(k)].first, chunks[size_t(k)].second};
    t.tp += chunk_tp_bytes(c, lay, s, N, d, m, f);
    // The boundaries with chunks on other ranks (zb-v: chunks p − 1 and p
    // meet on one rank and send nothing).
    if (g > 0 && dist::chunk_rank(lay.pp, g - 1, pl) != stage)
      t.pp += m * double(boundary_tensors_in(c, s)) * N * d * f;
    if (g + 1 < n_chunks && dist::chunk_rank(lay.pp, g + 1, pl) != stage)
      t.pp += m * double(boundary_tensors_out(c, s)) * N * d * f;
  }
  // DP: the gradient buckets (fp32), and with ZeRO the all-gather of one
  // double per rank that sums the shards' squared norms.
  if (lay.dp > 1)
    t.dp = 2.0 * (lay.dp - 1) / lay.dp * padded_params * 4 + (lay.zero_active() ? (lay.dp - 1) * 8.0 : 0.0);
  const int lookup = dist::chunk_rank(lay.pp, 0, pl), head = dist::chunk_rank(lay.pp, n_chunks - 1, pl);
  if (lookup != head && (stage == lookup || stage == head)) {
    const LocalDims ld(c, ModelShard{0, lay.tp, 0, -1});
    t.embed = double(ld.V) * d * 4;  // all-reduce between 2 ranks: 2·(1/2)·n
  }
  return t;
}

Memory rank_memory(const ModelConfig& c, const Layout& lay, int stage, const Precision& prec, size_t bucket_bytes) {
  // Each chunk as the trainer builds it (train/pipeline.cpp): the
  // activation slots its micro-batches need (those alive from F to B or W)
  // and the W operand sets of a split backward (ZB-H1, ZB-V); the
  // parameters, gradients and weight copy of every chunk in one flat buffer.
  const LayerRanges chunks = rank_chunks(c, lay, stage);
  const std::vector<dist::Action> sched = stage_schedule(lay, stage);
  // The layer contexts want an Ops; sizing touches none of its memory.
  static const std::unique_ptr<Ops<float>> sizing = make_backend<float>("cpu");
  Memory r;
  for (size_t k = 0; k < chunks.size(); ++k) {
    const std::vector<dist::Action> mine = dist::chunk_actions(sched, int(k));
    ModelOptions mo;
    mo.micro_batch = lay.micro_batch;
    mo.recompute = lay.recompute;
    mo.slots = std::max(1, dist::max_in_flight(mine));
    mo.split_backward = dist::split_backward(lay.schedule);
    mo.weight_slots = std::max(1, dist::max_pending_weight(mine));
    const auto mm =
        Model<float>::plan_memory(*sizing, c, ModelShard{0, lay.tp, chunks[k].first, chunks[k].second}, mo, prec);
    r.activations += double(mm.activations + mm.workspace);
  }
  const size_t n = rank_params(c, lay, stage);
  const bool copy = prec.separate_weights || prec.weight != dtype_of<float>();
  r.params = double(n) * 4 + (copy ? double(n) * double(dtype_bytes(prec.weight)) : 0.0);
  r.grads = double(n) * 4;
  const size_t shard = lay.zero_active() ? params_reduced(c, lay, stage, bucket_bytes) / size_t(lay.dp) : n;
  r.optimizer = 3.0 * double(shard) * 4;  // master shard, m, v (dist/optimizer.h state_bytes_this_rank)
  return r;
}

StageFlops stage_flops_split(const ModelConfig& c, const Layout& lay, int stage) {
  const ModelShard s = stage_shard(c, lay, stage);
  double layers = 0, weight = 0;  // forward + backward (x 3 of the forward); W
  for (int l = s.layer_begin; l < s.end(c); ++l) {
    layers += layer_step_flops(c, lay.micro_batch, l);
    weight += layer_weight_grad_flops(c, lay.micro_batch, l);
  }
  const double all = layers + (s.last_stage(c) ? head_step_flops(c, lay.micro_batch) : 0.0);
  if (s.last_stage(c)) weight += head_weight_grad_flops(c, lay.micro_batch);
  // Recompute: the backward reruns each layer's forward, 1/3 of its FLOPs.
  return {all / 3.0 / lay.tp, (2.0 * all / 3.0 + (lay.recompute ? layers / 3.0 : 0.0)) / lay.tp, weight / lay.tp};
}

double stage_flops(const ModelConfig& c, const Layout& lay, int stage) {
  const StageFlops f = stage_flops_split(c, lay, stage);
  return f.fwd + f.bwd;
}

double bubble_formula(const Layout& lay) {
  const int p = lay.pp, m = lay.micro_batches;
  return lay.schedule == dist::Schedule::Interleaved ? dist::bubble_fraction_interleaved(p, m, lay.virtual_stages)
                                                     : dist::bubble_fraction_predicted(p, m);
}

const char* bubble_formula_name(const Layout& lay) {
  return lay.schedule == dist::Schedule::Interleaved ? "((p-1)/v)/(m+(p-1)/v)" : "(p-1)/(m+p-1)";
}

dist::PipelineSim schedule_bubble(const ModelConfig& c, const Layout& lay) {
  if (lay.pp <= 1) return dist::PipelineSim{};
  // The pipeline's units: the stages, or the p·v chunks of an interleaved or
  // zb-v schedule (chunk g the stage g of the same layout cut into p·v
  // stages, or by lay.cuts).
  const int v = chunks_per_rank(lay);
  Layout units = lay;
  units.pp = lay.pp * v;
  units.schedule = dist::Schedule::OneFOneB;
  units.virtual_stages = 1;
  dist::StageCosts cost;
  for (int g = 0; g < units.pp; ++g) {
    const StageFlops f = stage_flops_split(c, units, g);
    cost.fwd.push_back(f.fwd);
    cost.bwd.push_back(f.bwd);
    cost.bwd_weight.push_back(std::min(f.bwd_weight, f.bwd));
  }
  std::vector<std::vector<dist::Action>> sched;
  for (int s = 0; s < lay.pp; ++s) sched.push_back(stage_schedule(lay, s));
  return dist::simulate_pipeline(sched, cost, chunk_placement(lay));
}

StageKinds stage_kinds(const ModelConfig& c, const Layout& lay, int stage) {
  const ModelShard s = stage_shard(c, lay, stage);
  const StageFlops f = stage_flops_split(c, lay, stage);
  const int nl = s.end(c) - s.layer_begin;
  StageKinds k;
  k.dh = c.dh();
  k.recompute = lay.recompute;
  // The causal attention's share of the forward: each layer's, split over TP by heads.
  k.attn_fwd = attention_step_flops(c, lay.micro_batch) / 3.0 * nl / c.L / lay.tp;
  k.gemm_fwd = f.fwd - k.attn_fwd;
  k.gemm_bwd = f.bwd - (lay.recompute ? 3.0 : 2.0) * k.attn_fwd;
  k.gemm_bwd_weight = f.bwd_weight;
  // The memory-bound rest, in tokens x d x layers (split over TP like the rest).
  k.units_fwd = double(lay.micro_batch) * c.T * c.d * nl / lay.tp;
  k.units_bwd = (lay.recompute ? 3.0 : 2.0) * k.units_fwd;
  return k;
}

}  // namespace wiola::perf
