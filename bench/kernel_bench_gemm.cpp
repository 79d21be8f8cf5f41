// wiola_kernel_bench's GEMM section: every distinct GEMM of the step with
// bf16 operands, the parameter operand aligned and misaligned, the tuner's
// sweep where asked, then the merged projections (kernel_bench_merge.cpp).
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "bench/kernel_bench.h"
#include "kernels/gemm_tuning.h"

namespace kernel_bench {
namespace {

// One GEMM call of the step, as the model issues it (row-major, ops.h's gemm).
struct GemmCall {
  std::string role;
  Trans ta, tb;
  int m, n, k, lda, ldb, ldc;
  float beta;
  DType c;     // C's storage type in the bf16 step (activations bf16; residual, gradients fp32)
  char param;  // the operand that is a parameter tensor: 'B' (weight) or 'C' (its gradient)
  long count;  // calls per step
  const char* note = "";
};

// Every GEMM of one wiola-360m step without recompute (model/layer.cpp,
// model/linear.h, model/model.cpp): y = x W^T is gemm(N, T); dx = dy W is
// gemm(N, N); dW += dy^T x is gemm(T, N).
std::vector<GemmCall> step_gemms(const Shapes& sh) {
  const auto& c = sh.cfg;
  const int N = sh.N(), d = c.d, hd = c.H * c.dh(), kvd = c.Hkv * c.dh(), dA = c.dA, dB = c.dB, V = c.V;
  const int qkvg = 2 * hd + 2 * kvd, nc = c.Lambda;
  const long L = c.L;
  long ctx_rows = 0;  // context rows summed over layers: min(Lambda, l + 1)
  for (int l = 0; l < c.L; ++l) ctx_rows += c.n_ctx(l);
  const DType bf = DType::BF16, f32 = DType::F32;
  const Trans n_ = Trans::N, t_ = Trans::T;
  const char* conv = "the step's fp32 operand (X-tilde, summaries or dX-half) is rounded to bf16 first";
  std::vector<GemmCall> g = {
      // forward
      {"qkvg fwd", n_, t_, N, qkvg, d, d, d, qkvg, 0, bf, 'B', L, conv},
      {"ctx k|v fwd", n_, t_, N, 2 * kvd, d, d, d, nc * 2 * kvd, 0, bf, 'B', ctx_rows, conv},
      {"o_proj fwd", n_, t_, N, d, hd, hd, hd, d, 0, f32, 'B', L, ""},
      {"dsff a gate/up fwd", n_, t_, N, dA, d, d, d, dA, 0, bf, 'B', 2 * L, ""},
      {"dsff a down fwd", n_, t_, N, d, dA, dA, dA, d, 0, bf, 'B', L, ""},
      {"dsff b up fwd", n_, t_, N, dB, d, d, d, dB, 0, bf, 'B', L, ""},
      {"dsff b down fwd", n_, t_, N, d, dB, dB, dB, d, 0, bf, 'B', L, ""},
      {"fusion fwd", n_, t_, N, d, d, d, 2 * d, d, 1, bf, 'B', 2 * L, ""},
      {"logits fwd", n_, t_, N, V, d, d, d, V, 0, bf, 'B', 1, ""},
      // backward: data
      {"logits bwd data", n_, n_, N, d, V, V, d, d, 0, bf, 'B', 1, ""},
      {"fusion bwd data", n_, n_, N, d, d, d, 2 * d, d, 1, bf, 'B', 2 * L, ""},
      {"dsff b down bwd data", n_, n_, N, dB, d, d, dB, dB, 0, bf, 'B', L, ""},
      {"dsff b up bwd data", n_, n_, N, d, dB, dB, d, d, 0, f32, 'B', L, ""},
      {"dsff a down bwd data", n_, n_, N, dA, d, d, dA, dA, 0, bf, 'B', L, ""},
      {"dsff a gate/up bwd data", n_, n_, N, d, dA, dA, d, d, 1, f32, 'B', 2 * L, ""},
      {"o_proj bwd data", n_, n_, N, hd, d, d, hd, hd, 0, bf, 'B', L, conv},
      {"ctx k|v bwd data", n_, n_, N, d, 2 * kvd, nc * 2 * kvd, d, d, 1, f32, 'B', ctx_rows, ""},
      {"qkvg bwd data", n_, n_, N, d, qkvg, qkvg, d, d, 0, f32, 'B', L, ""},
      // backward: weights
      {"logits bwd weight", t_, n_, V, d, N, V, d, d, 1, f32, 'C', 1, ""},
      {"fusion bwd weight", t_, n_, d, d, N, d, d, 2 * d, 1, f32, 'C', 2 * L, ""},
      {"dsff b down bwd weight", t_, n_, d, dB, N, d, dB, dB, 1, f32, 'C', L, ""},
      {"dsff a down bwd weight", t_, n_, d, dA, N, d, dA, dA, 1, f32, 'C', L, ""},
      {"dsff b up bwd weight", t_, n_, dB, d, N, dB, d, d, 1, f32, 'C', L, ""},
      {"dsff a gate/up bwd weight", t_, n_, dA, d, N, dA, d, d, 1, f32, 'C', 2 * L, ""},
      {"o_proj bwd weight", t_, n_, d, hd, N, d, hd, hd, 1, f32, 'C', L, conv},
      {"ctx k|v bwd weight", t_, n_, 2 * kvd, d, N, nc * 2 * kvd, d, d, 1, f32, 'C', ctx_rows, conv},
      {"qkvg bwd weight", t_, n_, qkvg, d, N, qkvg, d, d, 1, f32, 'C', L, conv},
  };
  return g;
}

// Elements an operand of op(X)[rows, cols] with leading dimension ld spans.
size_t span(Trans t, int rows, int cols, int ld) {
  return t == Trans::N ? size_t(rows - 1) * ld + cols : size_t(cols - 1) * ld + rows;
}

// Calls with the same shape, layout and C type are one distinct GEMM.
struct Distinct {
  GemmCall call;
  std::vector<std::string> roles;
  long count = 0;
};

// Each distinct GEMM (aligned operands) swept by the backend's tuner from
// an empty table (gemm = auto, kernels/cuda/gemm_tuner.cuh): cublasGemmEx
// and cuBLASLt's candidates, split-K forms included where the GEMM has fewer
// output tiles than the device has SMs, each checked against cublasGemmEx,
// then timed. One JSON line per candidate; --write-tuning FILE: the winners
// as a tuning table put into FILE (kernels/cuda/gemm_tuning.json's format).
void tune_gemms(Ops<float>& g, const Options& o, Report& rep, const std::vector<Distinct>& gemms, CPtr a, CPtr b,
                Ptr c32) {
  wiola::BackendOptions tuning = o.backend;
  tuning.gemm = wiola::GemmMode::Auto;
  OptionsScope scope(g, o.backend, tuning);
  const std::string device = json::parse(g.gemm_tuning())["tables"][0]["device"].get<std::string>();
  g.adopt_gemm_tuning(wiola::gemm_tuning_json(wiola::GemmTable{device, {}}));  // sweep every GEMM
  for (const auto& x : gemms) {
    const GemmCall& c = x.call;
    g.gemm(c.ta, c.tb, c.m, c.n, c.k, 1.f, a, c.lda, b, c.ldb, c.beta, Ptr(c32.raw(), c.c), c.ldc);
  }
  g.synchronize();
  const std::string text = g.gemm_tuning();
  const wiola::GemmTable t = wiola::gemm_table_for(text, device, "the sweep");
  for (const auto& [key, choice] : t.choices) {
    for (const std::string& cand : choice.tried) {
      rep.emit(json{{"section", "gemm tuning"},
                    {"name", "gemm tuning " + key + ": " + cand},
                    {"device", device},
                    {"key", key},
                    {"candidate", cand},
                    {"ok", cand.find("rejected") == std::string::npos}});
    }
    rep.emit(json{{"section", "gemm tuning"},
                  {"name", "gemm tuning " + key},
                  {"device", device},
                  {"key", key},
                  {"winner", choice.algo + (choice.config.empty() ? "" : " " + choice.config)},
                  {"us", choice.us},
                  {"ok", true}});
    std::printf("gemm tuning %-60s -> %s %s (%.3f us; %zu candidates)\n", key.c_str(), choice.algo.c_str(),
                choice.config.c_str(), choice.us, choice.tried.size());
  }
  if (!o.write_tuning.empty()) {
    std::string old;
    if (std::FILE* f = std::fopen(o.write_tuning.c_str(), "r")) {
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) old.append(buf, n);
      std::fclose(f);
    }
    std::FILE* f = std::fopen(o.write_tuning.c_str(), "w");
    WIOLA_CHECK(f, "wiola_kernel_bench: cannot write ", o.write_tuning);
    const std::string merged = wiola::merge_gemm_tuning(old, t);
    std::fwrite(merged.data(), 1, merged.size(), f);
    std::fclose(f);
    std::printf("gemm tuning: the table for %s written to %s\n", device.c_str(), o.write_tuning.c_str());
  }
}

}  // namespace

