// wiola_kernel_bench: the CUDA backend's kernels one at a time at the shapes
// of wiola-360m's training step (B = 4, T = 2048, d = 1024, 16 query heads on
// 4 KV groups, d_h = 64, 16 layers), through the op interface in bf16
// (make_cuda_ops(CudaPrecision::BF16)). It needs neither MPI nor HDF5, so it
// travels in the GPU kit (tests/gpu/kit_kernels.sh); tests/cuda_emu builds it
// on the CUDA emulator as wiola_kernel_bench_emu and runs --small.
// --preset NAME takes another model's step shapes (the model preset's d, H,
// Hkv, d_A, d_B, V, L; B = 4 and T = min(2048, its T)): wiola-1.5b's are d_h
// = 128, wiola-700m's 96. With --small, the tiny shapes keep the preset's
// head dim (d = 4 d_h, H = 4, Hkv = 2).
//
// Sections (--only picks one):
//   attention  attention_fwd with the backend option attention = tc, fa2,
//              rows (fa2 at each tile shape attention_tile: 64x64, named
//              "fwd fa2", then "fwd fa2 64x128", "fwd fa2 128x64", "fwd fa2
//              128x128"; then each again with heads of one KV group packed,
//              attention_heads_per_block 2 and 4: "fwd fa2 hp2", "fwd fa2
//              hp4", "fwd fa2 64x128 hp2", ..., "fwd fa2 128x128 hp4") and
//              attention_bwd with attention_bwd = v1, v2, fa2 (fa2
//              at each tile shape attention_bwd_tile, key rows a dK/dV block x
//              query rows a dQ block: 64x64, named "bwd fa2", then "bwd fa2
//              64x128", "bwd fa2 128x64", "bwd fa2 128x128"; and the row
//              kernels' backward), for a plain causal layer and an ATM
//              layer (merge plan from the backend's own atm_similarity /
//              atm_plan / atm_merge_rows, as model/layer.cpp builds it). Each
//              variant is first checked against the CPU backend on a small
//              shape (same heads) with the bounds of test_cuda_ops's
//              AttentionTensorCoresBf16; one that fails is not timed, one
//              whose switch value is refused is recorded as skipped.
//   gemm       every distinct GEMM of the step (model/layer.cpp, linear.h,
//              model.cpp) with bf16 operands through the backend's gemm,
//              with the parameter operand 256-byte aligned and misaligned by
//              --misalign elements (the packed parameter layout's offsets);
//              then "gemm merge" rows: projections that share an input as
//              one GEMM against separate ones (the context K|V, which the
//              model merges, and DSFF's three up-projections, which it does
//              not), each direction, checked against each other first.
//   memory     norms, a residual add, DSFF activations, SRPE fused with the
//              Q|K|V|gate split (forward and backward), AdamW over the
//              model's parameters and the fp32 -> bf16 weight refresh, in
//              GB/s of the bytes each must read and write.
//   cudnn      cuDNN's SDPA (bench/cudnn_sdpa.h, a measured reference, not
//              linked into the step) on the plain causal layer: "fwd cudnn"
//              and "bwd cudnn", checked against the CPU like the rows above,
//              timed the same way, with the ratio of our fastest row of each
//              direction to cuDNN's; last in a full run (--no-cudnn leaves it
//              out; the kit runs it as a process of its own with --append).
//              One skipped row where it cannot run: not built (no
//              cudnn_frontend headers), no libcudnn.so.9, or the emulator.
// Every time is CUDA events around each of --reps calls after --warmup
// untimed ones (the op interface's timeline); the median is reported. Each
// result is one JSON line appended to --json and flushed at once, so a run
// cut off by a time limit keeps what it measured, plus a line on stdout.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/backend_flags.h"
#include "bench/cudnn_sdpa.h"
#include "kernels/atm_plan.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/gemm_tuning.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "util/error.h"

namespace {

using wiola::AttnKeys;
using wiola::AttnShape;
using wiola::Buffer;
using wiola::CPtr;
using wiola::DType;
using wiola::DynBuffer;
using wiola::Ops;
using wiola::Ptr;
using wiola::Trans;
using json = nlohmann::json;
using Vec = std::vector<float>;

// ---- options, shapes, output -------------------------------------------------------

struct Options {
  std::string json_path, only;
  int reps = 20, warmup = 5, misalign = 2;
  bool small = false;
  std::string preset = "wiola-360m";  // --preset: the model whose step shapes are timed
  double peak_gbps = 3350, peak_tflops = 989;
  wiola::BackendOptions backend;  // --attention, --attention-bwd, --gemm, --attention-tile, ... (backend_flags.h)
  std::string write_tuning;       // --write-tuning FILE
  bool no_cudnn = false;          // --no-cudnn: a full run without the cuDNN rows
  bool append = false;            // --append: add to --json's rows instead of replacing them
};

// The benchmarked configuration: a model preset's step (wiola-360m's by
// default), or --small's tiny one at the preset's head dim.
struct Shapes {
  wiola::ModelConfig cfg;
  int B = 4, T = 2048;
  int check_B = 1, check_T = 160;  // the correctness check's attention shape
  int N() const { return B * T; }
  int dh() const { return cfg.dh(); }
};

Shapes make_shapes(bool small, const std::string& preset) {
  Shapes s;
  s.cfg = wiola::model_preset(preset);
  s.T = std::min(s.T, s.cfg.T);
  if (small) {
    const int dh = preset == "wiola-360m" ? 32 : s.cfg.dh();  // the default's dry run as it always was
    s.cfg.name = preset == "wiola-360m" ? "kernel-bench-small" : "kernel-bench-small-" + preset;
    s.cfg.d = 4 * dh; s.cfg.L = 1; s.cfg.H = 4; s.cfg.Hkv = 2; s.cfg.dA = 4 * dh; s.cfg.dB = 16 * dh;
    s.cfg.V = 512;
    s.cfg.T = 64;
    s.B = 2; s.T = 64;
    s.check_B = 1; s.check_T = 80;
  }
  s.cfg.validate();
  return s;
}

// The JSON lines, written and kept: the cuDNN rows compare with the rows
// before them (with --append, also those already in the file).
class Report {
 public:
  Report(const std::string& path, bool append) {
    if (path.empty()) return;
    if (append) {
      if (std::FILE* in = std::fopen(path.c_str(), "r")) {
        std::string text;
        char buf[4096];
        for (size_t n; (n = std::fread(buf, 1, sizeof buf, in)) > 0;) text.append(buf, n);
        std::fclose(in);
        for (size_t a = 0, b; a < text.size(); a = b + 1) {
          b = std::min(text.find('\n', a), text.size());
          const json j = json::parse(text.substr(a, b - a), nullptr, false);  // a cut-off line: skipped
          if (j.is_object()) rows_.push_back(j);
        }
      }
    }
    f_ = std::fopen(path.c_str(), append ? "a" : "w");
    WIOLA_CHECK(f_, "wiola_kernel_bench: cannot write ", path);
  }
  ~Report() {
    if (f_) std::fclose(f_);
  }
  Report(const Report&) = delete;
  Report& operator=(const Report&) = delete;
  void emit(const json& j) {
    rows_.push_back(j);
    if (!f_) return;
    std::fprintf(f_, "%s\n", j.dump().c_str());
    std::fflush(f_);
  }
  const std::vector<json>& rows() const { return rows_; }

 private:
  FILE* f_ = nullptr;
  std::vector<json> rows_;
};

// One variant's backend options for a scope (set_cuda_backend_options); the
// bench's own (--attention, --attention-bwd, --gemm) come back when it ends.
class OptionsScope {
 public:
  OptionsScope(Ops<float>& g, const wiola::BackendOptions& base, const wiola::BackendOptions& variant)
      : g_(g), base_(base) {
    wiola::set_cuda_backend_options(g_, variant);
  }
  ~OptionsScope() { wiola::set_cuda_backend_options(g_, base_); }
  OptionsScope(const OptionsScope&) = delete;
  OptionsScope& operator=(const OptionsScope&) = delete;

