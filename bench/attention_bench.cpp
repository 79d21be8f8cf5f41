// Micro-benchmark of the CPU self-attention kernels (forward, backward) in
// float, with cblas_sgemm 512^3 in the same run for scale. FLOPs: forward
// 4*B*H*dh per visible (query, key) pair, backward 2.5x the forward.
// Run e.g.  OMP_NUM_THREADS=2 build/bench/attention_bench
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <random>
#include <vector>

#include "kernels/cpu/attention.h"

namespace {

std::vector<float> randn(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& e : x) e = nd(rng);
  return x;
}

void BM_sgemm(benchmark::State& st) {
  const int n = int(st.range(0));
  const auto a = randn(size_t(n) * n, 1), b = randn(size_t(n) * n, 2);
  std::vector<float> c(size_t(n) * n);
  for (auto _ : st) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f,
                a.data(), n, b.data(), n, 0.0f, c.data(), n);
    benchmark::ClobberMemory();
  }
  st.counters["GFLOPS"] = benchmark::Counter(
      2.0 * n * n * n * double(st.iterations()), benchmark::Counter::kIsRate,
      benchmark::Counter::kIs1000);
}

struct Inputs {
  wiola::AttnShape s;
  std::vector<float> q, k, v, o, lse, dout, dq, dk, dv;
  double fwd_flops;
  explicit Inputs(const benchmark::State& st) {
    s = wiola::AttnShape{int(st.range(0)), int(st.range(1)), int(st.range(1)),
                         int(st.range(2)), int(st.range(3)), int(st.range(4)),
                         0};
    const size_t nq = size_t(s.B) * s.Tq * s.H * s.dh;
    const size_t nkv = size_t(s.B) * s.Tk * s.Hkv * s.dh;
    q = randn(nq, 3);
    k = randn(nkv, 4);
    v = randn(nkv, 5);
    dout = randn(nq, 6);
    o.resize(nq);
    dq.resize(nq);
    dk.resize(nkv);
    dv.resize(nkv);
    lse.resize(size_t(s.B) * s.H * s.Tq);
    const double pairs = 0.5 * double(s.Tq) * (s.Tq + 1);
    fwd_flops = 4.0 * s.B * s.H * s.dh * pairs;
  }
  void fwd() {
    wiola::cpu::attention_fwd<float>(s, {}, q.data(), k.data(), v.data(),
                                     nullptr, nullptr, o.data(), lse.data());
  }
  void bwd() {
    wiola::cpu::attention_bwd<float>(s, {}, q.data(), k.data(), v.data(),
                                     nullptr, nullptr, o.data(), lse.data(),
                                     dout.data(), dq.data(), dk.data(),
                                     dv.data(), nullptr, nullptr);
  }
};

void BM_attention_fwd(benchmark::State& st) {
  Inputs in(st);
  for (auto _ : st) {
    in.fwd();
    benchmark::ClobberMemory();
  }
  st.counters["GFLOPS"] = benchmark::Counter(
      in.fwd_flops * double(st.iterations()), benchmark::Counter::kIsRate,
      benchmark::Counter::kIs1000);
}

void BM_attention_bwd(benchmark::State& st) {
  Inputs in(st);
  in.fwd();
  for (auto _ : st) {
    in.bwd();
    benchmark::ClobberMemory();
  }
  st.counters["GFLOPS"] = benchmark::Counter(
      2.5 * in.fwd_flops * double(st.iterations()), benchmark::Counter::kIsRate,
      benchmark::Counter::kIs1000);
}

// Args: B, T, H, Hkv, dh.
void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "T", "H", "Hkv", "dh"});
  b->Args({8, 256, 8, 4, 32});
  b->Args({1, 2048, 12, 4, 64});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_sgemm)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_attention_fwd)->Apply(shapes);
BENCHMARK(BM_attention_bwd)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
