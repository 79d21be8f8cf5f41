#include "perf/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "dist/grid.h"
#include "dist/placement.h"
#include "dist/optimizer.h"
#include "model/flops.h"
#include "util/error.h"

namespace wiola::perf {

namespace {

constexpr size_t kBucketBytes = dist::kDefaultBucketBytes;

// Ring collectives take 2(p-1) steps (all-reduce) or p-1 (reduce-scatter,
// all-gather), each paying the link's latency once.
double ring_latency(int p, double latency_s, bool all_reduce) {
  return p > 1 ? (all_reduce ? 2.0 : 1.0) * (p - 1) * latency_s : 0.0;
}

}  // namespace

// ---- workloads -----------------------------------------------------------------------

Workload wiola_workload(const ModelConfig& c, const Layout& lay, const Precision& prec) {
  Workload w;
  w.model = c.name;
  w.params = double(c.param_count());
  w.T = c.T;
  w.layout = lay;
  w.step_flops = train_step_flops(c, lay.global_batch());
  w.bubble_analytic = bubble_formula(lay);
  const double N = double(lay.micro_batch) * c.T, d = c.d, m = lay.micro_batches;
  const size_t res = dtype_bytes(prec.residual);
  for (int s = 0; s < lay.pp; ++s) {
    // The rank's chunks (one for the plain schedules): layers, ends, messages.
    const LayerRanges chunks = rank_chunks(c, lay, s);
    int nl = 0;
    bool first = false, last = false;
    int msg_tensors = 0;
    for (const auto& [a, b] : chunks) {
      const ModelShard ch{0, lay.tp, a, b};
      nl += b - a;
      first = first || ch.first_stage();
      last = last || ch.last_stage(c);
      msg_tensors = std::max(msg_tensors, boundary_tensors_out(c, ch));
    }
    StageWork sw;
    const StageFlops f = stage_flops_split(c, lay, s);
    sw.fwd_flops = f.fwd;
    sw.bwd_flops = f.bwd;
    sw.bwd_weight_flops = f.bwd_weight;
    sw.kinds = stage_kinds(c, lay, s);
    const size_t padded = params_reduced(c, lay, s, kBucketBytes);
    sw.traffic = rank_traffic(c, lay, s, double(padded), res);
    sw.tp_bytes = sw.traffic.tp / m;
    // The collectives rank_traffic counts: per layer 5 (+3 recomputed) [N,d]
    // sums, one summary gradient and dφ; the embedding output; CE's three
    // statistics and the head input gradient.
    if (lay.tp > 1) sw.tp_ops = nl * (7 + (lay.recompute ? 3 : 0)) + (first ? 1 : 0) + (last ? 4 : 0);
    sw.pp_msg_bytes = double(msg_tensors) * N * d * double(res);  // the largest message it sends
    sw.dp_bytes = sw.traffic.dp;
    const size_t n_local = rank_params(c, lay, s);
    const int buckets = int(dist::bucket_spans(n_local, lay.dp, kBucketBytes).size());
    sw.dp_ops = lay.dp > 1 ? (lay.zero_active() ? 2 * buckets : buckets) : 0;
    sw.embed_bytes = sw.traffic.embed;
    sw.opt_elems = lay.zero_active() ? double(padded) / lay.dp : double(n_local);
    sw.memory = rank_memory(c, lay, s, prec, kBucketBytes);
    w.stages.push_back(sw);
  }
  if (const int v = chunks_per_rank(lay); v > 1) {  // interleaved, zb-v
    WIOLA_CHECK(lay.pp * v <= c.L, to_string(lay.schedule), " schedule: pp x v = ", lay.pp * v, " chunks for ", c.L,
                " layers");
    Layout lc = lay;
    lc.pp = lay.pp * v;
    lc.schedule = dist::Schedule::OneFOneB;
    lc.virtual_stages = 1;
    w.chunks = wiola_workload(c, lc, prec).stages;
  }
  return w;
}

Workload gpt_workload(const GptConfig& g, const Layout& lay) {
  Workload w;
  w.model = g.name;
  w.params = g.params();
  w.T = g.T;
  w.layout = lay;
  const double b = lay.micro_batch, s = g.T, d = g.d, V = g.V, t = lay.tp;
  // Megatron-LM's model FLOPs (Narayanan et al. 2021): per layer forward
  // 24 b s d^2 + 4 b s^2 d, the output layer 2 b s d V; x 3 for training.
  const double layer_fwd = 24 * b * s * d * d + 4 * b * s * s * d, head_fwd = 2 * b * s * d * V;
  w.step_flops = 3.0 * (g.L * layer_fwd + head_fwd) * lay.micro_batches * lay.dp;
  w.bubble_analytic = dist::bubble_fraction_predicted(lay.pp, lay.micro_batches);
  const double act = 2, m = lay.micro_batches;  // bf16 activations
  for (int st = 0; st < lay.pp; ++st) {
    const auto [l0, l1] = dist::stage_layers(g.L, lay.pp, st);
    const double nl = l1 - l0;
    const bool first = st == 0, last = st == lay.pp - 1;
    StageWork sw;
    const double head = last ? head_fwd : 0.0;
    sw.fwd_flops = (nl * layer_fwd + head) / t;
    sw.bwd_flops = 2 * (nl * layer_fwd + head) / t + (lay.recompute ? nl * layer_fwd / t : 0.0);
    sw.bwd_weight_flops = (nl * 24 * b * s * d * d + head) / t;  // the weight GEMMs once
    // TP (no sequence parallelism): two [b,s,d] all-reduces per layer
    // forward and two backward, two more when the backward recomputes.
    if (lay.tp > 1) {
      sw.tp_ops = int(nl) * (lay.recompute ? 6 : 4) + (first ? 1 : 0) + (last ? 2 : 0);
      sw.tp_bytes = 2.0 * (t - 1) / t * b * s * d * act * sw.tp_ops;
    }
    sw.pp_msg_bytes = last ? 0.0 : b * s * d * act;
    const double local = (nl * 12 * d * d + (first ? (V + s) * d : 0.0) + (last ? V * d : 0.0)) / t;
    const double p = lay.dp;
    // Distributed optimizer: fp32 gradient reduce-scatter, bf16 parameter
    // all-gather; else an fp32 all-reduce.
    sw.dp_bytes = lay.dp > 1 ? (lay.zero_active() ? (p - 1) / p * local * (4 + 2) : 2 * (p - 1) / p * local * 4) : 0;
    sw.dp_ops =
        lay.dp > 1 ? (lay.zero_active() ? 2 : 1) * std::max(1, int(std::ceil(local * 4 / double(kBucketBytes)))) : 0;
    sw.opt_elems = lay.zero_active() ? local / p : local;
    sw.traffic.tp = sw.tp_bytes * m;
    sw.traffic.pp = (first ? 0 : b * s * d * act) * m + sw.pp_msg_bytes * m;
    sw.traffic.dp = sw.dp_bytes;
    // Memory: bf16 weights + fp32 main gradients; fp32 master + 2 moments
    // (1/dp of them with the distributed optimizer); activations per
    // Korthikanti et al. 2022 with flash attention (no s^2 term):
    // s b d (10 + 24/t) bytes per layer, 2 s b d with full recompute; the
    // first stage keeps pp micro-batches in flight under 1F1B.
    sw.memory.params = local * 2;
    sw.memory.grads = local * 4;
    sw.memory.optimizer = 12 * (lay.zero_active() ? local / p : local);
    const double per_layer = lay.recompute ? 2 * s * b * d : s * b * d * (10 + 24 / t);
    sw.memory.activations = per_layer * nl * stage_slots(lay, st) + (last ? b * s * V / t * 4 : 0.0);
    w.stages.push_back(sw);
  }
  return w;
}

// ---- hardware ------------------------------------------------------------------------

Cluster Cluster::gpu(const std::string& gpu_key, int devices, const std::string& inter_key) {
  const Accelerator* a = find_accelerator(gpu_key);
  std::string keys;
  for (const auto& x : accelerators()) keys += (keys.empty() ? "" : ", ") + x.key;
  WIOLA_CHECK(a, "unknown GPU '", gpu_key, "' (known: ", keys, ")");
  Cluster c;
  c.device = a->key;
  c.devices = devices;
  c.per_node = a->gpus_per_node;
  c.memory_bytes = a->memory_gib * 1073741824.0;
  const Interconnect& intra = find_interconnect(a->intra_link);
  const Interconnect& inter =
      find_interconnect(inter_key.empty() ? (a->key == "a100" ? "ib-hdr" : "ib-ndr") : inter_key);
  c.intra_gbs = intra.gbs * kLinkEfficiency;
  c.inter_gbs = inter.gbs * kLinkEfficiency;
  c.latency_s = intra.latency_us * 1e-6;
  c.inter_latency_s = inter.latency_us * 1e-6;
  c.peak_flops = a->bf16_tflops * 1e12;
  c.hidden_dp = true;
  return c;
}

namespace {

class FlopsCompute final : public ComputeModel {
 public:
  FlopsCompute(double peak, double eff, double mem_gbs) : peak_(peak), eff_(eff), mem_gbs_(mem_gbs) {}
  double fwd(const Workload& w, int s) override { return w.stages[size_t(s)].fwd_flops / (peak_ * eff_); }
  double bwd(const Workload& w, int s) override { return w.stages[size_t(s)].bwd_flops / (peak_ * eff_); }
  // AdamW is memory-bound: p, g, m, v read, p, m, v written (fp32), the
  // bf16 weight copy written: 30 bytes per parameter.
  double optimizer(double elems) override { return elems * 30.0 / (mem_gbs_ * 1e9); }
  std::string describe() const override {
    char buf[160];
    std::snprintf(buf, sizeof buf, "FLOPs / (%.0f TFLOP/s x %.2f), AdamW at %.0f GB/s", peak_ / 1e12, eff_, mem_gbs_);
    return buf;
  }