 private:
  Ops<float>& g_;
  wiola::BackendOptions base_;
};

// ---- timing ----------------------------------------------------------------------------

struct Timing {
  double ms = 0, ms_min = 0, ms_max = 0;  // median, fastest, slowest of the reps
  int reps = 0;
};

// f() `warmup` times untimed, then `reps` times with an event (the op
// interface's timeline on the backend's stream) before and after each.
Timing time_op(Ops<float>& ops, const Options& o, const std::function<void()>& f) {
  for (int i = 0; i < o.warmup; ++i) f();
  ops.synchronize();
  auto tl = ops.make_timeline();
  std::vector<int> marks{tl->mark()};
  for (int i = 0; i < o.reps; ++i) {
    f();
    marks.push_back(tl->mark());
  }
  ops.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < o.reps; ++i) ms.push_back(1e3 * tl->seconds(marks[size_t(i)], marks[size_t(i) + 1]));
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.reps = o.reps;
  t.ms_min = ms.front();
  t.ms_max = ms.back();
  const size_t n = ms.size();
  t.ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return t;
}

void put_timing(json& j, const Timing& t) {
  j["ms"] = t.ms;
  j["ms_min"] = t.ms_min;
  j["ms_max"] = t.ms_max;
  j["reps"] = t.reps;
}

// A rate: its JSON key, its unit, and the amount per unit per second.
struct RateUnit {
  const char* key;
  const char* unit;
  double scale;
};
constexpr RateUnit kTflops{"tflops", "TFLOP/s", 1e12}, kGbps{"gbps", "GB/s", 1e9};
struct Rated {
  bool ok = false;
  double ms = 0;     // the median, when ok
  std::string line;  // what stdout shows for it
};
// Times f and records in j its timing, its rate (amount over the median
// time) and the rate's share of peak; on an error, the error instead.
Rated time_rated(Ops<float>& g, const Options& o, json& j, const RateUnit& u, double amount, double peak,
                 const std::function<void()>& f) {
  Rated r;
  try {
    const Timing t = time_op(g, o, f);
    put_timing(j, t);
    const double rate = amount / (t.ms * 1e-3) / u.scale;
    j[u.key] = rate;
    j["frac_peak"] = rate / peak;
    j["ok"] = true;
    char buf[128];
    std::snprintf(buf, sizeof buf, "%8.3f ms  %7.1f %s (%4.0f %% of %.0f)", t.ms, rate, u.unit, 100 * rate / peak,
                  peak);
    r = {true, t.ms, buf};
  } catch (const std::exception& e) {
    g.synchronize();
    j["ok"] = false;
    j["error"] = e.what();
    r.line = std::string("ERROR: ") + e.what();
  }
  return r;
}

// ---- buffers ---------------------------------------------------------------------------

