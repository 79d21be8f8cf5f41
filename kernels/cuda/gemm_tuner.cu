// Per-shape GEMM choices of the CUDA backend: see gemm_tuner.cuh.
#include "kernels/cuda/gemm_tuner.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublas_lib.cuh"
#include "util/error.h"

namespace wiola::cuda {
namespace {

void check_blas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error in ", what, ": ", cublas().status_string(st));
}

cublasLtMatmulAlgo_t algo_of(const GemmChoice& c) {
  cublasLtMatmulAlgo_t a{};
  for (size_t i = 0; i < 8 && i < c.lt_algo.size(); ++i) a.data[i] = c.lt_algo[i];
  return a;
}

GemmChoice lt_choice(const cublasLtMatmulAlgo_t& a) {
  GemmChoice c;
  c.algo = "cublaslt";
  c.lt_algo.assign(a.data, a.data + 8);
  c.config = GemmLt::describe(a);
  return c;
}

// C's elements (column-major, ldc apart) as floats, from device memory.
std::vector<float> download_c(const BlasGemm& g, const void* c) {
  std::vector<unsigned char> bytes(g.c_bytes());
  check(cudaMemcpy(bytes.data(), c, bytes.size(), cudaMemcpyDeviceToHost), "gemm check");
  std::vector<float> out;
  out.reserve(size_t(g.m) * size_t(g.n));
  for (int j = 0; j < g.n; ++j)
    for (int i = 0; i < g.m; ++i) {
      const size_t e = size_t(j) * size_t(g.ldc) + size_t(i);
      if (g.ct == CUDA_R_32F) {
        float v;
        std::memcpy(&v, bytes.data() + 4 * e, 4);
        out.push_back(v);
      } else {
        uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * e, 2);
        out.push_back(bf16_widen(b));
      }
    }
  return out;
}

// A scratch copy of g's C (its content, which beta > 0 reads), and g on it.
struct ScratchC {
  DeviceTemp buf;
  BlasGemm g;
  ScratchC(CachingAllocator& mem, const BlasGemm& orig, cudaStream_t s)
      : buf(mem, orig.c_bytes(), "a GEMM candidate's output"), g(orig) {
    g.C = buf.as<void>();
    check(cudaMemcpyAsync(g.C, orig.C, orig.c_bytes(), cudaMemcpyDeviceToDevice, s), "gemm scratch");
  }
};

}  // namespace

GemmTuner::GemmTuner(CachingAllocator& mem, cudaStream_t stream, cublasHandle_t blas, int device)
    : mem_(mem), stream_(stream), blas_(blas) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  sms_ = p.multiProcessorCount;
  device_ = std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor);
}

GemmTuner::~GemmTuner() = default;

GemmLt& GemmTuner::lt() {
  if (!lt_) lt_ = std::make_unique<GemmLt>(mem_, stream_);
  return *lt_;
}

void GemmTuner::set_mode(GemmMode mode) {
  if (mode == mode_) return;
  mode_ = mode;
  if (mode_ == GemmMode::Cublas) return;
  // The table's key: the device and cuBLASLt's version (loads cuBLASLt).
  if (device_.find("cuBLASLt") == std::string::npos) device_ += ", cuBLASLt " + std::to_string(GemmLt::version());
  in_use_ = GemmTable{device_, {}};
  measured_ = GemmTable{device_, {}};
  if (mode_ == GemmMode::Auto) adopt(committed_gemm_tuning(), "kernels/cuda/gemm_tuning.json (built in)");
}

