#include "perf/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "dist/optimizer.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace wiola::perf {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// TP collectives that do nothing: the rank's own compute, no partner.
class NoTp final : public TpCollectives {
 public:
  void all_reduce_sum(Ptr, size_t) override {}
  void all_reduce_max(Ptr, size_t) override {}
  void all_reduce_sum(double*, size_t) override {}
};

// Threads of the CPU backend for the scope.
class ThreadScope {
 public:
  explicit ThreadScope(int n) : saved_(cpu_threads()) { set_cpu_threads(n); }
  ~ThreadScope() { set_cpu_threads(saved_); }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int saved_;
};

void fill_random(Ops<float>& ops, Ptr dst, size_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> host(n);
  for (float& x : host) x = nd(rng);
  if (dst.dtype() == DType::F32) {
    ops.upload(dst.raw(), host.data(), n * sizeof(float));
  } else {  // storage in another type: upload fp32 and convert on the backend
    Buffer<float> tmp(ops, n);
    ops.upload(tmp.data(), host.data(), n * sizeof(float));
    ops.convert(CPtr(tmp.data()), dst, n);
  }
}

double time_adamw(Ops<float>& ops) {
  const size_t n = size_t(1) << 22;
  Buffer<float> p(ops, n), g(ops, n);
  ops.zero(p.data(), p.bytes());
  std::vector<float> host(n, 1e-3f);
  ops.upload(g.data(), host.data(), n * sizeof(float));
  dist::DistAdamW adam(ops, p.data(), g.data(), n, {{0, n, true, true}}, dist::AdamWConfig{}, nullptr, nullptr);
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    adam.step(1e-3, r + 1);
    t.push_back(since(t0));
  }
  return median(t) / double(n);
}

double copy_gbs() {
  const size_t n = size_t(64) << 20;
  std::vector<unsigned char> a(n, 1), b(n, 2);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, since(t0));
    a[size_t(r)] = b[n - 1 - size_t(r)];  // keep the copies observable
  }
  return double(n) / best / 1e9;
}

}  // namespace

CpuCompute::CpuCompute(const ModelConfig& c, int threads, int reps, int ranks) : cfg_(c) {
  cal_.threads = threads;
  cal_.reps = reps;
  cal_.ranks = ranks;
  ThreadScope ts(threads);
  auto ops = make_backend<float>("cpu");
  cal_.copy_gbs = copy_gbs();
  // AdamW is memory-bound: timed while the other ranks' copies run too.
  std::vector<double> adam(static_cast<size_t>(ranks));
  std::vector<std::thread> others;
  for (int r = 1; r < ranks; ++r)
    others.emplace_back([&, r] {
      set_cpu_threads(threads);
      auto o = make_backend<float>("cpu");
      adam[size_t(r)] = time_adamw(*o);
    });
  adam[0] = time_adamw(*ops);
  for (auto& t : others) t.join();
  cal_.adam_s_per_elem = median(adam);
  cal_.sgemm_flops = openblas_sgemm_gflops(1024, 5) * 1e9;
}

namespace {

// Median forward and backward seconds of one micro-batch of a stage, on the
// calling thread with `threads` OpenMP threads.
std::pair<double, double> time_stage(const ModelConfig& cfg, const Layout& lay, const ModelShard& sh, int threads,
                                     int reps, uint64_t seed) {
  set_cpu_threads(threads);
  auto ops = make_backend<float>("cpu");
  NoTp notp;
  ModelOptions mo;
  mo.micro_batch = lay.micro_batch;
  mo.recompute = lay.recompute;
  Model<float> model(*ops, cfg, sh, lay.tp > 1 ? &notp : nullptr, mo);
  model.init(1234);
  std::mt19937_64 rng(seed);
  std::vector<int32_t> tok(size_t(lay.micro_batch) * (cfg.T + 1));
  for (auto& t : tok) t = int32_t(rng() % uint64_t(cfg.V));
  const size_t nd = size_t(lay.micro_batch) * cfg.T * cfg.d;
  for (Ptr p : model.fwd_in(0)) fill_random(*ops, p, nd, 1.0f, seed++);
  const double scale = 1.0 / (double(lay.micro_batch) * cfg.T);
  std::vector<double> tf, tb;
  constexpr int kWarmup = 2;  // first touches, caches
  for (int r = 0; r < kWarmup + reps; ++r) {
    for (Ptr p : model.bwd_in()) fill_random(*ops, p, nd, 1e-3f, seed++);
    const auto t0 = Clock::now();
    model.stage_forward(0, tok.data(), scale, true);
    const double f = since(t0);
    const auto t1 = Clock::now();
    model.stage_backward(0);
    const double b = since(t1);
    if (r >= kWarmup) {
      tf.push_back(f);
      tb.push_back(b);
    }
  }
  model.take_loss_sum();
  return {median(tf), median(tb)};
}

}  // namespace