Vec randn(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  Vec v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Host values rounded to bf16, uploaded as bf16; returns the rounded values.
Vec upload_bf16(Ops<float>& ops, const Vec& h, DynBuffer<float>& dst) {
  std::vector<uint16_t> bits(h.size());
  Vec r(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    bits[i] = wiola::bf16_round(h[i]);
    r[i] = wiola::bf16_widen(bits[i]);
  }
  ops.upload(dst.data().raw(), bits.data(), bits.size() * 2);
  return r;
}

Vec download_bf16(Ops<float>& ops, CPtr src, size_t n) {
  std::vector<uint16_t> bits(n);
  ops.download(bits.data(), src.raw(), n * 2);
  Vec r(n);
  for (size_t i = 0; i < n; ++i) r[i] = wiola::bf16_widen(bits[i]);
  return r;
}

template <class E>
std::vector<E> download_vec(Ops<float>& ops, const E* src, size_t n) {
  std::vector<E> h(n);
  ops.download(h.data(), src, n * sizeof(E));
  return h;
}

// Fills n elements of a float32 or bf16 buffer with random values in (-1, 1)
// ((0, 1) if positive): one block of at most 1 Mi elements from the host,
// then doubled on the device, so that a 300 M-element buffer fills in
// milliseconds. (Random operands, not zeros: tensor cores fed zeros run
// cooler and faster than on real data.)
void fill(Ops<float>& ops, Ptr p, size_t n, uint64_t seed, bool positive = false) {
  if (!n) return;
  const size_t es = wiola::dtype_bytes(p.dtype());
  const size_t block = std::min<size_t>(n, size_t(1) << 20);
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(positive ? 0.f : -1.f, 1.f);
  std::vector<unsigned char> host(block * es);
  for (size_t i = 0; i < block; ++i) {
    const float x = u(g);
    if (p.dtype() == DType::BF16) {
      const uint16_t b = wiola::bf16_round(x);
      std::memcpy(&host[i * es], &b, 2);
    } else {
      WIOLA_CHECK(p.dtype() == DType::F32, "fill: float32 or bfloat16 buffers only");
      std::memcpy(&host[i * es], &x, 4);
    }
  }
  char* base = static_cast<char*>(p.raw());
  ops.upload(base, host.data(), block * es);
  for (size_t done = block; done < n;) {
    const size_t c = std::min(done, n - done);
    ops.copy(base + done * es, base, c * es);
    done += c;
  }
}

// max |a - b| / max(max |a|, floor): test_cuda_ops.cpp's measure.
double rel(const Vec& ref, const Vec& got, double floor = 1e-20) {
  double d = 0, m = floor;
  for (size_t i = 0; i < ref.size(); ++i) {
    d = std::max(d, std::abs(double(ref[i]) - double(got[i])));
    m = std::max(m, std::abs(double(ref[i])));
  }
  return d / m;
}

const char* dtype_short(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F32 ? "f32" : "?"; }

// ---- attention ---------------------------------------------------------------------------

// FLOPs as FlashAttention counts them: causal forward 2 * 2 * B * H * T^2 * dh / 2
// (QK^T and PV, half the square), backward 2.5 x forward. An ATM layer is
// counted as the plain causal layer it replaces (its merged keys do less).
constexpr const char* kAttnFlopRule =
    "FlashAttention: causal fwd = 2*2*B*H*T*T*dh/2, bwd = 2.5*fwd; ATM layers counted as plain causal";
double attn_fwd_flops(const AttnShape& s) { return 2.0 * 2.0 * s.B * s.H * double(s.Tq) * s.Tq * s.dh / 2.0; }

// One attention problem on the GPU: bf16 q, k, v, dout; for ATM the merge plan
// of random X-tilde and the merged keys and values; outputs.
struct AttnProblem {
  AttnShape s;
  bool atm = false;
  size_t nq = 0, nk = 0, nl = 0;
  DynBuffer<float> q, k, v, dout, mk, mv, o, dq, dk, dv, drk, drv;
  Buffer<float> lse;
  Buffer<float, int32_t> key_end, n_groups, group_first;
  Buffer<float, uint8_t> open;
  double tau = 0, merged_pairs = 0, keys_frac = 1;
  // Host copies (bf16 values) for the correctness check.
  Vec hq, hk, hv, hdout;

  AttnKeys keys() const {
    if (!atm) return AttnKeys{};
    return AttnKeys{key_end.data(), n_groups.data(), open.data()};
  }
  CPtr keys_k() const { return atm ? CPtr(mk.data()) : CPtr(k.data()); }
  CPtr keys_v() const { return atm ? CPtr(mv.data()) : CPtr(v.data()); }
  void fwd(Ops<float>& g) {
    g.attention_fwd(s, keys(), q.data(), keys_k(), keys_v(), atm ? CPtr(k.data()) : CPtr(),
                    atm ? CPtr(v.data()) : CPtr(), o.data(), lse.data());
  }
  void bwd(Ops<float>& g) {
    g.attention_bwd(s, keys(), q.data(), keys_k(), keys_v(), atm ? CPtr(k.data()) : CPtr(),
                    atm ? CPtr(v.data()) : CPtr(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data(),
                    atm ? drk.data() : Ptr(), atm ? drv.data() : Ptr());
  }
};

// The ATM merge plan as model/layer.cpp's atm_decide makes it: cosine of
// neighbouring rows of X-tilde (fp32, [B, T, d]) and Algorithm 1, on the
// backend. X is random, so tau is chosen from the similarities themselves:
// the smallest that merges at most 25 % of the adjacent pairs (Algorithm 1's
// greedy pass run on the host to pick it, then on the backend for the plan).
void atm_plan_for(Ops<float>& g, AttnProblem& p, int d, uint64_t seed) {
  const int B = p.s.B, T = p.s.Tq;
  Buffer<float> x(g, size_t(B) * T * d);
  const Vec hx = randn(x.size(), seed);
  g.upload(x.data(), hx.data(), x.bytes());
  Buffer<float, double> rho(g, size_t(B) * (T - 1));
  g.atm_similarity(x.data(), B, T, d, rho.data());
  const std::vector<double> hr = download_vec(g, rho.data(), rho.size());
  auto merged = [&](double tau) {
    std::vector<uint8_t> open(static_cast<size_t>(T));
    size_t n = 0;
    for (int b = 0; b < B; ++b) {
      wiola::atm_greedy_row(hr.data() + size_t(b) * (T - 1), T, tau, open.data());
      for (uint8_t o : open) n += o;
    }
    return double(n) / (double(B) * (T - 1));
  };
  std::vector<double> sorted = hr;
  std::sort(sorted.begin(), sorted.end());
  size_t lo = 0, hi = sorted.size() - 1;  // merged(sorted[hi]) == 0 <= 0.25
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (merged(sorted[mid]) <= 0.25) hi = mid;
    else lo = mid + 1;
  }
  p.tau = sorted[lo];
  p.merged_pairs = merged(p.tau);
  const size_t bt = size_t(B) * T;
  p.open = Buffer<float, uint8_t>(g, bt);
  p.group_first = Buffer<float, int32_t>(g, bt);
  p.key_end = Buffer<float, int32_t>(g, bt);
  p.n_groups = Buffer<float, int32_t>(g, size_t(B));
  g.atm_plan(rho.data(), B, T, p.tau, p.open.data(), p.group_first.data(), p.key_end.data(), p.n_groups.data());
  const int w = p.s.Hkv * p.s.dh;
  g.atm_merge_rows(p.k.data(), B, T, w, p.group_first.data(), p.key_end.data(), p.n_groups.data(), p.mk.data());
  g.atm_merge_rows(p.v.data(), B, T, w, p.group_first.data(), p.key_end.data(), p.n_groups.data(), p.mv.data());
  const std::vector<int32_t> ng = download_vec(g, p.n_groups.data(), size_t(B));
  double keys = 0;
  for (int32_t n : ng) keys += n;
  p.keys_frac = keys / double(bt);
}

std::unique_ptr<AttnProblem> make_attn(Ops<float>& g, const Shapes& sh, int B, int T, bool atm, uint64_t seed) {
  auto p = std::make_unique<AttnProblem>();
  AttnShape& s = p->s;
  s.B = B; s.Tq = s.Tk = T; s.H = sh.cfg.H; s.Hkv = sh.cfg.Hkv; s.dh = sh.dh();
  p->atm = atm;
  p->nq = size_t(B) * T * s.H * s.dh;
  p->nk = size_t(B) * T * s.Hkv * s.dh;
  p->nl = size_t(B) * s.H * T;
  auto bf = [&](size_t n) { return DynBuffer<float>(g, DType::BF16, n); };
  p->q = bf(p->nq); p->k = bf(p->nk); p->v = bf(p->nk); p->dout = bf(p->nq);
  p->o = bf(p->nq); p->dq = bf(p->nq); p->dk = bf(p->nk); p->dv = bf(p->nk);
  p->lse = Buffer<float>(g, p->nl);
  p->hq = upload_bf16(g, randn(p->nq, seed + 1), p->q);
  p->hk = upload_bf16(g, randn(p->nk, seed + 2), p->k);
  p->hv = upload_bf16(g, randn(p->nk, seed + 3), p->v);
  p->hdout = upload_bf16(g, randn(p->nq, seed + 4), p->dout);
  if (atm) {
    p->mk = bf(p->nk); p->mv = bf(p->nk); p->drk = bf(p->nk); p->drv = bf(p->nk);
    atm_plan_for(g, *p, sh.cfg.d, seed + 5);
  }
  g.synchronize();
  return p;
}

// The CPU backend's o, lse, dq, dk, dv (and draw_k, draw_v for ATM) on
// exactly the GPU problem's bf16 inputs (merged keys as the GPU merged them).
std::vector<Vec> cpu_reference(Ops<float>& g, const AttnProblem& p) {
  auto cpu = wiola::make_cpu_ops<float>();
  const Vec mk = p.atm ? download_bf16(g, p.mk.data(), p.nk) : p.hk;
  const Vec mv = p.atm ? download_bf16(g, p.mv.data(), p.nk) : p.hv;
  std::vector<Buffer<float>> bufs;
  auto in = [&](const Vec& h) {
    bufs.emplace_back(*cpu, h.size());
    cpu->upload(bufs.back().data(), h.data(), h.size() * sizeof(float));
    return bufs.back().data();
  };
  float *q = in(p.hq), *k = in(mk), *v = in(mv), *rk = in(p.hk), *rv = in(p.hv), *dout = in(p.hdout);
  float *o = in(Vec(p.nq)), *lse = in(Vec(p.nl)), *dq = in(Vec(p.nq)), *dk = in(Vec(p.nk)), *dv = in(Vec(p.nk));
  float *drk = in(Vec(p.nk)), *drv = in(Vec(p.nk));
  const size_t bt = size_t(p.s.B) * p.s.Tq;
  Buffer<float, int32_t> ke(*cpu, bt), ng(*cpu, size_t(p.s.B));
  Buffer<float, uint8_t> so(*cpu, bt);
  AttnKeys keys{};
  if (p.atm) {
    cpu->upload(ke.data(), download_vec(g, p.key_end.data(), bt).data(), ke.bytes());
    cpu->upload(ng.data(), download_vec(g, p.n_groups.data(), size_t(p.s.B)).data(), ng.bytes());
    cpu->upload(so.data(), download_vec(g, p.open.data(), bt).data(), so.bytes());
    keys = AttnKeys{ke.data(), ng.data(), so.data()};
  }
  cpu->attention_fwd(p.s, keys, q, k, v, p.atm ? rk : nullptr, p.atm ? rv : nullptr, o, lse);
  cpu->attention_bwd(p.s, keys, q, k, v, p.atm ? rk : nullptr, p.atm ? rv : nullptr, o, lse, dout, dq, dk, dv,
                     p.atm ? drk : nullptr, p.atm ? drv : nullptr);
  auto out = [&](const float* x, size_t n) { return download_vec(*cpu, x, n); };
  std::vector<Vec> r{out(o, p.nq), out(lse, p.nl), out(dq, p.nq), out(dk, p.nk), out(dv, p.nk)};
  if (p.atm) {
    r.push_back(out(drk, p.nk));
    r.push_back(out(drv, p.nk));
  }
  return r;
}

// test_cuda_ops.cpp's AttentionTensorCoresBf16 bounds.
const char* const kAttnNames[] = {"o", "lse", "dq", "dk", "dv", "draw_k", "draw_v"};
const double kAttnTols[] = {2e-2, 1e-3, 3e-2, 3e-2, 3e-2, 3e-2, 3e-2};

struct AttnVariant {
  std::string name;  // as in the JSON: "fwd tc", "bwd v2", "fwd fa2 128x64", ...
  bool bwd;
  std::string attention, attention_bwd;  // its backend options
  std::string attention_tile;            // the fa2 forward's tile; empty: the bench's own
  std::string attention_bwd_tile;        // the fa2 backward's tile; empty: the bench's own
  std::string heads_per_block;           // the fa2 forward's heads a block; empty: the bench's own
  // The options of its forward (a backward variant reads the o and lse of
  // the default tensor-core forward).
  wiola::BackendOptions fwd(const wiola::BackendOptions& base) const {
    wiola::BackendOptions o = base;
    o.attention = bwd ? "tc" : attention;
    if (!attention_tile.empty()) o.attention_tile = attention_tile;
    if (!heads_per_block.empty()) o.attention_heads_per_block = heads_per_block;
    return o;
  }
  wiola::BackendOptions all(const wiola::BackendOptions& base) const {
    wiola::BackendOptions o = fwd(base);
    o.attention = attention;
    o.attention_bwd = attention_bwd;
    if (!attention_bwd_tile.empty()) o.attention_bwd_tile = attention_bwd_tile;
    return o;
  }
};

// The check: the variant's outputs on the small problem against the CPU.
// (A backward variant's forward is the default tensor-core one: the
// backward reads its o and lse.) Returns the max relative error per output.
json check_variant(Ops<float>& g, const wiola::BackendOptions& base, AttnProblem& p, const std::vector<Vec>& ref,
                   const AttnVariant& var, bool& ok) {
  std::vector<Vec> got;
  {
    OptionsScope fwd_opt(g, base, var.fwd(base));
    p.fwd(g);
  }
  got.push_back(download_bf16(g, p.o.data(), p.nq));
  got.push_back(download_vec(g, p.lse.data(), p.nl));
  if (var.bwd) {
    OptionsScope bwd_opt(g, base, var.all(base));
    p.bwd(g);
    got.push_back(download_bf16(g, p.dq.data(), p.nq));
    got.push_back(download_bf16(g, p.dk.data(), p.nk));
    got.push_back(download_bf16(g, p.dv.data(), p.nk));
    if (p.atm) {
      got.push_back(download_bf16(g, p.drk.data(), p.nk));
      got.push_back(download_bf16(g, p.drv.data(), p.nk));
    }
  }
  json err = json::object(), tol = json::object();
  ok = true;
  // A backward variant is judged on its gradients (its o and lse are tc's).
  for (size_t t = var.bwd ? 2 : 0; t < got.size(); ++t) {
    const double e = rel(ref[t], got[t]);
    err[kAttnNames[t]] = e;
    tol[kAttnNames[t]] = kAttnTols[t];
    if (!(e < kAttnTols[t])) ok = false;
  }
  return json{{"B", p.s.B}, {"T", p.s.Tq}, {"max_rel", err}, {"tol", tol}};
}

bool is_refusal(const std::string& msg) {
  return msg.rfind("train.cuda_attention", 0) == 0 && msg.find("must be") != std::string::npos;
}

void run_attention(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep) {
  // The fa2 forward at each tile shape with one head a block, then with
  // heads of one KV group packed (attention_heads_per_block 2, 4: the tile's
  // query rows split among them; refused, so skipped, where the count does
  // not divide H / Hkv).
  const std::vector<AttnVariant> variants = {
      {"fwd tc", false, "tc", "v1", "", "", ""},
      {"fwd fa2", false, "fa2", "v1", "64x64", "", "1"},
      {"fwd fa2 64x128", false, "fa2", "v1", "64x128", "", "1"},
      {"fwd fa2 128x64", false, "fa2", "v1", "128x64", "", "1"},
      {"fwd fa2 128x128", false, "fa2", "v1", "128x128", "", "1"},
      {"fwd fa2 hp2", false, "fa2", "v1", "64x64", "", "2"},
      {"fwd fa2 hp4", false, "fa2", "v1", "64x64", "", "4"},
      {"fwd fa2 64x128 hp2", false, "fa2", "v1", "64x128", "", "2"},
      {"fwd fa2 64x128 hp4", false, "fa2", "v1", "64x128", "", "4"},
      {"fwd fa2 128x64 hp2", false, "fa2", "v1", "128x64", "", "2"},
      {"fwd fa2 128x64 hp4", false, "fa2", "v1", "128x64", "", "4"},
      {"fwd fa2 128x128 hp2", false, "fa2", "v1", "128x128", "", "2"},
      {"fwd fa2 128x128 hp4", false, "fa2", "v1", "128x128", "", "4"},
      {"fwd rows", false, "rows", "v1", "", "", ""},
      {"bwd v1", true, "tc", "v1", "", "", ""},
      {"bwd v2", true, "tc", "v2", "", "", ""},
      {"bwd fa2", true, "tc", "fa2", "", "64x64", ""},
      {"bwd fa2 64x128", true, "tc", "fa2", "", "64x128", ""},
      {"bwd fa2 128x64", true, "tc", "fa2", "", "128x64", ""},
      {"bwd fa2 128x128", true, "tc", "fa2", "", "128x128", ""},
      {"bwd rows", true, "rows", "v1", "", "", ""},
  };
  const wiola::BackendOptions& base = o.backend;
  for (bool atm : {false, true}) {
    const char* layer = atm ? "atm" : "causal";
    auto small = make_attn(g, sh, sh.check_B, sh.check_T, atm, atm ? 200 : 100);
    const std::vector<Vec> ref = cpu_reference(g, *small);
    auto big = make_attn(g, sh, sh.B, sh.T, atm, atm ? 400 : 300);
    const double f_fwd = attn_fwd_flops(big->s);
    for (const AttnVariant& var : variants) {
      json j{{"section", "attention"}, {"name", "attention " + var.name + " " + layer},
             {"dir", var.bwd ? "bwd" : "fwd"}, {"variant", var.name.substr(4)}, {"layer", layer},
             {"options",
              {{"attention", var.attention},
               {"attention_bwd", var.attention_bwd},
               {"attention_tile", var.all(base).attention_tile},
               {"attention_bwd_tile", var.all(base).attention_bwd_tile},
               {"attention_heads_per_block", var.all(base).attention_heads_per_block}}},
             {"B", big->s.B}, {"T", big->s.Tq}, {"H", big->s.H}, {"Hkv", big->s.Hkv}, {"dh", big->s.dh},
             {"flop_rule", kAttnFlopRule}};
      if (atm)
        j["atm"] = {{"tau", big->tau}, {"merged_pair_frac", big->merged_pairs}, {"keys_frac", big->keys_frac},
                    {"check_merged_pair_frac", small->merged_pairs}};
      std::string line;
      try {
        bool ok = false;
        j["check"] = check_variant(g, base, *small, ref, var, ok);
        j["ok"] = ok;
        if (ok) {
          // Its forward once (a backward reads o and lse), then the timed op.
          {
            OptionsScope e(g, base, var.fwd(base));
            big->fwd(g);
          }
          OptionsScope e(g, base, var.all(base));
          const Timing t = time_op(g, o, [&] { var.bwd ? big->bwd(g) : big->fwd(g); });
          put_timing(j, t);
          const double flops = var.bwd ? 2.5 * f_fwd : f_fwd;
          j["flops"] = flops;
          j["tflops"] = flops / (t.ms * 1e-3) / 1e12;
          char buf[256];
          std::snprintf(buf, sizeof buf, "%8.3f ms  %7.1f TFLOP/s", t.ms, j["tflops"].get<double>());
          line = buf;
        } else {
          line = "FAILED its check (not timed): " + j["check"]["max_rel"].dump();
        }
      } catch (const std::exception& e) {
        const std::string msg = e.what();
        g.synchronize();
        if (is_refusal(msg)) {
          j["skipped"] = true;
          j["ok"] = false;
          j["message"] = msg;
          line = "skipped: " + msg;
        } else {
          j["ok"] = false;
          j["error"] = msg;
          line = "ERROR: " + msg;
        }
      }
      rep.emit(j);
      std::printf("attention %-19s %-6s B=%d T=%d H=%d Hkv=%d dh=%d: %s\n", var.name.c_str(), layer, big->s.B,
                  big->s.Tq, big->s.H, big->s.Hkv, big->s.dh, line.c_str());
    }
  }
}

// ---- cuDNN's SDPA: the reference for the attention rows --------------------------------

// Our fastest timed row of one direction on the plain causal layer at this
// shape among the rows so far (this run's, and with --append the file's).
[[maybe_unused]] const json* best_ours(const Report& rep, const std::string& dir, const AttnShape& s) {
  const json* best = nullptr;
  for (const json& r : rep.rows()) {
    if (r.value("section", "") != "attention" || r.value("layer", "") != "causal" || r.value("dir", "") != dir ||
        r.value("variant", "") == "cudnn" || !r.value("ok", false) || !r.contains("tflops"))
      continue;
    if (r.value("B", 0) != s.B || r.value("T", 0) != s.Tq || r.value("H", 0) != s.H || r.value("Hkv", 0) != s.Hkv ||
        r.value("dh", 0) != s.dh)
      continue;
    if (!best || r["tflops"].get<double>() > (*best)["tflops"].get<double>()) best = &r;
  }
  return best;
}

// cuDNN groups query heads as h / (H / Hkv), wiola as h % Hkv: cuDNN's head
// j = g * (H / Hkv) + r is wiola's head r * Hkv + g (the same KV group g).
[[maybe_unused]] int wiola_head(int j, int H, int Hkv) { return (j % (H / Hkv)) * Hkv + j / (H / Hkv); }

// x[B, T, H, dh] (or, with dh = 1 and the heads outer, lse[B, H, T]) from
// one head order to the other: out[.., j, ..] = x[.., wiola_head(j), ..], or
// the inverse.
[[maybe_unused]] Vec permute_heads(const Vec& x, const AttnShape& s, bool lse_layout, bool to_cudnn) {
  Vec out(x.size());
  const size_t inner = lse_layout ? size_t(s.Tq) : size_t(s.dh);
  const size_t outer = lse_layout ? size_t(s.B) : size_t(s.B) * s.Tq;
  for (size_t a = 0; a < outer; ++a)
    for (int j = 0; j < s.H; ++j) {
      const size_t cj = (a * s.H + size_t(j)) * inner, wj = (a * s.H + size_t(wiola_head(j, s.H, s.Hkv))) * inner;
      std::copy_n(&x[to_cudnn ? wj : cj], inner, &out[to_cudnn ? cj : wj]);
    }
  return out;
}

// Why cuDNN cannot run here, or "" when it may: the emulator (whose device
// memory is host memory and which has no GPU to run cuDNN's kernels on), a
// build without the frontend, or no libcudnn.so.9. On the emulator, with
// libcudnn.so.9 loaded, what needs no GPU is checked on the way: the
// frontend's validation of the forward and backward graphs, at the check's
// and the timed shape, for an H100 (sm_90).
std::string cudnn_unavailable(const Shapes& sh) {
#if defined(WIOLA_HAVE_CUDNN_SDPA)
  std::string lib;
  try {
    lib = "libcudnn.so.9 loads (cuDNN " + wiola::bench::cudnn_version() + ")";
  } catch (const wiola::bench::CudnnUnavailable& e) {
    lib = e.what();
  }
#if defined(WIOLA_CUDA_EMU)
  if (lib.rfind("libcudnn.so.9 loads", 0) == 0) {
    try {
      for (const auto& [B, T] : {std::pair{sh.check_B, sh.check_T}, std::pair{sh.B, sh.T}})
        wiola::bench::cudnn_sdpa_validate({B, T, sh.cfg.H, sh.cfg.Hkv, sh.dh()}, 90);
      lib += "; its graphs at the check and timed shapes validate for sm_90";
    } catch (const std::exception& e) {
      lib += std::string("; validating its graphs for sm_90 failed: ") + e.what();
    }
  }
  return "the CUDA emulator cannot run cuDNN's kernels (" + lib + ")";
#else
  (void)sh;
  return lib.rfind("libcudnn.so.9 loads", 0) == 0 ? "" : lib;
#endif
#else
  (void)sh;
  std::printf("cuDNN reference: not built (no cudnn_frontend headers)\n");
#if defined(WIOLA_CUDA_EMU)
  return "the CUDA emulator cannot run cuDNN's kernels (cuDNN reference: not built: no cudnn_frontend headers)";
#else
  return "cuDNN reference: not built (no cudnn_frontend headers)";
#endif
#endif
}

void run_cudnn(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep) {
  AttnShape big_s;
  big_s.B = sh.B; big_s.Tq = big_s.Tk = sh.T; big_s.H = sh.cfg.H; big_s.Hkv = sh.cfg.Hkv; big_s.dh = sh.dh();
  const json shape{{"B", big_s.B}, {"T", big_s.Tq}, {"H", big_s.H}, {"Hkv", big_s.Hkv}, {"dh", big_s.dh}};
  auto row = [&](const std::string& name, const char* dir) {
    json j{{"section", "attention"}, {"name", name}, {"variant", "cudnn"}, {"layer", "causal"},
           {"reference", "cuDNN SDPA through the cuDNN frontend (bench/cudnn_sdpa.h), not linked into the step"},
           {"flop_rule", kAttnFlopRule}};
    if (*dir) j["dir"] = dir;
    j.update(shape);
    return j;
  };
  auto print = [&](const char* what, const std::string& line) {
    std::printf("attention %-15s causal B=%d T=%d H=%d Hkv=%d dh=%d: %s\n", what, big_s.B, big_s.Tq, big_s.H,
                big_s.Hkv, big_s.dh, line.c_str());
  };
  // One skipped row where cuDNN cannot run at all.
  auto skip = [&](const std::string& why) {
    json j = row("attention cudnn causal", "");
    j["ok"] = false;
    j["skipped"] = true;
    j["message"] = why;
    rep.emit(j);
    print("cudnn", "skipped: " + why);
  };
  if (const std::string why = cudnn_unavailable(sh); !why.empty()) return skip(why);
#if defined(WIOLA_HAVE_CUDNN_SDPA) && !defined(WIOLA_CUDA_EMU)
  using wiola::bench::CudnnSdpa;
  using wiola::bench::SdpaTensors;
  const std::string version = wiola::bench::cudnn_version();
  void* stream = wiola::cuda_stream_of(g);
  auto sdpa_shape = [](const AttnShape& s) { return wiola::bench::SdpaShape{s.B, s.Tq, s.H, s.Hkv, s.dh}; };
  auto tensors = [](AttnProblem& p, CPtr q, CPtr dout) {
    return SdpaTensors{q.raw(), p.k.data().raw(), p.v.data().raw(), p.o.data().raw(), p.lse.data(), dout.raw(),
                       p.dq.data().raw(), p.dk.data().raw(), p.dv.data().raw()};
  };
  std::unique_ptr<CudnnSdpa> check_sdpa, sdpa;
  try {
    // The check's shape first, then the timed one: a graph each, built once.
    auto small = make_attn(g, sh, sh.check_B, sh.check_T, false, 100);
    check_sdpa = std::make_unique<CudnnSdpa>(sdpa_shape(small->s), stream);
    auto big = make_attn(g, sh, sh.B, sh.T, false, 300);
    sdpa = std::make_unique<CudnnSdpa>(sdpa_shape(big->s), stream);
    const size_t ws_bytes = std::max(check_sdpa->workspace_bytes(), sdpa->workspace_bytes());
    Buffer<float, unsigned char> ws(g, std::max<size_t>(1, ws_bytes));

    // The check: the small problem with its query heads (and dout) in
    // cuDNN's order, outputs back in wiola's, against the CPU backend.
    const std::vector<Vec> ref = cpu_reference(g, *small);
    DynBuffer<float> qc(g, DType::BF16, small->nq), doc(g, DType::BF16, small->nq);
    upload_bf16(g, permute_heads(small->hq, small->s, false, true), qc);
    upload_bf16(g, permute_heads(small->hdout, small->s, false, true), doc);
    const SdpaTensors ct = tensors(*small, qc.data(), doc.data());
    check_sdpa->fwd(ct, ws.data());
    check_sdpa->bwd(ct, ws.data());
    const AttnShape& cs = small->s;
    const std::vector<Vec> got{permute_heads(download_bf16(g, small->o.data(), small->nq), cs, false, false),
                               permute_heads(download_vec(g, small->lse.data(), small->nl), cs, true, false),
                               permute_heads(download_bf16(g, small->dq.data(), small->nq), cs, false, false),
                               download_bf16(g, small->dk.data(), small->nk),
                               download_bf16(g, small->dv.data(), small->nk)};
    const SdpaTensors bt = tensors(*big, big->q.data(), big->dout.data());
    const double f_fwd = attn_fwd_flops(big->s);
    for (const char* dir : {"fwd", "bwd"}) {
      const bool bwd = dir[0] == 'b';
      json j = row(std::string("attention ") + dir + " cudnn causal", dir);
      j["cudnn"] = {{"version", version}, {"plan", bwd ? sdpa->bwd_plan() : sdpa->fwd_plan()},
                    {"workspace_bytes", sdpa->workspace_bytes()},
                    {"gqa", "cuDNN: query head h reads KV head h / (H/Hkv); wiola: h % Hkv (the same work; the check "
                            "permutes the query heads)"}};
      if (bwd) j["cudnn"]["algorithm"] = "cuDNN's default backward (not its deterministic one; wiola's is)";
      json err = json::object(), tol = json::object();
      bool ok = true;
      for (size_t t = bwd ? 2 : 0; t < (bwd ? 5u : 2u); ++t) {
        const double e = rel(ref[t], got[t]);
        err[kAttnNames[t]] = e;
        tol[kAttnNames[t]] = kAttnTols[t];
        if (!(e < kAttnTols[t])) ok = false;
      }
      j["check"] = json{{"B", small->s.B}, {"T", small->s.Tq}, {"max_rel", err}, {"tol", tol}};
      j["ok"] = ok;
      std::string line;
      if (ok) {
        try {
          sdpa->fwd(bt, ws.data());  // a backward reads its o and statistics
          const Timing t = time_op(g, o, [&] { bwd ? sdpa->bwd(bt, ws.data()) : sdpa->fwd(bt, ws.data()); });
          put_timing(j, t);
          const double flops = bwd ? 2.5 * f_fwd : f_fwd;
          const double tflops = flops / (t.ms * 1e-3) / 1e12;
          j["flops"] = flops;
          j["tflops"] = tflops;
          char buf[256];
          std::snprintf(buf, sizeof buf, "%8.3f ms  %7.1f TFLOP/s", t.ms, tflops);
          line = buf;
          if (const json* ours = best_ours(rep, dir, big->s)) {
            const double r = (*ours)["tflops"].get<double>() / tflops;
            j["ours_best"] = {{"name", (*ours)["name"]}, {"tflops", (*ours)["tflops"]}};
            j["ratio_ours_best_over_cudnn"] = r;
            std::snprintf(buf, sizeof buf, "; ours best %s %.2fx", (*ours)["variant"].get<std::string>().c_str(), r);
            line += buf;
          } else {
            j["ours_best"] = nullptr;
            line += "; no timed row of ours at this shape to compare";
          }
        } catch (const std::exception& e) {
          g.synchronize();
          j["ok"] = false;
          j["error"] = e.what();
          line = std::string("ERROR: ") + e.what();
        }
      } else {
        line = "FAILED its check (not timed): " + err.dump();
      }
      rep.emit(j);
      print((std::string(dir) + " cudnn").c_str(), line);
    }
  } catch (const wiola::bench::CudnnUnavailable& e) {
    g.synchronize();
    skip(e.what());
  } catch (const std::exception& e) {
    g.synchronize();
    json j = row("attention cudnn causal", "");
    j["ok"] = false;
    j["error"] = e.what();
    rep.emit(j);
    print("cudnn", std::string("ERROR: ") + e.what());
  }
#else
  (void)g;
  (void)o;
#endif
}

// ---- GEMMs -----------------------------------------------------------------------------

// One GEMM call of the step, as the model issues it (row-major, ops.h's gemm).
struct GemmCall {
  std::string role;
  Trans ta, tb;
  int m, n, k, lda, ldb, ldc;
  float beta;
  DType c;       // C's storage type in the bf16 step (activations bf16; residual, gradients fp32)
  char param;    // the operand that is a parameter tensor: 'B' (weight) or 'C' (its gradient)
  long count;    // calls per step
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
  tuning.gemm = "auto";
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
      rep.emit(json{{"section", "gemm tuning"}, {"name", "gemm tuning " + key + ": " + cand}, {"device", device},
                    {"key", key}, {"candidate", cand}, {"ok", cand.find("rejected") == std::string::npos}});
    }
    rep.emit(json{{"section", "gemm tuning"}, {"name", "gemm tuning " + key}, {"device", device}, {"key", key},
                  {"winner", choice.algo + (choice.config.empty() ? "" : " " + choice.config)}, {"us", choice.us},
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

void run_merges(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep);  // below

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
      json j{{"section", "gemm"}, {"name", "gemm " + c.role + (mis ? " misaligned" : "")}, {"roles", x.roles},
             {"ta", c.ta == Trans::T ? "T" : "N"}, {"tb", c.tb == Trans::T ? "T" : "N"}, {"m", c.m}, {"n", c.n},
             {"k", c.k}, {"lda", c.lda}, {"ldb", c.ldb}, {"ldc", c.ldc}, {"beta", c.beta}, {"a", "bf16"},
             {"b", "bf16"}, {"c", dtype_short(c.c)}, {"compute", "fp32"}, {"per_step", x.count},
             {"aligned", !mis}, {"param_operand", std::string(1, c.param)},
             {"param_offset_elems", off}, {"flops", flops}};
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
    json j{{"section", "gemm"}, {"name", std::string("gemm step total") + (mis ? " misaligned" : "")},
           {"aligned", !mis}, {"flops", total_flops}, {"distinct", gemms.size()}, {"ok", all_ok[mis]}};
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

// ---- merged projections ------------------------------------------------------------------

// Projections that read one input, as one GEMM or as several (run by
// run_gemm, section "gemm merge"): the context K|V (model/layer.cpp merges
// them: W_K^ctx and W_V^ctx adjacent, keys and values interleaved [N, nc, 2,
// Hkv dh]) and DSFF's three up-projections G_A, U_A, U_B, which read the
// normed X-half (separate in the model, docs/gpu.md; whether to merge them is
// this measurement's to decide). Per case and direction: "merged", the one
// GEMM; "separate", the GEMMs an unmerged step issues; for DSFF also
// "merged+copies", the merged GEMM with the copies the model's separate
// ga/ua/ub tensors would need (the forward's output split into them; the
// backward's three gradients joined first; the weight GEMM reads the join
// the data GEMM made, its copies counted in both). Before it is timed each
// case runs once from zeroed outputs, separate against the merged form with
// separate's output layout, max relative difference within 1e-2 (bf16
// outputs) or 1e-3 (fp32); one that fails is not timed. One JSON line per
// case: each variant's median and speedup = separate / merged (> 1: merging
// pays).
struct MergeCase {
  std::string name;
  long per_step;      // calls per step
  DType out;          // the output's storage type
  size_t out_elems;   // what the check compares
  double flops;       // one call's
  std::function<void(Ptr)> merged, separate, merged_copies;  // merged_copies: DSFF only
};

void run_merges(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep) {
  const auto& c = sh.cfg;
  const int N = sh.N(), d = c.d, kvd = c.Hkv * c.dh(), nc = c.Lambda, kv2 = 2 * kvd, dA = c.dA, dB = c.dB;
  const int u = 2 * dA + dB;  // DSFF's merged up-projection width
  long ctx_rows = 0;
  for (int l = 0; l < c.L; ++l) ctx_rows += c.n_ctx(l);
  const DType bf = DType::BF16, f32 = DType::F32;
  const size_t nN = size_t(N);
  // X: the first activation operand (dkvc [N, nc 2 kvd]; the joined DSFF
  // gradient [N, u]; the merged forward's output before its split); Y: the
  // second ([N, d]: a summary, X-half normed); S: DSFF's three separate
  // gradients [N, dA], [N, dA], [N, dB] back to back; W: [wkc; wvc] or
  // [G_A; U_A; U_B]; C1, C2: outputs.
  const size_t nx = nN * size_t(std::max(nc * kv2, u)), nw = size_t(std::max(kv2, u)) * d;
  const size_t c_bytes = std::max({nN * nc * kv2 * 2, nN * d * 4, nN * u * 2, size_t(u) * d * 4});
  DynBuffer<float> X(g, bf, nx), Y(g, bf, nN * d), S(g, bf, nN * u), W(g, bf, nw);
  Buffer<float, unsigned char> C1(g, c_bytes), C2(g, c_bytes);
  fill(g, X.data(), X.size(), 51);
  fill(g, Y.data(), Y.size(), 52);
  fill(g, S.data(), S.size(), 53);
  fill(g, W.data(), W.size(), 54);
  const Trans n_ = Trans::N, t_ = Trans::T;
  const CPtr x = X.data(), y = Y.data(), s = S.data(), w = W.data();
  const Ptr xw = X.data();
  const CPtr sa = s, su = s + nN * dA, sb = s + 2 * nN * dA;  // dga, dua, dub
  // The join of S into X as the merged DSFF GEMMs read it ([N, u]).
  auto join = [&] {
    g.copy_block(xw, u, sa, dA, N, dA);
    g.copy_block(xw + dA, u, su, dA, N, dA);
    g.copy_block(xw + 2 * dA, u, sb, dB, N, dB);
  };
  const std::vector<MergeCase> cases = {
      {"ctx k|v fwd", ctx_rows, bf, nN * nc * kv2, 2.0 * N * kv2 * d,
       [&](Ptr out) { g.gemm(n_, t_, N, kv2, d, 1.f, y, d, w, d, 0.f, out, nc * kv2); },
       [&](Ptr out) {
         g.gemm(n_, t_, N, kvd, d, 1.f, y, d, w, d, 0.f, out, nc * kv2);
         g.gemm(n_, t_, N, kvd, d, 1.f, y, d, w + size_t(kvd) * d, d, 0.f, out + kvd, nc * kv2);
       },
       {}},
      {"ctx k|v bwd data", ctx_rows, f32, nN * d, 2.0 * N * kv2 * d,
       [&](Ptr out) { g.gemm(n_, n_, N, d, kv2, 1.f, x, nc * kv2, w, d, 1.f, out, d); },
       [&](Ptr out) {
         g.gemm(n_, n_, N, d, kvd, 1.f, x, nc * kv2, w, d, 1.f, out, d);
         g.gemm(n_, n_, N, d, kvd, 1.f, x + kvd, nc * kv2, w + size_t(kvd) * d, d, 1.f, out, d);
       },
       {}},
      {"ctx k|v bwd weight", ctx_rows, f32, size_t(kv2) * d, 2.0 * N * kv2 * d,
       [&](Ptr out) { g.gemm(t_, n_, kv2, d, N, 1.f, x, nc * kv2, y, d, 1.f, out, d); },
       [&](Ptr out) {
         g.gemm(t_, n_, kvd, d, N, 1.f, x, nc * kv2, y, d, 1.f, out, d);
         g.gemm(t_, n_, kvd, d, N, 1.f, x + kvd, nc * kv2, y, d, 1.f, out + size_t(kvd) * d, d);
       },
       {}},
      // Separate: ga, ua, ub contiguous one after the other in out.
      {"dsff up fwd", c.L, bf, nN * u, 2.0 * N * u * d,
       [&](Ptr out) { g.gemm(n_, t_, N, u, d, 1.f, y, d, w, d, 0.f, out, u); },
       [&](Ptr out) {
         g.gemm(n_, t_, N, dA, d, 1.f, y, d, w, d, 0.f, out, dA);
         g.gemm(n_, t_, N, dA, d, 1.f, y, d, w + size_t(dA) * d, d, 0.f, out + nN * dA, dA);
         g.gemm(n_, t_, N, dB, d, 1.f, y, d, w + size_t(2 * dA) * d, d, 0.f, out + 2 * nN * dA, dB);
       },
       [&](Ptr out) {
         g.gemm(n_, t_, N, u, d, 1.f, y, d, w, d, 0.f, xw, u);
         g.copy_block(out, dA, x, u, N, dA);
         g.copy_block(out + nN * dA, dA, x + dA, u, N, dA);
         g.copy_block(out + 2 * nN * dA, dB, x + 2 * dA, u, N, dB);
       }},
      // As model/layer.cpp: U_B's first (overwrites), then G_A's and U_A's.
      {"dsff up bwd data", c.L, f32, nN * d, 2.0 * N * u * d,
       [&](Ptr out) { g.gemm(n_, n_, N, d, u, 1.f, x, u, w, d, 0.f, out, d); },
       [&](Ptr out) {
         g.gemm(n_, n_, N, d, dB, 1.f, sb, dB, w + size_t(2 * dA) * d, d, 0.f, out, d);
         g.gemm(n_, n_, N, d, dA, 1.f, sa, dA, w, d, 1.f, out, d);
         g.gemm(n_, n_, N, d, dA, 1.f, su, dA, w + size_t(dA) * d, d, 1.f, out, d);
       },
       [&](Ptr out) {
         join();
         g.gemm(n_, n_, N, d, u, 1.f, x, u, w, d, 0.f, out, d);
       }},
      {"dsff up bwd weight", c.L, f32, size_t(u) * d, 2.0 * N * u * d,
       [&](Ptr out) { g.gemm(t_, n_, u, d, N, 1.f, x, u, y, d, 1.f, out, d); },
       [&](Ptr out) {
         g.gemm(t_, n_, dA, d, N, 1.f, sa, dA, y, d, 1.f, out, d);
         g.gemm(t_, n_, dA, d, N, 1.f, su, dA, y, d, 1.f, out + size_t(dA) * d, d);
         g.gemm(t_, n_, dB, d, N, 1.f, sb, dB, y, d, 1.f, out + size_t(2 * dA) * d, d);
       },
       [&](Ptr out) {
         join();
         g.gemm(t_, n_, u, d, N, 1.f, x, u, y, d, 1.f, out, d);
       }},
  };
  for (const MergeCase& m : cases) {
    json j{{"section", "gemm merge"}, {"name", "gemm merge " + m.name}, {"per_step", m.per_step},
           {"N", N}, {"d", d}, {"out", dtype_short(m.out)}, {"flops", m.flops}};
    if (m.name.rfind("ctx", 0) == 0) {
      j["kvd"] = kvd;
      j["nc"] = nc;
    } else {
      j["dA"] = dA;
      j["dB"] = dB;
    }
    std::string line;
    try {
      // The check: separate against the merged form with its output layout.
      const auto& check = m.merged_copies ? m.merged_copies : m.merged;
      const Ptr o1(C1.data(), m.out), o2(C2.data(), m.out);
      g.zero(C1.data(), C1.bytes());
      g.zero(C2.data(), C2.bytes());
      m.separate(o1);
      check(o2);
      const Vec r1 = m.out == bf ? download_bf16(g, o1, m.out_elems) : download_vec(g, o1.as<float>(), m.out_elems);
      const Vec r2 = m.out == bf ? download_bf16(g, o2, m.out_elems) : download_vec(g, o2.as<float>(), m.out_elems);
      const double err = rel(r1, r2), tol = m.out == bf ? 1e-2 : 1e-3;
      j["check"] = {{"max_rel", err}, {"tol", tol}, {"against", m.merged_copies ? "merged+copies" : "merged"}};
      j["ok"] = err < tol;
      if (err < tol) {
        const Timing tm = time_op(g, o, [&] { m.merged(o1); });
        const Timing ts = time_op(g, o, [&] { m.separate(o1); });
        put_timing(j, tm);  // ms: the merged GEMM's
        j["merged_ms"] = tm.ms;
        j["separate_ms"] = ts.ms;
        j["speedup"] = ts.ms / tm.ms;
        j["tflops"] = m.flops / (tm.ms * 1e-3) / 1e12;
        char buf[256];
        std::snprintf(buf, sizeof buf, "merged %8.3f ms, separate %8.3f ms (x%.2f)", tm.ms, ts.ms, ts.ms / tm.ms);
        line = buf;
        if (m.merged_copies) {
          const Timing tc = time_op(g, o, [&] { m.merged_copies(o1); });
          j["merged_copies_ms"] = tc.ms;
          j["speedup_with_copies"] = ts.ms / tc.ms;
          std::snprintf(buf, sizeof buf, ", merged+copies %8.3f ms (x%.2f)", tc.ms, ts.ms / tc.ms);
          line += buf;
        }
      } else {
        char buf[128];
        std::snprintf(buf, sizeof buf, "FAILED its check (not timed): max_rel %.3g >= %.3g", err, tol);
        line = buf;
      }
    } catch (const std::exception& e) {
      g.synchronize();
      j["ok"] = false;
      j["error"] = e.what();
      line = std::string("ERROR: ") + e.what();
    }
    rep.emit(j);
    std::printf("gemm merge %-20s x%-3ld: %s\n", m.name.c_str(), m.per_step, line.c_str());
  }
}

// ---- memory-bound ops ------------------------------------------------------------------

void run_memory(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep) {
  const size_t N = size_t(sh.N()), d = size_t(sh.cfg.d), nd = N * d;
  const size_t nA = N * size_t(sh.cfg.dA), nB = N * size_t(sh.cfg.dB);
  const size_t P = size_t(sh.cfg.param_count());
  auto report = [&](const std::string& name, const std::string& what, const std::string& bytes_rule, double bytes,
                    const std::function<void()>& f) {
    json j{{"section", "memory"}, {"name", name}, {"what", what}, {"bytes", bytes}, {"bytes_rule", bytes_rule},
           {"peak_gbps", o.peak_gbps}};
    const Rated r = time_rated(g, o, j, kGbps, bytes, o.peak_gbps, f);
    rep.emit(j);
    std::printf("memory %-18s %-36s: %s\n", name.c_str(), what.c_str(), r.line.c_str());
  };
  const std::string rows = "[" + std::to_string(N) + ", " + std::to_string(d) + "]";
  {
    // The norms (model/layer.cpp): ln1 fp32 -> fp32 (X-tilde stays fp32),
    // ln2 fused with the residual add, fp32 in -> bf16 out; backward all fp32.
    Buffer<float> x(g, nd), x2(g, nd), s(g, nd), dy(g, nd), dx(g, nd), y32(g, nd), gamma(g, d), delta(g, d),
        dgamma(g, d), ddelta(g, d), rstd(g, N);
    DynBuffer<float> y16(g, DType::BF16, nd);
    fill(g, x.data(), nd, 21);
    fill(g, x2.data(), nd, 22);
    fill(g, dy.data(), nd, 23);
    fill(g, gamma.data(), d, 24, true);
    fill(g, delta.data(), d, 25);
    g.zero(dgamma.data(), dgamma.bytes());
    g.zero(ddelta.data(), ddelta.bytes());
    const double eps = sh.cfg.eps, D = double(nd);
    report("rmsnorm_fwd", rows + " f32 -> f32", "read x 4 + write y 4 B/elem (+ rstd)", D * 8 + 4.0 * N,
           [&] { g.rmsnorm_fwd(x.data(), gamma.data(), delta.data(), int(N), int(d), eps, y32.data(), rstd.data(), nullptr); });
    report("add_rmsnorm_fwd", rows + " f32 + f32 -> f32, bf16", "read a, b 4+4 + write s 4, y 2 B/elem (+ rstd)",
           D * 14 + 4.0 * N, [&] {
             g.add_rmsnorm_fwd(x.data(), x2.data(), s.data(), gamma.data(), delta.data(), int(N), int(d), eps,
                               y16.data(), rstd.data(), nullptr);
           });
    report("rmsnorm_bwd", rows + " f32", "read x, dy, dres 4+4+4 + write dx 4 B/elem (+ rstd; the minimum: "
           "the kernel reads x and dy again for dgamma, ddelta)", D * 16 + 4.0 * N, [&] {
             g.rmsnorm_bwd(x.data(), gamma.data(), delta.data(), rstd.data(), dy.data(), int(N), int(d), x2.data(),
                           dx.data(), dgamma.data(), ddelta.data());
           });
    report("add", rows + " f32", "read a, b 4+4 + write 4 B/elem", D * 12,
           [&] { g.add(x.data(), x2.data(), s.data(), nd); });
  }
  {
    // DSFF activations in bf16.
    DynBuffer<float> ga(g, DType::BF16, nA), ua(g, DType::BF16, nA), ha(g, DType::BF16, nA);
    fill(g, ga.data(), nA, 31);
    fill(g, ua.data(), nA, 32);
    report("swiglu_fwd", "[" + std::to_string(N) + ", " + std::to_string(sh.cfg.dA) + "] bf16",
           "read g, u 2+2 + write h 2 B/elem", double(nA) * 6, [&] { g.swiglu_fwd(ga.data(), ua.data(), nA, ha.data()); });
  }
  {
    DynBuffer<float> ub(g, DType::BF16, nB), hb(g, DType::BF16, nB);
    fill(g, ub.data(), nB, 33);
    report("gelu_fwd", "[" + std::to_string(N) + ", " + std::to_string(sh.cfg.dB) + "] bf16",
           "read x 2 + write y 2 B/elem", double(nB) * 4, [&] { g.gelu_fwd(ub.data(), nB, hb.data()); });
  }
  {
    // SRPE fused with the split of the fused Q|K|V|gate projection output,
    // and its backward (the gradients joined), in bf16: the fused rows read
    // once, q, k (rotated), v and the gate written once (the table is small).
    const int H = sh.cfg.H, Hkv = sh.cfg.Hkv, dh = sh.dh();
    const size_t hd = size_t(H) * dh, kvd = size_t(Hkv) * dh, width = 2 * hd + 2 * kvd, nw = N * width;
    DynBuffer<float> proj(g, DType::BF16, nw), q(g, DType::BF16, N * hd), k(g, DType::BF16, N * kvd),
        v(g, DType::BF16, N * kvd), gate(g, DType::BF16, N * hd);
    Buffer<float> table(g, size_t(sh.T) * dh);
    fill(g, proj.data(), nw, 34);
    fill(g, table.data(), size_t(sh.T) * dh, 35);
    const std::string what = "[" + std::to_string(N) + ", " + std::to_string(width) + "] bf16";
    report("srpe_split_fwd", what, "read 2 + write 2 B/elem (+ the table)", double(nw) * 4, [&] {
      g.srpe_split_fwd(proj.data(), sh.B, sh.T, H, Hkv, dh, table.data(), q.data(), k.data(), v.data(), gate.data());
    });
    report("srpe_split_bwd", what, "read 2 + write 2 B/elem (+ the table)", double(nw) * 4, [&] {
      g.srpe_split_bwd(q.data(), k.data(), v.data(), gate.data(), sh.B, sh.T, H, Hkv, dh, table.data(), proj.data());
    });
  }
  {
    // The optimizer over every parameter (fp32 p, g, m, v) and the weight
    // copy's refresh after it (fp32 -> bf16).
    Buffer<float> p(g, P), gr(g, P), m(g, P), v(g, P);
    DynBuffer<float> w(g, DType::BF16, P);
    fill(g, p.data(), P, 41);
    fill(g, gr.data(), P, 42);
    fill(g, m.data(), P, 43);
    fill(g, v.data(), P, 44, true);
    const std::string params = std::to_string(P) + " params (" + sh.cfg.name + ")";
    int t = 0;
    report("adamw", params + " f32", "read p, g, m, v 16 + write p, m, v 12 B/param", double(P) * 28, [&] {
      ++t;
      g.adamw(p.data(), gr.data(), m.data(), v.data(), P, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1 - std::pow(0.9, t),
              1 - std::pow(0.95, t), nullptr, false);
    });
    report("convert f32->bf16", params, "read 4 + write 2 B/elem", double(P) * 6,
           [&] { g.convert(p.data(), w.data(), P); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The CUDA backend's kernels at a model's step shapes (wiola-360m's unless --preset): attention variants, "
               "GEMMs, memory-bound ops",
               "wiola_kernel_bench"};
  Options o;
  app.add_option("--json", o.json_path, "write one JSON line per result here, each flushed at once");
  app.add_option("--reps", o.reps, "timed calls per measurement (median reported)")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed calls first")->capture_default_str();
  app.add_flag("--small", o.small,
               "tiny shapes (the emulator's dry run): T = 64, d = 128, H = 4, Hkv = 2, L = 1 (d = 4 d_h with --preset)");
  app.add_option("--preset", o.preset,
                 "the model whose step shapes are timed (wiola-1.5b: d_h 128; wiola-700m: 96; wiola-120m)")
      ->capture_default_str();
  app.add_option("--only", o.only, "one section")->check(CLI::IsMember({"attention", "gemm", "memory", "cudnn"}));
  app.add_flag("--no-cudnn", o.no_cudnn, "a full run without the cuDNN reference rows (section cudnn)");
  app.add_flag("--append", o.append,
               "append to --json (and compare the cuDNN rows with the rows already there) instead of replacing it");
  app.add_option("--peak-gbps", o.peak_gbps, "memory bandwidth for the fraction of peak (H100 SXM: 3350)")
      ->capture_default_str();
  app.add_option("--peak-tflops", o.peak_tflops, "bf16 dense peak for the GEMMs' fraction (H100/H200 SXM: 989)")
      ->capture_default_str();
  app.add_option("--misalign", o.misalign, "elements the parameter operand is moved by in the misaligned GEMMs")
      ->capture_default_str();
  wiola::add_backend_flags(app, o.backend);
  app.add_option("--write-tuning", o.write_tuning,
                 "write the GEMM sweep's winners as this device's tuning table into FILE (kernels/cuda/gemm_tuning.json)");
  CLI11_PARSE(app, argc, argv);
  if (o.small) {  // few reps unless asked for more
    if (!app.count("--reps")) o.reps = 2;
    if (!app.count("--warmup")) o.warmup = 1;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    WIOLA_CHECK(o.reps >= 1 && o.warmup >= 0 && o.misalign >= 0, "--reps >= 1, --warmup >= 0, --misalign >= 0");
    const Shapes sh = make_shapes(o.small, o.preset);
    auto g = wiola::make_cuda_ops(wiola::CudaPrecision::BF16, 0, o.backend);
    Report rep(o.json_path, o.append);
    const auto& c = sh.cfg;
    json meta{{"section", "meta"}, {"device", g->device_name()}, {"config", c.name}, {"B", sh.B}, {"T", sh.T},
              {"d", c.d}, {"H", c.H}, {"Hkv", c.Hkv}, {"dh", c.dh()}, {"L", c.L}, {"dA", c.dA}, {"dB", c.dB},
              {"V", c.V}, {"params", c.param_count()}, {"reps", o.reps}, {"warmup", o.warmup},
              {"timing", "CUDA events around each rep; median"}, {"precision", "bf16"},
              {"peak_gbps", o.peak_gbps}, {"peak_tflops", o.peak_tflops}};
    meta["backend_options"] = wiola::backend_option_fields(o.backend);
    if (!o.append || rep.rows().empty()) rep.emit(meta);  // appended rows share the file's meta line
    std::printf("wiola_kernel_bench on %s: %s, B=%d T=%d d=%d H=%d Hkv=%d dh=%d L=%d, %d reps after %d warm-up\n",
                g->device_name().c_str(), c.name.c_str(), sh.B, sh.T, c.d, c.H, c.Hkv, c.dh(), c.L, o.reps, o.warmup);
    if (o.only.empty() || o.only == "attention") run_attention(*g, sh, o, rep);
    if (o.only.empty() || o.only == "gemm") run_gemm(*g, sh, o, rep);
    if (o.only.empty() || o.only == "memory") run_memory(*g, sh, o, rep);
    if ((o.only.empty() && !o.no_cudnn) || o.only == "cudnn") run_cudnn(*g, sh, o, rep);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wiola_kernel_bench: error: %s\n", e.what());
    return 1;
  }
}
