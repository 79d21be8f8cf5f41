// Micro-benchmark of the CPU self-attention kernels (forward, backward) in
// float, with cblas_sgemm 512^3 in the same run for scale, and
// BM_attention_*_gemms: the same threads making exactly the BLAS calls the
// kernels make (same shapes, same count, no softmax), i.e. the rate the
// kernels would reach if the row softmax and packing were free. FLOPs (all
// rows): forward 4*B*H*dh per visible (query, key) pair, backward 2.5x the
// forward (the GEMMs compute a little more: each block's keys up to its last
// row). BM_attention_documents: forward + backward of one window at T = 2048
// as one causal document (docs = 0) and holding documents of mean length 256
// (docs/model.md §2 "Documents": the kernels skip the keys outside a query's
// document).  Run e.g.  OMP_NUM_THREADS=2 build/bench/attention_bench
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <omp.h>

#include <algorithm>
#include <random>
#include <vector>

#include "bench/document_layout.h"
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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    benchmark::ClobberMemory();
  }
  st.counters["GFLOPS"] = benchmark::Counter(2.0 * n * n * n * double(st.iterations()), benchmark::Counter::kIsRate,
                                             benchmark::Counter::kIs1000);
}

struct Inputs {
  wiola::AttnShape s;
  std::vector<float> q, k, v, o, lse, dout, dq, dk, dv;
  double fwd_flops;
  explicit Inputs(const benchmark::State& st) {
    s = wiola::AttnShape{
        int(st.range(0)), int(st.range(1)), int(st.range(1)), int(st.range(2)), int(st.range(3)), int(st.range(4)), 0};
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
  wiola::AttnKeys keys{};  // documents: keys.doc_start = starts
  std::vector<int32_t> starts;
  // Documents of random lengths with mean `mean_len` (exponential, seeded)
  // in every window: the layout of wiola_kernel_bench's documents row.
  void documents(int mean_len) {
    starts = wiola::bench::random_documents(s.B, s.Tq, mean_len);
    keys.doc_start = starts.data();
  }
  void fwd() {
    wiola::cpu::attention_fwd<float>(s, keys, q.data(), k.data(), v.data(), nullptr, nullptr, o.data(), lse.data());
  }
  void bwd() {
    wiola::cpu::attention_bwd<float>(s, keys, q.data(), k.data(), v.data(), nullptr, nullptr, o.data(), lse.data(),
                                     dout.data(), dq.data(), dk.data(), dv.data(), nullptr, nullptr);
  }
};

void BM_attention_fwd(benchmark::State& st) {
  Inputs in(st);
  for (auto _ : st) {
    in.fwd();
    benchmark::ClobberMemory();
  }
  st.counters["GFLOPS"] = benchmark::Counter(in.fwd_flops * double(st.iterations()), benchmark::Counter::kIsRate,
                                             benchmark::Counter::kIs1000);
}

void BM_attention_bwd(benchmark::State& st) {
  Inputs in(st);
  in.fwd();
  for (auto _ : st) {
    in.bwd();
    benchmark::ClobberMemory();
  }
  st.counters["GFLOPS"] = benchmark::Counter(2.5 * in.fwd_flops * double(st.iterations()), benchmark::Counter::kIsRate,
                                             benchmark::Counter::kIs1000);
}

// Forward + backward of a window holding documents of mean length range(5)
// (0: one causal document); time only, the visible pairs differ.
void BM_attention_documents(benchmark::State& st) {
  Inputs in(st);
  if (st.range(5) > 0) in.documents(int(st.range(5)));
  for (auto _ : st) {
    in.fwd();
    in.bwd();
    benchmark::ClobberMemory();
  }
}

// The BLAS calls of the kernels for plain causal attention (attention.cpp):
// per (b, group, query block) R = rep*nq stacked rows against the key
// prefix kmax; forward QK^T and PV, backward QK^T, dO V^T, P^T dO, dS^T Q, dS K.
void attention_gemms(const wiola::AttnShape& s, bool backward, const float* q, const float* k, float* scratch_s,
                     float* scratch_o) {
  const int BQ = backward && s.Tk >= wiola::cpu::kAttnLongKeys ? wiola::cpu::kAttnBlockQLong : wiola::cpu::kAttnBlockQ;
  const int rep = s.H / s.Hkv, n_qt = (s.Tq + BQ - 1) / BQ, dh = s.dh;
  const long items = long(s.B) * s.Hkv * n_qt;
  const size_t s_size = size_t(rep) * wiola::cpu::kAttnBlockQLong * ((s.Tk + 15) / 16 * 16);
#pragma omp parallel for schedule(dynamic, 1)
  for (long it = 0; it < items; ++it) {
    const int qt = n_qt - 1 - int((it / s.Hkv) % n_qt);
    const int nq = std::min(BQ, s.Tq - qt * BQ), rows = rep * nq;
    const int kmax = std::min(qt * BQ + nq, s.Tk), ld = (kmax + 15) / 16 * 16;
    float* S = scratch_s + size_t(omp_get_thread_num()) * 2 * s_size;
    float* O = scratch_o + size_t(omp_get_thread_num()) * 2 *
                               size_t(std::max(rep * wiola::cpu::kAttnBlockQLong, s.Tk)) * s.Hkv * dh;
    const int kv_ld = s.Hkv * dh;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, kmax, dh, 1.f, q, dh, k, kv_ld, 0.f, S, ld);
    if (!backward) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, dh, kmax, 1.f, S, ld, k, kv_ld, 0.f, O, dh);
      continue;
    }
    float* dS = S + s_size;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, kmax, dh, 1.f, q, dh, k, kv_ld, 0.f, dS, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kmax, dh, rows, 1.f, S, ld, q, dh, 1.f, O, kv_ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kmax, dh, rows, 1.f, dS, ld, q, dh, 1.f, O, kv_ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, dh, kmax, 1.f, dS, ld, k, kv_ld, 0.f, O, dh);
  }
}

void BM_attention_gemms(benchmark::State& st, bool backward) {
  Inputs in(st);
  const int nt = omp_get_max_threads(), rep = in.s.H / in.s.Hkv;
  const size_t s_size = size_t(rep) * wiola::cpu::kAttnBlockQLong * ((in.s.Tk + 15) / 16 * 16);
  std::vector<float> sbuf(size_t(nt) * 2 * s_size),
      obuf(size_t(nt) * 2 * size_t(std::max(rep * wiola::cpu::kAttnBlockQLong, in.s.Tk)) * in.s.Hkv * in.s.dh);
  openblas_set_num_threads(1);
  for (auto _ : st) {
    attention_gemms(in.s, backward, in.q.data(), in.k.data(), sbuf.data(), obuf.data());
    benchmark::ClobberMemory();
  }
  st.counters["GFLOPS"] = benchmark::Counter((backward ? 2.5 : 1.0) * in.fwd_flops * double(st.iterations()),
                                             benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
void BM_attention_fwd_gemms(benchmark::State& st) { BM_attention_gemms(st, false); }
void BM_attention_bwd_gemms(benchmark::State& st) { BM_attention_gemms(st, true); }

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
BENCHMARK(BM_attention_fwd_gemms)->Apply(shapes);
BENCHMARK(BM_attention_bwd_gemms)->Apply(shapes);
BENCHMARK(BM_attention_documents)
    ->ArgNames({"B", "T", "H", "Hkv", "dh", "docs"})
    ->Args({1, 2048, 12, 4, 64, 0})
    ->Args({1, 2048, 12, 4, 64, 256})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