void run_gemm(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep) {
  std::vector<Distinct> gemms;
  for (const GemmCall& c : step_gemms(sh)) {
    auto same = [&](const Distinct& x) {
      const GemmCall& y = x.call;
      return y.ta == c.ta && y.tb == c.tb && y.m == c.m && y.n == c.n && y.k == c.k && y.lda == c.lda &&
             y.ldb == c.ldb && y.ldc == c.ldc && y.beta == c.beta && y.c == c.c && y.param == c.param;
    };
    auto it = std::find_if(gemms.begin(), gemms.end(), same);
    if (it == gemms.end()) it = gemms.insert(gemms.end(), Distinct{c, {}, 0});
    it->roles.push_back(c.role);
    it->count += c.count;
  }
  // One A, B and C buffer for all, each the largest any GEMM needs plus room
  // for the misaligned offset; random bf16 operands, C zeroed.
  const size_t pad = size_t(o.misalign) + 128;
  size_t na = 0, nb = 0, c_bytes = 0;
  for (const auto& x : gemms) {
    const GemmCall& c = x.call;
    na = std::max(na, span(c.ta, c.m, c.k, c.lda));
    nb = std::max(nb, span(c.tb, c.k, c.n, c.ldb));
    c_bytes = std::max(c_bytes, span(Trans::N, c.m, c.n, c.ldc) * wiola::dtype_bytes(c.c));
  }
  DynBuffer<float> A(g, DType::BF16, na + pad), Bm(g, DType::BF16, nb + pad);
  Buffer<float, unsigned char> C(g, c_bytes + pad * 4);
  fill(g, A.data(), A.size(), 11);
  fill(g, Bm.data(), Bm.size(), 12);
  g.zero(C.data(), C.bytes());
  g.synchronize();

  double total_flops = 0, total_ms[2] = {0, 0};
  bool all_ok[2] = {true, true};
  for (const auto& x : gemms) {
    const GemmCall& c = x.call;
    const double flops = 2.0 * c.m * c.n * double(c.k);
    total_flops += flops * double(x.count);
    for (int mis = 0; mis < 2; ++mis) {
      const size_t off = mis ? size_t(o.misalign) : 0;
      const CPtr a = A.data();
      const CPtr b = Bm.data() + (c.param == 'B' ? off : 0);
      const Ptr cp = Ptr(C.data(), c.c) + (c.param == 'C' ? off : 0);
      json j{{"section", "gemm"},
             {"name", "gemm " + c.role + (mis ? " misaligned" : "")},
             {"roles", x.roles},
             {"ta", c.ta == Trans::T ? "T" : "N"},
             {"tb", c.tb == Trans::T ? "T" : "N"},
             {"m", c.m},
             {"n", c.n},
             {"k", c.k},
             {"lda", c.lda},
             {"ldb", c.ldb},
             {"ldc", c.ldc},
             {"beta", c.beta},
             {"a", "bf16"},
             {"b", "bf16"},
             {"c", dtype_short(c.c)},
             {"compute", "fp32"},
             {"per_step", x.count},
             {"aligned", !mis},
             {"param_operand", std::string(1, c.param)},
             {"param_offset_elems", off},
             {"flops", flops}};
      if (*c.note) j["note"] = c.note;
      const Rated r = time_rated(g, o, j, kTflops, flops, o.peak_tflops, [&] {
        g.gemm(c.ta, c.tb, c.m, c.n, c.k, 1.f, a, c.lda, b, c.ldb, c.beta, cp, c.ldc);
      });
      if (r.ok) total_ms[mis] += r.ms * double(x.count);
      else all_ok[mis] = false;
      const std::string& line = r.line;
      rep.emit(j);
      const std::string label = x.roles.size() > 1 ? c.role + " +" + std::to_string(x.roles.size() - 1) : c.role;
      std::printf("gemm %-29s %s%s x%-3ld %5d x %5d x %5d %s: %s\n", label.c_str(), c.ta == Trans::T ? "T" : "N",
                  c.tb == Trans::T ? "T" : "N", x.count, c.m, c.n, c.k, mis ? "misaligned" : "aligned   ",
                  line.c_str());
    }
  }
  tune_gemms(g, o, rep, gemms, A.data(), Bm.data(), Ptr(C.data(), DType::F32));
  // The step's GEMMs: their FLOPs over the sum of count x median time.
  for (int mis = 0; mis < 2; ++mis) {
    json j{{"section", "gemm"},        {"name", std::string("gemm step total") + (mis ? " misaligned" : "")},
           {"aligned", !mis},          {"flops", total_flops},
           {"distinct", gemms.size()}, {"ok", all_ok[mis]}};
    if (all_ok[mis]) {
      j["ms"] = total_ms[mis];
      j["tflops"] = total_flops / (total_ms[mis] * 1e-3) / 1e12;
      j["frac_peak"] = j["tflops"].get<double>() / o.peak_tflops;
    }
    rep.emit(j);
    std::printf("gemm step total (%s): %.1f GFLOP in %.3f ms, %.1f TFLOP/s\n", mis ? "misaligned" : "aligned",
                total_flops / 1e9, total_ms[mis], all_ok[mis] ? j["tflops"].get<double>() : 0.0);
  }
  run_merges(g, sh, o, rep);
}

}  // namespace kernel_bench
