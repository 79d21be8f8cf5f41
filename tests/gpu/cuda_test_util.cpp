// The CUDA op tests' shared pieces (cuda_test_util.h).
#include "tests/gpu/cuda_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

namespace wiola::cuda_test {

Vec randn(size_t n, uint64_t seed, float sd) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

float* OnBackend::in(const Vec& h) {
  bufs.emplace_back(ops, h.size());
  ops.upload(bufs.back().data(), h.data(), h.size() * sizeof(float));
  return bufs.back().data();
}

Vec OnBackend::out(const float* p, size_t n) {
  Vec h(n);
  ops.download(h.data(), p, n * sizeof(float));
  return h;
}

double rel(const Vec& a, const Vec& b, double floor) {
  double d = 0, m = floor;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(double(a[i]) - double(b[i])));
    m = std::max(m, std::abs(double(a[i])));
  }
  return d / m;
}

namespace {
// f on the reference backend and on the GPU's: every output within tol.
void same_on(const char* name, double tol, Ops<float>& ref, Ops<float>& gpu,
             const std::function<std::vector<Vec>(Ops<float>&)>& f) {
  const auto a = f(ref), b = f(gpu);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << name << " output " << i;
    const double e = rel(a[i], b[i]);
    std::printf("  %-28s output %zu: max rel diff %.2e (tol %.0e)\n", name, i, e, tol);
    EXPECT_LT(e, tol) << name << " output " << i;
  }
}
}  // namespace

void same_on_gpu(const char* name, double tol, const std::function<std::vector<Vec>(Ops<float>&)>& f) {
  same_on(name, tol, *make_backend<float>("cpu"), *make_cuda_ops(CudaPrecision::FP32), f);
}
void same_on_gpu_bf16(const char* name, double tol, const std::function<std::vector<Vec>(Ops<float>&)>& f) {
  same_on(name, tol, *make_backend<float>("cpu-bf16"), *make_cuda_ops(CudaPrecision::BF16), f);
}

Vec bf16_round_trip(Ops<float>& gpu, const Vec& h, DynBuffer<float>& dst) {
  Buffer<float> f(gpu, h.size());
  gpu.upload(f.data(), h.data(), f.bytes());
  gpu.convert(f.data(), dst.data(), h.size());
  gpu.convert(dst.data(), f.data(), h.size());
  Vec r(h.size());
  gpu.download(r.data(), f.data(), f.bytes());
  return r;
}

Vec bf16_download(Ops<float>& gpu, CPtr src, size_t n) {
  Buffer<float> f(gpu, n);
  gpu.convert(src, f.data(), n);
  Vec r(n);
  gpu.download(r.data(), f.data(), f.bytes());
  return r;
}

std::vector<int32_t> doc_starts(int T, const std::vector<std::vector<int>>& starts) {
  std::vector<int32_t> ds(starts.size() * size_t(T), 0);
  for (size_t b = 0; b < starts.size(); ++b) {
    int cur = 0;
    size_t next = 0;
    for (int t = 0; t < T; ++t) {
      if (next < starts[b].size() && starts[b][next] == t) cur = starts[b][next++];
      ds[b * size_t(T) + t] = cur;
    }
  }
  return ds;
}

std::vector<int32_t> test_documents(int B, int T) {
  std::vector<std::vector<int>> starts(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    const std::vector<int> at = b % 2 == 0 ? std::vector<int>{3, 4, 40, 64, 100, 101, 140, 192, 193}
                                           : std::vector<int>{1, 2, 63, 64, 128, 129, T - 1};
    for (int t : at)
      if (t > 0 && t < T && (starts[b].empty() || t > starts[b].back())) starts[b].push_back(t);
  }
  return doc_starts(T, starts);
}

void no_merge_across(std::vector<uint8_t>& open, const std::vector<int32_t>& doc_start, int B, int T) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t + 1 < T; ++t)
      if (doc_start[size_t(b) * T + t + 1] == t + 1) open[size_t(b) * T + t] = 0;
}