const CpuCompute::Timing& CpuCompute::timed(const Layout& lay, int stage) {
  const ModelShard sh = stage_shard(cfg_, lay, stage);
  const Key key{lay.tp, sh.layer_begin, sh.end(cfg_), lay.micro_batch, lay.recompute};
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  ThreadScope ts(cal_.threads);
  const auto solo = time_stage(cfg_, lay, sh, cal_.threads, cal_.reps, 7);
  if (cal_.ranks == 1) return cache_[key] = {solo, solo};
  // The other ranks' cores run the same work meanwhile (own threads, own
  // models); the figure is the median over every copy's median.
  std::vector<std::pair<double, double>> got(size_t(cal_.ranks));
  std::vector<std::thread> others;
  for (int r = 1; r < cal_.ranks; ++r)
    others.emplace_back([&, r] { got[size_t(r)] = time_stage(cfg_, lay, sh, cal_.threads, cal_.reps, 7 + 100 * r); });
  got[0] = time_stage(cfg_, lay, sh, cal_.threads, cal_.reps, 7);
  for (auto& t : others) t.join();
  std::vector<double> f, b;
  for (const auto& [x, y] : got) {
    f.push_back(x);
    b.push_back(y);
  }
  return cache_[key] = {solo, {median(f), median(b)}};
}

// While the other stages idle, a stage runs alone: the share of its work
// overlapped by others runs at the contended speed (simulated once
// predict() knows it; before, 1 - (p-1)/(m+p-1)).
double CpuCompute::blend(const Workload& w, int stage, double solo, double together) const {
  const double alone = w.alone_share.empty() ? w.bubble_analytic : w.alone_share[size_t(stage)];
  return solo + (together - solo) * (1.0 - alone);
}

double CpuCompute::fwd(const Workload& w, int stage) {
  const auto& t = timed(w.layout, stage);
  return blend(w, stage, t.solo.first, t.together.first);
}
double CpuCompute::bwd(const Workload& w, int stage) {
  const auto& t = timed(w.layout, stage);
  return blend(w, stage, t.solo.second, t.together.second);
}

std::string CpuCompute::describe() const {
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "stage work timed on this CPU, %d thread%s per rank, %d cop%s at once (median of %d); "
                "AdamW %.2f ns/param; memcpy %.1f GB/s; sgemm %.1f GFLOP/s",
                cal_.threads, cal_.threads == 1 ? "" : "s", cal_.ranks, cal_.ranks == 1 ? "y" : "ies", cal_.reps, cal_.adam_s_per_elem * 1e9, cal_.copy_gbs,
                cal_.sgemm_flops / 1e9);
  return buf;
}

Cluster cpu_cluster(const CpuCalibration& cal, int ranks) {
  Cluster c;
  c.device = "cpu";
  c.devices = ranks;
  c.per_node = ranks;
  c.memory_bytes = 0;
  c.intra_gbs = c.inter_gbs = cal.copy_gbs / 2;
  c.latency_s = c.inter_latency_s = 5e-6;
  c.peak_flops = cal.sgemm_flops;
  c.hidden_dp = false;  // Open MPI progresses only inside its calls
  return c;
}

}  // namespace wiola::perf