 private:
  double peak_, eff_, mem_gbs_;
};

struct Link {
  double gbs, latency;
};
Link link_for(const Cluster& cl, int span) {
  return span <= cl.per_node ? Link{cl.intra_gbs, cl.latency_s} : Link{cl.inter_gbs, cl.inter_latency_s};
}

}  // namespace

double ComputeModel::bwd_weight(const Workload& w, int s) {
  const StageWork& sw = w.stages[size_t(s)];
  return sw.bwd_flops > 0 ? bwd(w, s) * (sw.bwd_weight_flops / sw.bwd_flops) : 0.0;
}

std::unique_ptr<ComputeModel> flops_compute_model(double peak_flops, double efficiency, double mem_gbs) {
  return std::make_unique<FlopsCompute>(peak_flops, efficiency, mem_gbs);
}

// ---- prediction ----------------------------------------------------------------------

namespace {
Prediction predict_once(const Workload& w, const Cluster& cl, ComputeModel& cm, dist::PipelineSim* sim_out);

// Per stage, the share of its busy time during which no other stage is busy.
std::vector<double> alone_shares(const Workload& w, const dist::PipelineSim& sim) {
  const int pp = w.layout.pp;
  std::vector<std::vector<std::pair<double, double>>> busy(static_cast<size_t>(pp));
  for (int s = 0; s < pp; ++s)
    for (size_t k = 0; k < sim.start[size_t(s)].size(); ++k)
      busy[size_t(s)].push_back({sim.start[size_t(s)][k], sim.end[size_t(s)][k]});
  std::vector<double> out;
  for (int s = 0; s < pp; ++s) {
    double total = 0, alone = 0;
    for (const auto& [a, b] : busy[size_t(s)]) {
      total += b - a;
      // Cut [a, b) by every other stage's intervals (few: fine to scan).
      std::vector<std::pair<double, double>> cover;
      for (int o = 0; o < pp; ++o)
        if (o != s)
          for (const auto& [c, d] : busy[size_t(o)])
            if (d > a && c < b) cover.push_back({std::max(a, c), std::min(b, d)});
      std::sort(cover.begin(), cover.end());
      double covered = 0, end = a;
      for (const auto& [c, d] : cover) {
        if (d <= end) continue;
        covered += d - std::max(c, end);
        end = d;
      }
      alone += (b - a) - covered;
    }
    out.push_back(total > 0 ? alone / total : 0.0);
  }
  return out;
}
}  // namespace

// Two passes where ranks share cores: the first simulation says how much of
// each stage's work runs alongside other stages, the second uses it.
Prediction predict(const Workload& w, const Cluster& cl, ComputeModel& cm) {
  dist::PipelineSim sim;
  Prediction p = predict_once(w, cl, cm, &sim);
  if (w.layout.pp == 1 || !cm.shares_cores()) return p;
  Workload again = w;
  again.alone_share = alone_shares(w, sim);
  return predict_once(again, cl, cm, nullptr);
}

namespace {
Prediction predict_once(const Workload& w, const Cluster& cl, ComputeModel& cm, dist::PipelineSim* sim_out) {
  const Layout& lay = w.layout;
  Prediction p;
  p.layout = lay;
  p.bubble_analytic = w.bubble_analytic;
  const int pp = lay.pp;
  Link tp_link = link_for(cl, lay.tp), pp_link = link_for(cl, lay.tp * lay.pp), dp_link = link_for(cl, lay.world());
  if (int(cl.rank_node.size()) == lay.world()) {  // a known placement: each dimension's groups
    const dist::Placement pl = dist::placement_of(dist::GridConfig{lay.tp, lay.pp, lay.dp}, cl.rank_node);
    // Between nodes: the link's rate for one flow, shared by the flows the
    // dimension puts on a node's link at once.
    const auto of = [&](dist::LinkKind k, int flows) {
      return k == dist::LinkKind::Inter ? Link{cl.inter_gbs / std::max(1, flows), cl.inter_latency_s}
                                        : Link{cl.intra_gbs, cl.latency_s};
    };
    tp_link = of(pl.tp, pl.tp_flows), pp_link = of(pl.pp, pl.pp_flows), dp_link = of(pl.dp, pl.dp_flows);
  }
  // The pipeline's units: the stages, or (interleaved, zb-v) the p·v
  // chunks, global chunk g on rank dist::chunk_rank(p, g).
  const int v = chunks_per_rank(lay);
  const dist::ChunkPlacement placement = chunk_placement(lay);
  const auto rank_of = [&](int g) { return size_t(dist::chunk_rank(pp, g, placement)); };
  WIOLA_CHECK(v == 1 || int(w.chunks.size()) == pp * v, "plan: a ", to_string(lay.schedule),
              " layout needs its workload's ", pp * v, " chunks (Wiola workloads only)");
  Workload chunked;
  if (v > 1) {
    chunked = w;
    chunked.stages = w.chunks;
    chunked.chunks.clear();
    chunked.layout.pp = pp * v;
    chunked.layout.schedule = dist::Schedule::OneFOneB;
    chunked.layout.virtual_stages = 1;
    chunked.alone_share.clear();
    for (int g = 0; g < pp * v && !w.alone_share.empty(); ++g) chunked.alone_share.push_back(w.alone_share[rank_of(g)]);
  }
  const Workload& units = v > 1 ? chunked : w;
  dist::StageCosts costs;
  std::vector<double> rank_tp(size_t(pp), 0.0), rank_compute(size_t(pp), 0.0);
  double link = 0;
  for (int g = 0; g < pp * v; ++g) {
    const StageWork& sw = units.stages[size_t(g)];
    const double tp = sw.tp_ops * ring_latency(lay.tp, tp_link.latency, true) +
                      (sw.tp_bytes > 0 ? sw.tp_bytes / (tp_link.gbs * 1e9) : 0.0);
    const double f = cm.fwd(units, g), b = cm.bwd(units, g);
    rank_tp[rank_of(g)] += tp;
    rank_compute[rank_of(g)] += f + b;
    // TP sums sit on the critical path: the forward's half before the next
    // GEMM, the backward's half likewise (in B: W needs no TP sum).
    costs.fwd.push_back(f + tp / 2);
    costs.bwd.push_back(b + tp / 2);
    costs.bwd_weight.push_back(std::min(cm.bwd_weight(units, g), b));
    if (pp > 1) link = std::max(link, pp_link.latency + sw.pp_msg_bytes / (pp_link.gbs * 1e9));
  }
  std::vector<std::vector<dist::Action>> sched;
  for (int s = 0; s < pp; ++s) {
    const StageWork& sw = w.stages[size_t(s)];
    p.tp_s = std::max(p.tp_s, rank_tp[size_t(s)] * lay.micro_batches);
    p.compute_s = std::max(p.compute_s, rank_compute[size_t(s)] * lay.micro_batches);
    const double b = cm.bwd(units, s);  // the rank's last backward (its chunk 0)
    sched.push_back(stage_schedule(lay, s));
    p.traffic.tp = std::max(p.traffic.tp, sw.traffic.tp);
    p.traffic.pp = std::max(p.traffic.pp, sw.traffic.pp);
    p.traffic.dp = std::max(p.traffic.dp, sw.traffic.dp);
    p.traffic.embed = std::max(p.traffic.embed, sw.traffic.embed);
    if (sw.memory.total() > p.memory.total()) p.memory = sw.memory;
    const double dp_t = sw.dp_ops * ring_latency(lay.dp, dp_link.latency, false) +
                        (sw.dp_bytes > 0 ? sw.dp_bytes / (dp_link.gbs * 1e9) : 0.0);
    // Hidden DP: the reduce-scatter half runs behind the last backward
    // (its own stream); the all-gather after the optimizer is exposed.
    const double exposed = cl.hidden_dp && lay.zero_active() ? std::max(0.0, dp_t / 2 - b) + dp_t / 2 : dp_t;
    p.dp_exposed_s = std::max(p.dp_exposed_s, exposed);
    p.optimizer_s = std::max(p.optimizer_s, cm.optimizer(sw.opt_elems));
    if (sw.embed_bytes > 0) p.embed_s = std::max(p.embed_s, pp_link.latency + sw.embed_bytes / (pp_link.gbs * 1e9));
  }
  costs.link = link;
  p.stage_fwd_s = costs.fwd;
  p.stage_bwd_s = costs.bwd;
  p.stage_bwd_weight_s = costs.bwd_weight;
  const dist::PipelineSim sim = dist::simulate_pipeline(sched, costs, placement);
  if (sim_out) *sim_out = sim;
  p.pipeline_s = sim.makespan;
  p.bubble_sim = sim.bubble_fraction;
  p.bubble_fill_drain = sim.bubble_fill_drain;
  p.bubble_imbalance = sim.bubble_imbalance;
  for (int s = 0; s < pp; ++s) p.peak_live.push_back(double(sim.peak_live[size_t(s)]) / v);
  p.pp_s = pp > 1 ? 2.0 * lay.micro_batches * v * link : 0.0;
  // The loss and norm sums: a few scalar all-reduces over the world.
  const double scalars = 3 * ring_latency(lay.world(), dp_link.latency, true);
  p.step_s = p.pipeline_s + p.embed_s + p.dp_exposed_s + p.optimizer_s + scalars;
  p.tokens_per_s = double(lay.global_batch()) * w.T / p.step_s;
  p.mfu = cl.peak_flops > 0 ? w.step_flops / p.step_s / (cl.peak_flops * lay.world()) : 0.0;
  if (cl.memory_bytes > 0 && p.memory.total() > 0.92 * cl.memory_bytes) {
    p.fits = false;
    char buf[160];
    std::snprintf(buf, sizeof buf, "needs %.1f GiB per device of %.0f (92%% usable)", p.memory.total() / 1073741824.0,
                  cl.memory_bytes / 1073741824.0);
    p.why_not = buf;
  }
  return p;
}
}  // namespace

// ---- schedule choice -----------------------------------------------------------------

Layout balance_chunks(const ModelConfig& c, const Layout& lay, const Cluster& cl, ComputeModel& cm,
                      const Precision& prec) {
  const int n = lay.pp * chunks_per_rank(lay);
  WIOLA_CHECK(n <= c.L, "balance_chunks: ", n, " chunks for ", c.L, " layers");
  const auto cuts_of = [](const std::vector<std::pair<int, int>>& ranges) {
    std::vector<int> cuts = {0};
    for (const auto& r : ranges) cuts.push_back(r.second);
    return cuts;
  };
  const auto step = [&](const std::vector<int>& cuts) {
    Layout l = lay;
    l.cuts = cuts;
    return predict(wiola_workload(c, l, prec), cl, cm).step_s;
  };
  // Start from the better of the even split and the FLOP balance, then move
  // one layer across one boundary at a time while the step shrinks (the
  // largest gain first): never worse than either start.
  std::vector<int> best = cuts_of(pipeline_stages(c, n, StageBalance::Layers));
  double best_s = step(best);
  if (const std::vector<int> flops = cuts_of(pipeline_stages(c, n, StageBalance::Compute)); flops != best)
    if (const double s = step(flops); s < best_s) {
      best = flops;
      best_s = s;
    }
  for (int round = 0; round < 4 * c.L; ++round) {
    std::vector<int> move;
    double move_s = best_s * (1 - 1e-9);
    for (int k = 1; k < n; ++k)
      for (int dk : {-1, 1}) {
        std::vector<int> t = best;
        t[size_t(k)] += dk;
        if (t[size_t(k)] <= t[size_t(k) - 1] || t[size_t(k)] >= t[size_t(k) + 1]) continue;
        if (const double s = step(t); s < move_s) {
          move = t;
          move_s = s;
        }
      }
    if (move.empty()) break;
    best = move;
    best_s = move_s;
  }
  Layout out = lay;
  out.cuts = best;
  return out;
}

Prediction predict_schedules(const ModelConfig& c, const Layout& lay, const Cluster& cl, ComputeModel& cm,
                             const Precision& prec, bool interleaved, bool balance) {
  if (lay.pp <= 1) return predict(wiola_workload(c, lay, prec), cl, cm);
  std::vector<Layout> tries;
  for (const dist::Schedule name : {dist::Schedule::OneFOneB, dist::Schedule::ZbH1}) {
    Layout l = lay;
    l.schedule = name;
    l.virtual_stages = 1;
    tries.push_back(l);
  }
  if (interleaved && lay.micro_batches % lay.pp == 0)
    for (int v : {2, 4})
      if (lay.pp * v <= c.L) {
        Layout l = lay;
        l.schedule = dist::Schedule::Interleaved;
        l.virtual_stages = v;
        tries.push_back(l);
      }
  if (interleaved && lay.micro_batches >= lay.pp && 2 * lay.pp <= c.L) {
    Layout l = lay;
    l.schedule = dist::Schedule::ZbV;
    l.virtual_stages = 1;
    tries.push_back(l);
  }
  // wiola train runs the chunked schedules everywhere, its chunks cut by the
  // stage balancer; on GPUs their pipeline messages go through host memory
  // (the NCCL plane's in-order lanes do not carry them), which the
  // prediction does not time, so there they are listed, cut by the chunk
  // balancer (what they could do), and not picked.
  const auto runnable = [&](const Layout& l) { return cl.device == "cpu" || !dist::chunked(l.schedule); };
  std::vector<Prediction> ps;
  for (Layout l : tries) {
    if (balance && chunks_per_rank(l) > 1 && !runnable(l)) l = balance_chunks(c, l, cl, cm, prec);
    ps.push_back(predict(wiola_workload(c, l, prec), cl, cm));
  }
  const auto label = [](const Layout& l) {
    return l.schedule == dist::Schedule::Interleaved ? "interleaved v" + std::to_string(l.virtual_stages)
                                                     : std::string(to_string(l.schedule));
  };
  // The pick: fits first, then the step time, among the runnable ones.
  size_t pick = 0;
  for (size_t i = 1; i < ps.size(); ++i) {
    if (!runnable(ps[i].layout)) continue;
    const Prediction& a = ps[i];
    const Prediction& b = ps[pick];
    if (a.fits != b.fits ? a.fits : a.step_s < b.step_s) pick = i;
  }
  Prediction best = ps[pick];
  for (const Prediction& p : ps)
    best.schedule_options.push_back(
        {label(p.layout), runnable(p.layout), p.fits, p.step_s, p.bubble_sim, p.memory.activations, p.traffic.pp});
  // Why: the pick against the other runnable one, then interleaved.
  const auto pct = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
    return std::string(buf);
  };
  const auto gib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
    return std::string(buf);
  };
  const auto secs = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f s", x);
    return std::string(buf);
  };
  std::string why = label(best.layout) + ": step " + secs(best.step_s) + ", bubble " + pct(best.bubble_sim) +
                    ", activations " + gib(best.memory.activations);
  for (const Prediction& p : ps) {
    if (&p == &ps[pick]) continue;
    std::string line = "; " + label(p.layout) + ": ";
    if (!p.fits) line += "does not fit (" + p.why_not + ")";
    else line += "step " + secs(p.step_s) + ", bubble " + pct(p.bubble_sim);
    if (p.fits && p.memory.activations != best.memory.activations) line += ", activations " + gib(p.memory.activations);
    if (!p.layout.cuts.empty()) {  // the chunk balancer's cut: layers per global chunk
      line += ", chunks of";
      for (size_t k = 1; k < p.layout.cuts.size(); ++k) {
        line += ' ';
        line += std::to_string(p.layout.cuts[k] - p.layout.cuts[k - 1]);
      }
      line += " layers";
    }
    if (!runnable(p.layout)) {
      char buf[96];
      std::snprintf(buf, sizeof buf, ", %.1fx the pipeline traffic",
                    best.traffic.pp > 0 ? p.traffic.pp / best.traffic.pp : 0.0);
      line += buf;
      line += p.fits && p.step_s < best.step_s
                  ? " (faster, but not picked on GPUs: pipeline messages through host memory)"
                  : " (not picked on GPUs: pipeline messages through host memory)";
    }
    why += line;
  }
  best.schedule_why = why;
  return best;
}

