#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "dist/agree.h"
#include "dist/diagnostics.h"
#include "dist/grid.h"
#include "dist/optimizer.h"
#include "dist/schedule.h"
#include "dist/tp_collectives.h"
#include "model/model.h"
#include "train/dump.h"
#include "train/schedule.h"
#include "util/error.h"
#include "util/files.h"

namespace wiola {
namespace {

using Clock = std::chrono::steady_clock;
using dist::Comm;
using dist::DType;
using dist::ReduceOp;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string human_duration(double s) {
  char buf[64];
  const long v = long(s + 0.5);
  if (v >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", v / 3600, (v / 60) % 60);
  else if (v >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", v / 60, v % 60);
  else std::snprintf(buf, sizeof buf, "%lds", v);
  return buf;
}

std::string human_bytes(double b) {
  char buf[64];
  if (b >= 1048576.0) std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  else if (b >= 1024.0) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

// Point-to-point messages between neighbouring pipeline stages. A message is
// several [N, d] tensors packed into one buffer. Sends are non-blocking from
// a private copy (the model reuses its buffers at once), so no send ever
// waits for the peer: the schedule alone orders the job, as in
// dist::simulate_pipeline. Tags: 2i forward, 2i+1 backward of micro-batch i.
class StageLink {
 public:
  StageLink(Comm& pp, size_t tensor_elems) : pp_(pp), each_(tensor_elems) {}
  ~StageLink() { flush(); }

  void send(const std::vector<const float*>& ts, int peer, int tag) {
    Pending* p = nullptr;
    for (auto& q : pending_)
      if (!q.req.pending() || q.req.test()) {
        p = &q;
        break;
      }
    if (!p) p = &pending_.emplace_back();
    p->data.resize(ts.size() * each_);
    for (size_t i = 0; i < ts.size(); ++i) std::memcpy(p->data.data() + i * each_, ts[i], each_ * sizeof(float));
    p->req = pp_.isend(p->data.data(), p->data.size(), DType::F32, peer, tag);
  }

  void recv(const std::vector<float*>& ts, int peer, int tag) {
    staging_.resize(ts.size() * each_);
    pp_.irecv(staging_.data(), staging_.size(), DType::F32, peer, tag).wait();
    for (size_t i = 0; i < ts.size(); ++i) std::memcpy(ts[i], staging_.data() + i * each_, each_ * sizeof(float));
  }

  void flush() {
    for (auto& p : pending_) p.req.wait();
  }

 private:
  struct Pending {
    std::vector<float> data;
    dist::Request req;
  };
  Comm& pp_;
  size_t each_;
  std::deque<Pending> pending_;  // stable addresses
  std::vector<float> staging_;
};

// Gathers per-rank flat buffers (each in its own shard's layout) into the
// single-process layout on world rank 0. Contributors: the dp == 0 ranks;
// rank 0 rebuilds every contributor's ParamLayout to map its elements to
// global indices (the tied embedding arrives twice with pp > 1: same values).
std::vector<float> gather_full(dist::Grid& grid, const ModelConfig& cfg, const ParamLayout& mine,
                               const std::vector<float>& local, const std::vector<std::pair<int, int>>& stages) {
  Comm& world = grid.world();
  const auto& g = grid.config();
  const bool root = world.rank() == 0;
  const int tag = 7001;
  if (!root) {
    if (grid.coord().dp == 0) world.isend(local.data(), local.size(), DType::F32, 0, tag).wait();
    return {};
  }
  const ParamLayout full(cfg, ModelShard{});
  std::vector<float> out(full.total(), 0.0f);
  auto scatter = [&](const ParamLayout& lay, const std::vector<float>& buf) {
    for (const ParamEntry& e : lay.entries()) {
      const ParamEntry& fe = full.find(e.name);
      for (int64_t r = 0; r < e.rows; ++r)
        for (int64_t c = 0; c < e.cols; ++c)
          out[fe.offset + size_t(e.global_index(r, c))] = buf[e.offset + size_t(r * e.cols + c)];
    }
  };
  scatter(mine, local);
  std::vector<float> buf;
  for (int r = 1; r < world.size(); ++r) {
    const dist::GridCoord c = dist::grid_coord(g, r);
    if (c.dp != 0) continue;
    const auto [l0, l1] = stages[size_t(c.pp)];
    const ParamLayout lay(cfg, ModelShard{c.tp, g.tp, l0, l1});
    buf.resize(lay.total());
    world.irecv(buf.data(), buf.size(), DType::F32, r, tag).wait();
    scatter(lay, buf);
  }
  return out;
}

// Bytes this rank should put on the wire per step in each group, from the
// model's shapes (ring all-reduce 2(p-1)/p·n, reduce-scatter/all-gather
// (p-1)/p·n each, sends n). The measured figures come from the communicators.
struct TrafficModel {
  double tp = 0, pp = 0, dp = 0, embed = 0;
};
TrafficModel analytic_traffic(const RunConfig& rc, const Model<float>& model, const dist::Grid& grid,
                              size_t padded_params) {
  const auto& g = grid.config();
  const ModelConfig& c = rc.model;
  const double N = double(rc.train.micro_batch) * c.T, d = c.d, m = rc.train.grad_accum, f = 4;
  const ModelShard& s = model.shard();
  const double nl = s.end(c) - s.layer_begin;
  TrafficModel t;
  if (g.tp > 1) {
    // Per micro-batch: 3 all-reduces of [N,d] per layer forward (A, a, b),
    // 2 in backward (column-parallel input gradients), 3 more when the
    // backward recomputes the forward; one per summary gradient made here;
    // the embedding output (first stage); CE max/sum-exp/target [N] and the
    // head input gradient [N,d] (last stage); dφ (one double per layer).
    double elems = nl * (5 + (rc.train.recompute ? 3 : 0)) * N * d + nl * N * d;
    if (s.first_stage()) elems += N * d;
    if (s.last_stage(c)) elems += 3 * N + N * d;
    const double bytes = m * (elems * f + nl * 8);
    t.tp = 2.0 * (g.tp - 1) / g.tp * bytes;
  }
  if (g.pp > 1)
    t.pp = m * double(model.boundary_in() + model.boundary_out()) * N * d * f;
  if (g.dp > 1)
    t.dp = 2.0 * (g.dp - 1) / g.dp * double(padded_params) * f;
  if (g.pp > 1 && (s.first_stage() || s.last_stage(c))) {
    const LocalDims ld(c, s);
    t.embed = double(ld.V) * d * f;  // all-reduce between 2 ranks: 2·(1/2)·n
  }
  return t;
}

// Fault injection for the failure-path tests: WIOLA_FAULT=KIND:RANK:STEP
// makes world rank RANK, at the start of step STEP, throw ("fail") or stop
// answering ("stall"). Off unless the variable is set.
struct Fault {
  std::string kind;
  int rank = -1;
  int64_t step = -1;
};
Fault fault_from_env() {
  Fault f;
  const char* v = std::getenv("WIOLA_FAULT");
  if (!v || !*v) return f;
  const std::string s(v);
  const auto a = s.find(':'), b = s.rfind(':');
  WIOLA_CHECK(a != std::string::npos && b > a, "WIOLA_FAULT='", s, "': expected KIND:RANK:STEP");
  f.kind = s.substr(0, a);
  WIOLA_CHECK(f.kind == "fail" || f.kind == "stall", "WIOLA_FAULT='", s, "': KIND is fail or stall");
  f.rank = std::atoi(s.substr(a + 1, b - a - 1).c_str());
  f.step = std::atoll(s.substr(b + 1).c_str());
  return f;
}
void inject_fault(const Fault& f, int rank, int64_t step) {
  if (f.rank != rank || f.step != step) return;
  if (f.kind == "fail") fail("injected fault (WIOLA_FAULT) at step ", step);
  if (f.kind == "stall")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until the job is aborted
}

// ATM decisions must be identical on the TP ranks (each computes them from
// its own copy of X-tilde): compare fingerprints of this rank's decisions.
void check_atm_agrees_over_tp(dist::Grid& grid, const std::vector<uint8_t>& atm_flat, int64_t step) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (uint8_t b : atm_flat) h = (h ^ b) * 1099511628211ull;
  const int64_t mine = int64_t(h >> 1);
  std::vector<int64_t> all(size_t(grid.tp().size()));
  grid.tp().all_gather(&mine, all.data(), 1, DType::I64);
  for (int64_t v : all)
    WIOLA_CHECK(v == mine, "ATM merge decisions differ between the TP ranks of stage ", grid.coord().pp,
                " at step ", step);
}

// Dump steps: the global batch's tokens (DP slices in order, from tp 0 of
// stage 0) and every ATM layer's decisions [B_global, T] (from tp 0 of the
// layer's stage), into `dump` on world rank 0. atm_flat: this rank's ATM
// layers in order, each [local batch, T] (`each` elements).
void gather_tokens_and_atm(dist::Grid& grid, const ModelConfig& cfg,
                           const std::vector<std::pair<int, int>>& stages, const std::vector<int32_t>& batch,
                           const std::vector<uint8_t>& atm_flat, size_t each, StepDump& dump) {
  Comm& world = grid.world();
  const dist::GridConfig& gc = grid.config();
  const dist::GridCoord me = grid.coord();
  const int tag = 7002;
  if (world.rank() != 0) {
    if (me.tp == 0 && me.pp == 0) world.isend(batch.data(), batch.size(), DType::I32, 0, tag).wait();
    if (me.tp == 0 && !atm_flat.empty())
      world.isend(atm_flat.data(), atm_flat.size(), DType::U8, 0, tag + 1).wait();
    return;
  }
  dump.tokens.resize(batch.size() * size_t(gc.dp));
  std::vector<std::vector<uint8_t>> atm(size_t(cfg.L));
  std::vector<uint8_t> got;
  for (int r = 0; r < gc.dp; ++r) {
    int32_t* dst = dump.tokens.data() + size_t(r) * batch.size();
    const int src = dist::grid_rank(gc, {0, 0, r});
    if (src == 0) std::copy(batch.begin(), batch.end(), dst);
    else world.irecv(dst, batch.size(), DType::I32, src, tag).wait();
    for (int s = 0; s < gc.pp; ++s) {
      const auto [a0, a1] = stages[size_t(s)];
      std::vector<int> layers;
      for (int l = a0; l < a1; ++l)
        if (cfg.atm_layer(l)) layers.push_back(l);
      if (layers.empty()) continue;
      const int from = dist::grid_rank(gc, {0, s, r});
      got.resize(each * layers.size());
      if (from == 0) got = atm_flat;
      else world.irecv(got.data(), got.size(), DType::U8, from, tag + 1).wait();
      for (size_t j = 0; j < layers.size(); ++j)
        atm[size_t(layers[j])].insert(atm[size_t(layers[j])].end(), got.begin() + long(j * each),
                                      got.begin() + long((j + 1) * each));
    }
  }
  for (int l = 0; l < cfg.L; ++l)
    if (!atm[size_t(l)].empty()) dump.atm[l] = std::move(atm[size_t(l)]);
}

// Layer ranges of the pipeline stages (parallel.stage_balance).
std::vector<std::pair<int, int>> pipeline_stages(const ModelConfig& cfg, const ParallelSection& par) {
  if (par.stage_balance == "layers") {
    std::vector<std::pair<int, int>> out;
    for (int s = 0; s < par.pp; ++s) out.push_back(dist::stage_layers(cfg.L, par.pp, s));
    return out;
  }
  // FLOPs per token, forward + backward: 6 per parameter of a layer plus
  // causal attention (QK and PV over ~T/2 keys, 6·T·d); the tied head
  // 6·V·d. The embedding lookup costs nothing comparable.
  const int64_t per_layer = (cfg.param_count() - int64_t(cfg.V) * cfg.d - 2 * cfg.d) / cfg.L;
  const double layer = 6.0 * double(per_layer) + 6.0 * cfg.T * cfg.d;
  return dist::balanced_stages(std::vector<double>(size_t(cfg.L), layer), 0.0, 6.0 * cfg.V * cfg.d,
                               par.pp);
}

}  // namespace

std::vector<dist::ParamSegment> optimizer_segments(const ParamLayout& layout, int tp_rank,
                                                   bool embed_in_norm) {
  std::vector<dist::ParamSegment> segs;
  for (const ParamEntry& e : layout.entries()) {
    bool in_norm = !(e.tp_replicated && tp_rank != 0);
    if (e.name == "model.embed_tokens.weight") in_norm = embed_in_norm;
    segs.push_back({e.offset, e.size(), e.decay, in_norm});
  }
  return segs;
}

TrainSummary run_training(const RunConfig& rc, const TrainOptions& opt, Comm& world) {
  const TrainSection& tr = rc.train;
  const ModelConfig& cfg = rc.model;
  const auto& par = rc.parallel;
  const bool root = world.rank() == 0;
  const int B = tr.micro_batch, T = cfg.T, m = tr.grad_accum;
  const int64_t GB = rc.global_batch();
  const dist::GridConfig gc{par.tp, par.pp, par.dp};

  const int64_t n_params = cfg.param_count();
  const char* budget = "train.steps";
  int64_t t_max = tr.steps;
  if (t_max == 0 && tr.tokens > 0) { t_max = steps_for_tokens(tr.tokens, GB, T); budget = "train.tokens"; }
  if (t_max == 0) { t_max = chinchilla_steps(n_params, GB, T); budget = "Chinchilla 20 N"; }
  const int64_t warmup = tr.warmup >= 0 ? tr.warmup : default_warmup(t_max);
  const int64_t last_step = tr.max_steps > 0 ? std::min(t_max, tr.max_steps) : t_max;
  // ---- setup: every check before any work; all ranks agree ---------------------
  // (Nothing inside the lambda communicates; a failure on any rank is printed
  // once and ends every rank before the first collective of the run.)
  std::unique_ptr<TokenLoader> loader_p, val;
  const uint64_t data_seed = rc.data.seed >= 0 ? uint64_t(rc.data.seed) : tr.seed;
  const dist::GridCoord me = dist::grid_coord(gc, world.rank());
  dist::agree_on_setup(world, "wiola train", [&] {
    validate_run_config(rc);
    WIOLA_CHECK(!rc.data.path.empty(), rc.source, ": data.path is not set (a manifest.json from `wiola prep`, "
                "its directory, or one .h5 shard)");
    WIOLA_CHECK(gc.world() == world.size(), "parallel.tp x pp x dp = ", par.tp, " x ", par.pp, " x ",
                par.dp, " = ", gc.world(), " ranks, but the job has ", world.size(),
                " (run with mpirun -np ", gc.world(), ", or change [parallel])");
    dist::validate_layout(gc, world.size(), cfg.L, cfg.Hkv, cfg.H, cfg.dA, cfg.dB, cfg.V, int(GB), B, m);
    loader_p = std::make_unique<TokenLoader>(rc.data.path, "train", T, int(GB), me.dp, par.dp, data_seed,
                                             rc.data.shuffle, rc.data.prefetch > 0);
    loader_p->expect(uint32_t(cfg.V));
    for (const auto& [step, path] : opt.dumps)
      WIOLA_CHECK(step >= 1 && step <= last_step, "--dump-step ", step, ":", path, ": step outside 1..", last_step);
    if (tr.eval_every > 0)
      val = std::make_unique<TokenLoader>(rc.data.path, "val", T, B * par.dp, me.dp, par.dp, data_seed,
                                          false, false);
  });
  TokenLoader& loader = *loader_p;
  LoaderState val_start{};
  if (val) val_start = val->state();
  set_cpu_threads(tr.threads);
  dist::Grid grid(gc, world);
  const std::vector<std::pair<int, int>> stages = pipeline_stages(cfg, par);
  const auto [l0, l1] = stages[size_t(me.pp)];
  const ModelShard shard{me.tp, par.tp, l0, l1};
  const bool first = grid.first_stage(), last = grid.last_stage();
  const bool gpipe = par.schedule == "gpipe";
  const std::vector<dist::Action> actions =
      gpipe ? dist::schedule_gpipe(par.pp, me.pp, m) : dist::schedule_1f1b(par.pp, me.pp, m);
  const int slots = std::max(1, dist::max_in_flight(actions));

  auto ops = make_cpu_ops<float>();
  std::unique_ptr<dist::CommTpCollectives<float>> tpc;
  if (par.tp > 1) tpc = std::make_unique<dist::CommTpCollectives<float>>(grid.tp());
  ModelOptions mo;
  mo.micro_batch = B;
  mo.recompute = tr.recompute;
  mo.slots = slots;
  Model<float> model(*ops, cfg, shard, tpc.get(), mo);
  model.init(tr.seed);

  dist::AdamWConfig ac;
  ac.beta1 = tr.beta1; ac.beta2 = tr.beta2; ac.eps = tr.adam_eps;
  ac.weight_decay = tr.weight_decay; ac.clip = tr.clip;
  ac.zero = par.zero && par.dp > 1; ac.nonfinite_fatal = tr.nonfinite_fatal;
  dist::DistAdamW adam(*ops, model.params(), model.grads(), model.n_params(),
                       optimizer_segments(model.layout(), me.tp, !(par.pp > 1 && !first)), ac,
                       par.dp > 1 ? &grid.dp() : nullptr, world.size() > 1 ? &grid.mp() : nullptr);
  // Overlap: the last micro-batch's backward reports finished layers, whose
  // buckets start their DP reduction while earlier layers still compute.
  const bool overlap = par.overlap && par.dp > 1;
  if (overlap) model.set_grad_ready([&adam](size_t off, size_t n) { adam.grad_ready(off, n); });
  const ParamEntry* embed = model.layout().try_find("model.embed_tokens.weight");

  std::map<int64_t, std::string> dumps(opt.dumps.begin(), opt.dumps.end());

  const std::filesystem::path run_dir(tr.run_dir);
  std::ofstream metrics;
  if (root) {
    std::filesystem::create_directories(run_dir);
    write_text_atomic((run_dir / "config.toml").string(), run_config_to_toml(rc));
    metrics.open(run_dir / "metrics.jsonl", std::ios::trunc);
    WIOLA_CHECK(metrics.good(), "cannot write '", (run_dir / "metrics.jsonl").string(), "'");
  }

  if (root) {
    const auto& di = loader.info();
    std::printf("wiola train: %s  %lld parameters (d=%d L=%d H=%d H_kv=%d d_A=%d d_B=%d V=%d T=%d)\n",
                cfg.name.c_str(), (long long)n_params, cfg.d, cfg.L, cfg.H, cfg.Hkv, cfg.dA, cfg.dB,
                cfg.V, T);
    std::printf("  data %s: %llu train samples; global batch %lld = %d x %d micro-batches x %d DP "
                "(%lld tokens/step)\n", rc.data.path.c_str(), (unsigned long long)di.num_samples,
                (long long)GB, B, m, par.dp, (long long)(GB * T));
    std::printf("  Chinchilla budget: D = 20 x %lld = %lld tokens; T_max = ceil(D / (%lld x %d)) = %lld steps\n",
                (long long)n_params, (long long)(20 * n_params), (long long)GB, T,
                (long long)chinchilla_steps(n_params, GB, T));
    std::printf("  steps T_max = %lld (from %s), warmup %lld, lr %.3g -> %.3g, %d threads per rank\n",
                (long long)t_max, budget, (long long)warmup, tr.lr_max, tr.lr_min, cpu_threads());
    if (world.size() > 1)
      std::printf("  layout: %d ranks = tp %d x pp %d x dp %d; ZeRO %s; schedule %s with %d micro-batches, "
                  "predicted bubble %.3f; DP overlap %s\n",
                  world.size(), par.tp, par.pp, par.dp, ac.zero ? "on" : "off", par.schedule.c_str(), m,
                  dist::bubble_fraction_predicted(par.pp, m), overlap ? "on" : "off");
    if (par.pp > 1) {
      std::printf("  pipeline stages (%s balance):", par.stage_balance.c_str());
      for (const auto& [a, b] : stages) std::printf(" [%d,%d)", a, b);
      std::printf("\n");
    }
    std::printf("  memory (rank 0): parameters+gradients %.1f MiB, AdamW state %.1f MiB, activations %.1f MiB "
                "(%d slot%s)%s\n",
                double(model.param_bytes()) / 1048576.0, double(adam.state_bytes_this_rank()) / 1048576.0,
                double(model.activation_bytes()) / 1048576.0, slots, slots > 1 ? "s" : "",
                tr.recompute ? " (recompute on)" : "");
    if (!rc.checkpoint.dir.empty())
      std::printf("  note: checkpoint.dir is set but checkpoints are not written yet "
                  "(resumable checkpoints are a later issue)\n");
    std::fflush(stdout);
  }

  const int local_mb = int(loader.local_batch());  // B * m
  std::vector<int32_t> batch(size_t(local_mb) * (T + 1));
  const size_t mb_tokens = size_t(B) * (T + 1);
  // Each rank's loss is the mean over its own tokens; DistAdamW averages
  // over DP, which gives the mean over the global batch.
  const double scale = 1.0 / (double(B) * m * T);
  const double global_scale = 1.0 / double(GB * T);
  StageLink link(grid.pp(), size_t(B) * T * cfg.d);
  const int prev = me.pp - 1, next = me.pp + 1;
  TrainSummary sum;
  sum.t_max = t_max;
  double ema_step_s = 0, train_s = 0;
  // Pipeline figures over steps 2.. (step 1 warms caches and pages).
  double busy_s = 0, sched_s = 0;
  int64_t measured_steps = 0;
  std::map<std::string, dist::CommTraffic> traffic;  // per group, summed over measured steps
  auto snapshot = [&]() {
    std::map<std::string, dist::CommTraffic> s;
    for (auto k : {dist::GroupKind::Tp, dist::GroupKind::Pp, dist::GroupKind::Dp, dist::GroupKind::Embed,
                   dist::GroupKind::Mp})
      s[dist::group_name(k)] = grid.group(k).traffic();
    return s;
  };

  // Sum of this rank's last-stage CE values over the world (tp rank 0 of the
  // last stage of each DP replica contributes).
  auto world_loss = [&](double local) {
    const double mine = (last && me.tp == 0) ? local : 0.0;
    return world.size() > 1 ? world.all_reduce_value(mine, ReduceOp::Sum) : mine;
  };

  auto evaluate = [&]() {
    val->restore(val_start);
    std::vector<int32_t> vb(mb_tokens);
    double tot = 0;
    const int n = tr.eval_batches * m;
    for (int i = 0; i < n; ++i) {
      val->next_batch(vb.data());
      dist::set_context("evaluation batch " + std::to_string(i));
      if (!first) link.recv(model.fwd_in(0), prev, 2 * i);
      tot += model.stage_forward(0, vb.data(), 0.0, false);
      if (!last) link.send(model.fwd_out(0), next, 2 * i);
    }
    link.flush();
    return world_loss(tot) / (double(tr.eval_batches) * GB * T);
  };

  // Dumps: a flat buffer of this rank (backend memory) as full tensors on rank 0.
  auto gather_device = [&](const float* dev) {
    std::vector<float> host(model.n_params());
    ops->download(host.data(), dev, host.size() * sizeof(float));
    return gather_full(grid, cfg, model.layout(), host, stages);
  };
  const Fault fault = fault_from_env();
  for (int64_t t = 1; t <= last_step; ++t) {
    const auto t0 = Clock::now();
    const std::string step_ctx = "stage " + std::to_string(me.pp) + " step " + std::to_string(t);
    dist::set_context(step_ctx + " data");
    inject_fault(fault, world.rank(), t);
    loader.next_batch(batch.data());
    const auto dump_it = dumps.find(t);
    const bool dumping = dump_it != dumps.end();
    StepDump dump;
    std::map<int, std::vector<uint8_t>> atm_local;
    if (dumping) {
      model.set_keep_logits(world.size() == 1);
      dump.params = gather_device(model.params());
      if (t > 1) {
        std::vector<float> mm, vv;
        adam.gather_moments(mm, vv);
        dump.m = gather_full(grid, cfg, model.layout(), mm, stages);
        dump.v = gather_full(grid, cfg, model.layout(), vv, stages);
      }
    }
    // Reductions started during backward work in place on the gradients, so
    // a dump step (which reads them whole) runs without the overlap.
    const bool overlap_now = overlap && !dumping;
    const auto before = snapshot();
    model.zero_grads();
    double loss_sum = 0, busy = 0;
    const auto ts = Clock::now();
    for (size_t k = 0; k < actions.size(); ++k) {
      const dist::Action a = actions[k];
      const int slot = a.micro % slots;
      const int32_t* tok = batch.data() + size_t(a.micro) * mb_tokens;
      if (a.op == dist::Op::Fwd) {
        dist::set_context(step_ctx + " forward micro-batch " + std::to_string(a.micro));
        if (!first) link.recv(model.fwd_in(slot), prev, 2 * a.micro);
        const auto tb = Clock::now();
        loss_sum += model.stage_forward(slot, tok, scale, true);
        busy += seconds_since(tb);
        if (dumping && last) {
          const auto& lg = model.last_logits();
          dump.logits.insert(dump.logits.end(), lg.begin(), lg.end());
        }
        if (dumping)
          for (int l = l0; l < l1; ++l) {
            const auto& o = model.atm_open(l);
            if (!o.empty()) atm_local[l].insert(atm_local[l].end(), o.begin(), o.end());
          }
        if (!last) link.send(model.fwd_out(slot), next, 2 * a.micro);
      } else {
        dist::set_context(step_ctx + " backward micro-batch " + std::to_string(a.micro));
        if (!last) link.recv(model.bwd_in(), next, 2 * a.micro + 1);
        const bool final_bwd = k + 1 == actions.size();
        model.arm_grad_ready(overlap_now && final_bwd);
        const auto tb = Clock::now();
        model.stage_backward(slot);
        busy += seconds_since(tb);
        model.arm_grad_ready(false);
        if (!first) link.send(model.bwd_out(), prev, 2 * a.micro + 1);
      }
    }
    link.flush();
    const double sched = seconds_since(ts);
    // The tied embedding: the first stage's lookup gradient plus the last
    // stage's head gradient, identical on both afterwards.
    dist::set_context(step_ctx + " embedding gradient sum");
    if (embed && par.pp > 1)
      grid.embed().all_reduce(model.grads() + embed->offset, embed->size(), ReduceOp::Sum);
    if (embed && overlap_now) adam.grad_ready(embed->offset, embed->size());
    const double loss = world_loss(loss_sum) * global_scale;
    const double lr = lr_at(t, t_max, warmup, tr.lr_max, tr.lr_min);
    if (dumping) {
      // Gradient of the mean loss: the DP mean of the replicas' gradients.
      std::vector<float> host(model.n_params());
      ops->download(host.data(), model.grads(), host.size() * sizeof(float));
      if (par.dp > 1) {
        grid.dp().all_reduce(host.data(), host.size(), ReduceOp::Sum);
        for (float& x : host) x /= float(par.dp);
      }
      dump.grads = gather_full(grid, cfg, model.layout(), host, stages);
    }
    dist::set_context(step_ctx + " optimizer");
    const dist::StepResult res = adam.step(lr, adam.applied_steps() + 1);
    if (res.skipped) ++sum.skipped;
    if (t > 1 && !dumping) {
      const auto after = snapshot();
      for (const auto& [k, v] : after) {
        auto& acc = traffic[k];
        acc.ops += v.ops - before.at(k).ops;
        acc.payload_bytes += v.payload_bytes - before.at(k).payload_bytes;
        acc.wire_bytes += v.wire_bytes - before.at(k).wire_bytes;
      }
      busy_s += busy;
      sched_s += sched;
      ++measured_steps;
    }
    if (dumping) {
      model.set_keep_logits(false);
      dump.params_after = gather_device(model.params());
      dist::set_context(step_ctx + " dump gather");
      std::vector<uint8_t> atm_flat;
      for (auto& [l, v] : atm_local) atm_flat.insert(atm_flat.end(), v.begin(), v.end());
      if (par.tp > 1) check_atm_agrees_over_tp(grid, atm_flat, t);
      gather_tokens_and_atm(grid, cfg, stages, batch, atm_flat, size_t(local_mb) * T, dump);
      if (root) {
        dump.cfg = cfg;
        dump.B = int(GB);
        dump.loss = loss;
        dump.grad_norm = res.grad_norm;
        dump.float_attrs = {{"lr", lr}, {"lr_max", tr.lr_max}, {"lr_min", tr.lr_min},
                            {"beta1", tr.beta1}, {"beta2", tr.beta2}, {"adam_eps", tr.adam_eps},
                            {"weight_decay", tr.weight_decay}, {"clip", tr.clip}};
        dump.int_attrs = {{"step", t}, {"t_max", t_max}, {"warmup", warmup}};
        dist::set_context(step_ctx + " writing the numerics dump");
        write_step_dump(dump_it->second, ParamLayout(cfg, ModelShard{}), dump);
      }
    }
    const double step_s = seconds_since(t0);
    train_s += step_s;
    ema_step_s = t == 1 ? step_s : 0.9 * ema_step_s + 0.1 * step_s;
    const double tps = double(GB * T) / step_s;
    if (t == 1) sum.first_loss = loss;
    sum.last_loss = loss;
    sum.steps = t;

    const bool eval_now = val && (t % tr.eval_every == 0 || t == last_step);
    if (eval_now) sum.val_loss = evaluate();
    if (!root) continue;
    nlohmann::json j = {{"step", t}, {"loss", loss}, {"lr", lr}, {"grad_norm", res.grad_norm},
                        {"tokens", t * GB * T}, {"tokens_per_s", tps}, {"step_ms", step_s * 1e3},
                        {"skipped", sum.skipped}};
    if (!std::isfinite(loss)) j["loss"] = nullptr;
    if (!std::isfinite(res.grad_norm)) j["grad_norm"] = nullptr;
    if (eval_now) j["val_loss"] = sum.val_loss;
    metrics << j.dump() << '\n';
    metrics.flush();
    if (!opt.quiet && (t % tr.log_every == 0 || t == 1 || t == last_step || eval_now)) {
      std::printf("step %6lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %.0f tok/s | %.0f ms | ETA %s",
                  (long long)t, (long long)last_step, loss, lr, res.grad_norm, tps, step_s * 1e3,
                  human_duration(ema_step_s * double(last_step - t)).c_str());
      if (eval_now) std::printf(" | val %.4f", sum.val_loss);
      if (res.skipped) std::printf(" | SKIPPED (non-finite grad norm; %lld so far)", (long long)sum.skipped);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  sum.tokens_per_s = double(sum.steps * GB * T) / train_s;

  // ---- run report: throughput, pipeline bubble, traffic, memory per rank ------
  dist::set_context("run report");
  const double rss = peak_rss_mib();
  std::vector<double> rank_rss(size_t(world.size()), rss);
  std::vector<double> rank_busy(size_t(world.size()), busy_s), rank_sched(size_t(world.size()), sched_s);
  const std::vector<std::string> groups = {"tp", "pp", "dp", "embed", "mp"};
  std::vector<double> wire(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) wire[i] = double(traffic[groups[i]].wire_bytes);
  std::vector<double> rank_wire(groups.size() * size_t(world.size()), 0.0);
  if (world.size() > 1) {
    world.all_gather(&rss, rank_rss.data(), 1, DType::F64);
    world.all_gather(&busy_s, rank_busy.data(), 1, DType::F64);
    world.all_gather(&sched_s, rank_sched.data(), 1, DType::F64);
    world.all_gather(wire.data(), rank_wire.data(), wire.size(), DType::F64);
  } else {
    rank_wire = wire;
  }
  const TrafficModel model_traffic = analytic_traffic(rc, model, grid, ac.zero ? adam.shard_elems() * size_t(par.dp) : model.n_params());
  std::vector<double> analytic = {model_traffic.tp, model_traffic.pp, model_traffic.dp, model_traffic.embed, 0};
  std::vector<double> rank_analytic(groups.size() * size_t(world.size()), 0.0);
  if (world.size() > 1) world.all_gather(analytic.data(), rank_analytic.data(), analytic.size(), DType::F64);
  else rank_analytic = analytic;

  if (root) {
    std::printf("done: %lld steps, loss %.4f -> %.4f", (long long)sum.steps, sum.first_loss, sum.last_loss);
    if (sum.val_loss >= 0) std::printf(", val %.4f", sum.val_loss);
    std::printf(", %.0f tokens/s, %lld skipped steps, peak RSS %.0f MiB (rank 0)\n", sum.tokens_per_s,
                (long long)sum.skipped, rss);
    for (const auto& s : model.atm_stats())
      std::printf("  ATM layer %d (last batch): mu = %.4f, visible attention pairs %.2f%% of causal\n",
                  s.layer, s.mu, 100.0 * s.visible_fraction);
    nlohmann::json report = {{"world", world.size()}, {"tp", par.tp}, {"pp", par.pp}, {"dp", par.dp},
                             {"zero", ac.zero}, {"schedule", par.schedule}, {"micro_batches", m},
                             {"overlap", overlap}, {"steps", sum.steps}, {"tokens_per_s", sum.tokens_per_s},
                             {"bubble_predicted", dist::bubble_fraction_predicted(par.pp, m)}};
    if (measured_steps > 0 && world.size() > 1) {
      // Bubble: the share of the schedule's wall time a rank is not
      // computing (waiting for its neighbours), averaged over ranks.
      double idle = 0;
      for (int r = 0; r < world.size(); ++r)
        idle += rank_sched[size_t(r)] > 0 ? 1.0 - rank_busy[size_t(r)] / rank_sched[size_t(r)] : 0.0;
      idle /= world.size();
      report["bubble_measured"] = idle;
      // Compute seconds per step of every rank: shows stage imbalance (the
      // last stage also runs the head and the loss).
      std::vector<double> busy_per_step;
      for (double b : rank_busy) busy_per_step.push_back(b / double(measured_steps));
      report["compute_s_per_step"] = busy_per_step;
      std::printf("  pipeline: predicted bubble (p-1)/(m+p-1) = %.3f, measured idle share of the schedule %.3f "
                  "(mean over ranks, steps 2..%lld)\n",
                  dist::bubble_fraction_predicted(par.pp, m), idle, (long long)sum.steps);
      std::printf("  communication per rank per step (steps 2..; wire bytes, measured / analytic, max over ranks):\n");
      nlohmann::json comm = nlohmann::json::object();
      for (size_t i = 0; i < groups.size(); ++i) {
        double meas = 0, ana = 0;
        for (int r = 0; r < world.size(); ++r) {
          meas = std::max(meas, rank_wire[size_t(r) * groups.size() + i] / double(measured_steps));
          ana = std::max(ana, rank_analytic[size_t(r) * groups.size() + i]);
        }
        if (meas == 0 && ana == 0) continue;
        std::printf("    %-6s %12s / %s\n", groups[i].c_str(), human_bytes(meas).c_str(),
                    groups[i] == "mp" ? "(norm scalars)" : human_bytes(ana).c_str());
        comm[groups[i]] = {{"measured_bytes", meas}, {"analytic_bytes", ana}};
      }
      report["comm_per_rank_per_step"] = comm;
    }
    std::printf("  peak RSS per rank (MiB):");
    for (double r : rank_rss) std::printf(" %.0f", r);
    std::printf("\n  metrics: %s\n", (run_dir / "metrics.jsonl").string().c_str());
    report["peak_rss_mib"] = rank_rss;
    write_text_atomic((run_dir / "report.json").string(), report.dump(2) + "\n");
    std::fflush(stdout);
  }
  return sum;
}

}  // namespace wiola
