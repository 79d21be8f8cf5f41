// wiola_kernel_bench's cuDNN section: cuDNN's SDPA (bench/cudnn_sdpa.h) on the
// plain causal layer as the measured reference for the attention rows,
// checked against the CPU like them, timed the same way, with the ratio of
// our fastest row of each direction to it; one skipped row where it cannot
// run.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/cudnn_sdpa.h"
#include "bench/kernel_bench_attention.h"

namespace kernel_bench {
namespace {

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

// A JSON row of the cuDNN reference on the plain causal layer of shape s.
json cudnn_row(const AttnShape& s, const std::string& name, const char* dir) {
  json j{{"section", "attention"},
         {"name", name},
         {"variant", "cudnn"},
         {"layer", "causal"},
         {"reference", "cuDNN SDPA through the cuDNN frontend (bench/cudnn_sdpa.h), not linked into the step"},
         {"flop_rule", kAttnFlopRule}};
  if (*dir) j["dir"] = dir;
  j.update(json{{"B", s.B}, {"T", s.Tq}, {"H", s.H}, {"Hkv", s.Hkv}, {"dh", s.dh}});
  return j;
}

void print_cudnn(const AttnShape& s, const char* what, const std::string& line) {
  std::printf("attention %-15s causal B=%d T=%d H=%d Hkv=%d dh=%d: %s\n", what, s.B, s.Tq, s.H, s.Hkv, s.dh,
              line.c_str());
}

// One skipped row where cuDNN cannot run at all.
void skip_cudnn(Report& rep, const AttnShape& s, const std::string& why) {
  json j = cudnn_row(s, "attention cudnn causal", "");
  j["ok"] = false;
  j["skipped"] = true;
  j["message"] = why;
  rep.emit(j);
  print_cudnn(s, "cudnn", "skipped: " + why);
}

#if defined(WIOLA_HAVE_CUDNN_SDPA) && !defined(WIOLA_CUDA_EMU)
using wiola::bench::CudnnSdpa;
using wiola::bench::SdpaTensors;

wiola::bench::SdpaShape sdpa_shape(const AttnShape& s) { return {s.B, s.Tq, s.H, s.Hkv, s.dh}; }

SdpaTensors sdpa_tensors(AttnProblem& p, CPtr q, CPtr dout) {
  return SdpaTensors{q.raw(),    p.k.data().raw(),  p.v.data().raw(),  p.o.data().raw(), p.lse.data(),
                     dout.raw(), p.dq.data().raw(), p.dk.data().raw(), p.dv.data().raw()};
}

// The check's outputs: the small problem with its query heads (and dout) in
// cuDNN's order, forward and backward, its outputs back in wiola's.
std::vector<Vec> cudnn_check_outputs(Ops<float>& g, CudnnSdpa& check_sdpa, AttnProblem& small, void* ws) {
  DynBuffer<float> qc(g, DType::BF16, small.nq), doc(g, DType::BF16, small.nq);
  upload_bf16(g, permute_heads(small.hq, small.s, false, true), qc);
  upload_bf16(g, permute_heads(small.hdout, small.s, false, true), doc);
  const SdpaTensors ct = sdpa_tensors(small, qc.data(), doc.data());
  check_sdpa.fwd(ct, ws);
  check_sdpa.bwd(ct, ws);
  const AttnShape& cs = small.s;
  return {permute_heads(download_bf16(g, small.o.data(), small.nq), cs, false, false),
          permute_heads(download_vec(g, small.lse.data(), small.nl), cs, true, false),
          permute_heads(download_bf16(g, small.dq.data(), small.nq), cs, false, false),
          download_bf16(g, small.dk.data(), small.nk), download_bf16(g, small.dv.data(), small.nk)};
}

// Times one direction on the timed problem into j and compares it with our
// fastest row; returns what stdout shows.
std::string time_cudnn(Ops<float>& g, const Options& o, const Report& rep, CudnnSdpa& sdpa, const SdpaTensors& bt,
                       void* ws, const AttnProblem& big, const char* dir, json& j) {
  const bool bwd = dir[0] == 'b';
  sdpa.fwd(bt, ws);  // a backward reads its o and statistics
  const Timing t = time_op(g, o, [&] { bwd ? sdpa.bwd(bt, ws) : sdpa.fwd(bt, ws); });
  put_timing(j, t);
  const double flops = bwd ? 2.5 * attn_fwd_flops(big.s) : attn_fwd_flops(big.s);
  const double tflops = flops / (t.ms * 1e-3) / 1e12;
  j["flops"] = flops;
  j["tflops"] = tflops;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%8.3f ms  %7.1f TFLOP/s", t.ms, tflops);
  std::string line = buf;
  if (const json* ours = best_ours(rep, dir, big.s)) {
    const double r = (*ours)["tflops"].get<double>() / tflops;
    j["ours_best"] = {{"name", (*ours)["name"]}, {"tflops", (*ours)["tflops"]}};
    j["ratio_ours_best_over_cudnn"] = r;
    std::snprintf(buf, sizeof buf, "; ours best %s %.2fx", (*ours)["variant"].get<std::string>().c_str(), r);
    line += buf;
  } else {
    j["ours_best"] = nullptr;
    line += "; no timed row of ours at this shape to compare";
  }
  return line;
}

// The cuDNN graphs of the check's and the timed shape, their workspace, and
// the check's reference and outputs.
struct CudnnRun {
  std::unique_ptr<AttnProblem> small, big;
  std::unique_ptr<CudnnSdpa> check_sdpa, sdpa;
  std::unique_ptr<Buffer<float, unsigned char>> ws;
  std::vector<Vec> ref, got;
  std::string version;
};

// One direction's row: the check against the CPU, then, if it passed, the time.
void cudnn_direction(Ops<float>& g, const Options& o, Report& rep, CudnnRun& run, const char* dir) {
  const bool bwd = dir[0] == 'b';
  json j = cudnn_row(run.big->s, std::string("attention ") + dir + " cudnn causal", dir);
  j["cudnn"] = {{"version", run.version},
                {"plan", bwd ? run.sdpa->bwd_plan() : run.sdpa->fwd_plan()},
                {"workspace_bytes", run.sdpa->workspace_bytes()},
                {"gqa",
                 "cuDNN: query head h reads KV head h / (H/Hkv); wiola: h % Hkv (the same work; the check "
                 "permutes the query heads)"}};
  if (bwd) j["cudnn"]["algorithm"] = "cuDNN's default backward (not its deterministic one; wiola's is)";
  json err = json::object(), tol = json::object();
  bool ok = true;
  for (size_t t = bwd ? 2 : 0; t < (bwd ? 5u : 2u); ++t) {
    const double e = rel(run.ref[t], run.got[t]);
    err[kAttnNames[t]] = e;
    tol[kAttnNames[t]] = kAttnTols[t];
    if (!(e < kAttnTols[t])) ok = false;
  }
  j["check"] = json{{"B", run.small->s.B}, {"T", run.small->s.Tq}, {"max_rel", err}, {"tol", tol}};
  j["ok"] = ok;
  std::string line;
  if (ok) {
    try {
      const SdpaTensors bt = sdpa_tensors(*run.big, run.big->q.data(), run.big->dout.data());
      line = time_cudnn(g, o, rep, *run.sdpa, bt, run.ws->data(), *run.big, dir, j);
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
  print_cudnn(run.big->s, (std::string(dir) + " cudnn").c_str(), line);
}

// Both directions through cuDNN, or the row that says why not.
void run_cudnn_sdpa(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep, const AttnShape& big_s) {
  try {
    CudnnRun run;
    run.version = wiola::bench::cudnn_version();
    void* stream = wiola::cuda_stream_of(g);
    // The check's shape first, then the timed one: a graph each, built once.
    run.small = make_attn(g, sh, sh.check_B, sh.check_T, false, 100);
    run.check_sdpa = std::make_unique<CudnnSdpa>(sdpa_shape(run.small->s), stream);
    run.big = make_attn(g, sh, sh.B, sh.T, false, 300);
    run.sdpa = std::make_unique<CudnnSdpa>(sdpa_shape(run.big->s), stream);
    const size_t ws_bytes = std::max(run.check_sdpa->workspace_bytes(), run.sdpa->workspace_bytes());
    run.ws = std::make_unique<Buffer<float, unsigned char>>(g, std::max<size_t>(1, ws_bytes));
    // The check: against the CPU backend.
    run.ref = cpu_reference(g, *run.small);
    run.got = cudnn_check_outputs(g, *run.check_sdpa, *run.small, run.ws->data());
    for (const char* dir : {"fwd", "bwd"}) cudnn_direction(g, o, rep, run, dir);
  } catch (const wiola::bench::CudnnUnavailable& e) {
    g.synchronize();
    skip_cudnn(rep, big_s, e.what());
  } catch (const std::exception& e) {
    g.synchronize();
    json j = cudnn_row(big_s, "attention cudnn causal", "");
    j["ok"] = false;
    j["error"] = e.what();
    rep.emit(j);
    print_cudnn(big_s, "cudnn", std::string("ERROR: ") + e.what());
  }
}
#endif

}  // namespace

void run_cudnn(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep) {
  AttnShape big_s;
  big_s.B = sh.B;
  big_s.Tq = big_s.Tk = sh.T;
  big_s.H = sh.cfg.H;
  big_s.Hkv = sh.cfg.Hkv;
  big_s.dh = sh.dh();
  if (const std::string why = cudnn_unavailable(sh); !why.empty()) return skip_cudnn(rep, big_s, why);
#if defined(WIOLA_HAVE_CUDNN_SDPA) && !defined(WIOLA_CUDA_EMU)
  run_cudnn_sdpa(g, sh, o, rep, big_s);
#else
  (void)g;
  (void)o;
#endif
}

}  // namespace kernel_bench