// ---- search --------------------------------------------------------------------------

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}

// Every (tp, pp, dp, micro-batch, ZeRO, recompute) the cluster and the
// batch allow; `legal` says whether the model takes a (tp, pp); `predict_one`
// predicts a layout (and may choose its schedule).
template <class Legal, class PredictOne>
std::vector<Prediction> search(const Cluster& cl, const SearchSpace& sp, int n_layers, Legal legal,
                               PredictOne predict_one) {
  WIOLA_CHECK(sp.global_batch >= 1, "plan: the global batch must be at least 1 sequence");
  std::vector<Prediction> out;
  for (int tp : divisors(cl.devices)) {
    if (tp > cl.per_node) continue;  // TP stays inside a node's NVLink
    for (int pp : divisors(cl.devices / tp)) {
      if (pp > n_layers || (sp.max_pp > 0 && pp > sp.max_pp)) continue;
      const int dp = cl.devices / (tp * pp);
      if (!legal(tp, pp) || sp.global_batch % dp != 0) continue;
      for (int mb : sp.micro_batch_sizes) {
        if ((sp.global_batch / dp) % mb != 0) continue;
        for (int zero = 1; zero >= (sp.try_no_zero && dp > 1 ? 0 : 1); --zero)
          for (int rc = 0; rc <= (sp.try_recompute ? 1 : 0); ++rc) {
            Layout lay;
            lay.tp = tp;
            lay.pp = pp;
            lay.dp = dp;
            lay.micro_batch = mb;
            lay.micro_batches = sp.global_batch / dp / mb;
            lay.zero = zero == 1;
            lay.recompute = rc == 1;
            out.push_back(predict_one(lay));
          }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Prediction& a, const Prediction& b) {
    if (a.fits != b.fits) return a.fits;
    return a.step_s < b.step_s;
  });
  return out;
}

}  // namespace