void GemmTuner::run_default(const BlasGemm& g) {
  check_blas(cublas().gemm_ex(blas_, g.ta, g.tb, g.m, g.n, g.k, &g.alpha, g.A, g.at, g.lda, g.B, g.bt, g.ldb, &g.beta,
                              g.C, g.ct, g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "gemm");
}

cublasStatus_t GemmTuner::run(const BlasGemm& g, const GemmChoice& c) {
  if (c.algo == "cublaslt") return lt().run(g, algo_of(c));
  return cublas().gemm_ex(blas_, g.ta, g.tb, g.m, g.n, g.k, &g.alpha, g.A, g.at, g.lda, g.B, g.bt, g.ldb, &g.beta, g.C,
                          g.ct, g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

void GemmTuner::gemm(const BlasGemm& g, GemmKey key) {
  if (mode_ == GemmMode::Cublas) return run_default(g);
  for (const void* p : {g.A, g.B, static_cast<const void*>(g.C)}) {
    int a = 256;
    while (a > 1 && reinterpret_cast<uintptr_t>(p) % uintptr_t(a) != 0) a /= 2;
    key.align = std::min(key.align, a);
  }
  const std::string k = key.str();
  if (mode_ == GemmMode::Cublaslt) {
    auto it = heuristic_.find(k);
    if (it == heuristic_.end()) {
      const auto c = lt().candidates(g, key.align, 1, 0);
      if (c.empty()) return run_default(g);
      it = heuristic_.emplace(k, c[0]).first;
    }
    return check_lt(lt().run(g, it->second.algo), "cublasLtMatmul");
  }
  auto use = in_use_.choices.find(k);
  if (use != in_use_.choices.end() && !checked_[k]) {
    const std::string why = verify(g, use->second, reference(g));
    if (!why.empty()) {
      std::fprintf(stderr, "wiola: the tuned GEMM %s (%s %s) is not used: %s\n", k.c_str(), use->second.algo.c_str(),
                   use->second.config.c_str(), why.c_str());
      use->second = GemmChoice{};
    }
    checked_[k] = true;
  }
  if (use != in_use_.choices.end()) return check_blas(run(g, use->second), "gemm (tuned)");
  if (!measured_.choices.count(k)) measured_.choices[k] = sweep(g, key);
  run_default(g);
}

std::vector<float> GemmTuner::reference(const BlasGemm& g) {
  ScratchC s(mem_, g, stream_);
  run_default(s.g);
  return download_c(g, s.g.C);
}

std::string GemmTuner::verify(const BlasGemm& g, const GemmChoice& c, const std::vector<float>& ref) {
  ScratchC s(mem_, g, stream_);
  const cublasStatus_t st = run(s.g, c);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cudaGetLastError();
    return "status " + std::to_string(int(st));
  }
  const std::vector<float> got = download_c(g, s.g.C);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    scale = std::max(scale, double(std::fabs(ref[i])));
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  // bf16 outputs: a few units of bf16's rounding; fp32: summation order.
  const double tol = (g.ct == CUDA_R_32F ? 1e-3 : 2e-2) * std::max(scale, 1e-30);
  if (worst <= tol) return "";
  char buf[128];
  std::snprintf(buf, sizeof buf, "differs from cublasGemmEx by %.3g (max |C| %.3g, tolerance %.3g)", worst, scale, tol);
  return buf;
}

double GemmTuner::time_us(const BlasGemm& g, const GemmChoice& c) {
  ScratchC s(mem_, g, stream_);
  cudaEvent_t ev[kReps + 1];
  for (auto& e : ev) check(cudaEventCreate(&e), "gemm timing");
  run(s.g, c);  // warm-up
  check(cudaEventRecord(ev[0], stream_), "gemm timing");
  for (int r = 0; r < kReps; ++r) {
    run(s.g, c);
    check(cudaEventRecord(ev[r + 1], stream_), "gemm timing");
  }
  check(cudaEventSynchronize(ev[kReps]), "gemm timing");
  std::vector<float> ms(kReps);
  for (int r = 0; r < kReps; ++r) check(cudaEventElapsedTime(&ms[size_t(r)], ev[r], ev[r + 1]), "gemm timing");
  for (auto& e : ev) cudaEventDestroy(e);
  std::nth_element(ms.begin(), ms.begin() + kReps / 2, ms.end());
  return 1e3 * double(ms[kReps / 2]);
}

GemmChoice GemmTuner::sweep(const BlasGemm& g, const GemmKey& key) {
  const std::vector<float> ref = reference(g);
  std::vector<GemmChoice> cands{GemmChoice{}};
  for (const auto& a : lt().candidates(g, key.align, kCandidates, sms_)) cands.push_back(lt_choice(a.algo));
  GemmChoice best;
  best.us = INFINITY;
  std::vector<std::string> tried;
  for (GemmChoice& c : cands) {
    const std::string name = c.algo + (c.config.empty() ? "" : " " + c.config);
    if (const std::string why = verify(g, c, ref); !why.empty()) {  // wrong or refused: never a winner
      tried.push_back(name + ": rejected: " + why);
      continue;
    }
    c.us = time_us(g, c);
    char buf[32];
    std::snprintf(buf, sizeof buf, ": %.3f us", c.us);
    tried.push_back(name + buf);
    if (c.us < best.us) best = c;
  }
  if (!std::isfinite(best.us)) best = GemmChoice{};  // none passed (cublasGemmEx is its own reference)
  best.tried = std::move(tried);
  return best;
}

std::string GemmTuner::table() const {
  if (mode_ != GemmMode::Auto) return "";
  GemmTable t = in_use_;
  for (const auto& [k, c] : measured_.choices) t.choices.emplace(k, c);
  return gemm_tuning_json(t);
}

void GemmTuner::adopt(const std::string& text, const std::string& origin) {
  if (mode_ != GemmMode::Auto) return;
  std::string why;
  GemmTable t = gemm_table_for(text, device_, origin, &why);
  if (!why.empty()) {  // no table for this device and library
    std::fprintf(stderr, "wiola: GEMM tuning: %s: ignored\n", why.c_str());
    return;
  }
  for (const auto& [k, c] : t.choices) measured_.choices.erase(k);
  in_use_ = std::move(t);
  checked_.clear();
}

}  // namespace wiola::cuda