GpuAttnCall::GpuAttnCall(Ops<float>& gpu, const AttnShape& s, const AtmLayout& lay, const std::vector<uint8_t>& open,
                         CPtr k, CPtr v, bool with_atm, const std::vector<int32_t>& doc_start)
    : ke(gpu, lay.key_end.size()),
      ng(gpu, lay.n_groups.size()),
      gf(gpu, lay.group_first.size()),
      ds(gpu, doc_start.size()),
      so(gpu, open.size()),
      mk(gpu, DType::BF16, nk(s)),
      mv(gpu, DType::BF16, nk(s)),
      go(gpu, DType::BF16, nq(s)),
      gdq(gpu, DType::BF16, nq(s)),
      gdk(gpu, DType::BF16, nk(s)),
      gdv(gpu, DType::BF16, nk(s)),
      gdrk(gpu, DType::BF16, nk(s)),
      gdrv(gpu, DType::BF16, nk(s)),
      glse(gpu, nl(s)),
      keys_k(k),
      keys_v(v) {
  gpu.upload(ke.data(), lay.key_end.data(), ke.bytes());
  gpu.upload(ng.data(), lay.n_groups.data(), ng.bytes());
  gpu.upload(gf.data(), lay.group_first.data(), gf.bytes());
  gpu.upload(so.data(), open.data(), so.bytes());
  if (with_atm) {
    gpu.atm_merge_rows(k, s.B, s.Tq, s.Hkv * s.dh, gf.data(), ke.data(), ng.data(), mk.data());
    gpu.atm_merge_rows(v, s.B, s.Tq, s.Hkv * s.dh, gf.data(), ke.data(), ng.data(), mv.data());
    keys_k = mk.data();
    keys_v = mv.data();
    raw_k = k;
    raw_v = v;
    draw_k = gdrk.data();
    draw_v = gdrv.data();
    keys = AttnKeys{ke.data(), ng.data(), so.data()};
  }
  if (!doc_start.empty()) {
    gpu.upload(ds.data(), doc_start.data(), ds.bytes());
    keys.doc_start = ds.data();
  }
}

CpuAttnKeys::CpuAttnKeys(Ops<float>& cpu, const AtmLayout& lay, const std::vector<uint8_t>& open, bool with_atm,
                         const std::vector<int32_t>& doc_start)
    : ke(cpu, lay.key_end.size()), ng(cpu, lay.n_groups.size()), ds(cpu, doc_start.size()), so(cpu, open.size()) {
  cpu.upload(ke.data(), lay.key_end.data(), ke.bytes());
  cpu.upload(ng.data(), lay.n_groups.data(), ng.bytes());
  cpu.upload(so.data(), open.data(), so.bytes());
  if (with_atm) keys = AttnKeys{ke.data(), ng.data(), so.data()};
  if (!doc_start.empty()) {
    cpu.upload(ds.data(), doc_start.data(), ds.bytes());
    keys.doc_start = ds.data();
  }
}

std::vector<Vec> cpu_attention(Ops<float>& cpu, Ops<float>& gpu, const AttnShape& s, const AttnInputs& in,
                               const GpuAttnCall& c, bool with_atm) {
  const size_t nq = GpuAttnCall::nq(s), nk = GpuAttnCall::nk(s), nl = GpuAttnCall::nl(s);
  const bool bwd = !in.dout.empty();
  // With ATM the keys are the GPU's merged rows (bf16); the raw ones are k and v.
  const Vec mkh = with_atm ? bf16_download(gpu, c.mk.data(), nk) : in.k,
            mvh = with_atm ? bf16_download(gpu, c.mv.data(), nk) : in.v;
  OnBackend r(cpu);
  float *cq = r.in(in.q), *ck = r.in(mkh), *cv = r.in(mvh), *crk = r.in(in.k), *crv = r.in(in.v);
  float *co = r.in(Vec(nq)), *clse = r.in(Vec(nl));
  const CpuAttnKeys cpu_keys(cpu, in.lay, in.open, with_atm, in.doc_start);
  const AttnKeys ckeys = cpu_keys.keys;
  float *raw_k = with_atm ? crk : nullptr, *raw_v = with_atm ? crv : nullptr;
  cpu.attention_fwd(s, ckeys, cq, ck, cv, raw_k, raw_v, co, clse);
  std::vector<Vec> ref{r.out(co, nq), r.out(clse, nl)};
  if (!bwd) return ref;
  float *cdo = r.in(in.dout), *cdq = r.in(Vec(nq)), *cdk = r.in(Vec(nk)), *cdv = r.in(Vec(nk)), *cdrk = r.in(Vec(nk)),
        *cdrv = r.in(Vec(nk));
  cpu.attention_bwd(s, ckeys, cq, ck, cv, raw_k, raw_v, co, clse, cdo, cdq, cdk, cdv, with_atm ? cdrk : nullptr,
                    with_atm ? cdrv : nullptr);
  for (auto [p, n] : {std::pair{cdq, nq}, std::pair{cdk, nk}, std::pair{cdv, nk}}) ref.push_back(r.out(p, n));
  if (with_atm) {
    ref.push_back(r.out(cdrk, nk));
    ref.push_back(r.out(cdrv, nk));
  }
  return ref;
}

}  // namespace wiola::cuda_test