std::vector<Prediction> search_wiola(const ModelConfig& c, const Cluster& cl, ComputeModel& cm, const SearchSpace& sp,
                                     const Precision& prec) {
  const auto legal = [&](int tp, int pp) {
    return c.Hkv % tp == 0 && c.dA % tp == 0 && c.dB % tp == 0 && c.V % tp == 0 && pp <= c.L;
  };
  std::vector<Prediction> out = search(cl, sp, c.L, legal, [&](const Layout& l) {
    return sp.try_schedules ? predict_schedules(c, l, cl, cm, prec, sp.try_interleaved, sp.balance_chunks_everywhere)
                            : predict(wiola_workload(c, l, prec), cl, cm);
  });
  // The best layout's chunked options with balanced chunks (its pick, a
  // runnable schedule, does not change).
  if (sp.try_schedules && sp.try_interleaved && !sp.balance_chunks_everywhere && !out.empty() &&
      out.front().layout.pp > 1) {
    Layout l = out.front().layout;
    l.schedule = dist::Schedule::OneFOneB;
    out.front() = predict_schedules(c, l, cl, cm, prec, true, true);
  }
  return out;
}

std::vector<Prediction> search_gpt(const GptConfig& g, const Cluster& cl, ComputeModel& cm, const SearchSpace& sp) {
  const auto legal = [&](int tp, int pp) { return g.H % tp == 0 && g.V % tp == 0 && pp <= g.L; };
  return search(cl, sp, g.L, legal, [&](const Layout& l) { return predict(gpt_workload(g, l), cl, cm); });
}

RunEstimate estimate_run(const Prediction& p, const Workload& w, const Cluster& cl, double tokens, double ckpt_minutes,
                         bool async_ckpt) {
  RunEstimate r;
  r.steps = std::ceil(tokens / (double(w.layout.global_batch()) * w.T));
  const double train_s = r.steps * p.step_s;
  r.checkpoints = 1 + (ckpt_minutes > 0 ? int(train_s / (ckpt_minutes * 60)) : 0);
  // What a save costs the loop: a background save snapshots the rank's
  // master weights and moments to host memory; a blocking one writes them.
  const double bytes = p.memory.optimizer + p.memory.params;
  const double each = bytes / ((async_ckpt ? cl.host_copy_gbs : cl.ckpt_write_gbs) * 1e9);
  r.checkpoint_s = r.checkpoints * each;
  r.wall_s = train_s + r.checkpoint_s;
  r.device_hours = r.wall_s * w.layout.world() / 3600.0;
  return r;
}

}  // namespace wiola::perf
