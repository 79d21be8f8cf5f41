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
//              shape (same heads) with the bounds of the CUDA op tests'
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

#include <CLI/CLI.hpp>

#include <cstdio>

#include "bench/backend_flags.h"
#include "bench/kernel_bench.h"

using namespace kernel_bench;

int main(int argc, char** argv) {
  CLI::App app{
      "The CUDA backend's kernels at a model's step shapes (wiola-360m's unless --preset): attention variants, "
      "GEMMs, memory-bound ops",
      "wiola_kernel_bench"};
  Options o;
  app.add_option("--json", o.json_path, "write one JSON line per result here, each flushed at once");
  app.add_option("--reps", o.reps, "timed calls per measurement (median reported)")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed calls first")->capture_default_str();
  app.add_flag(
      "--small", o.small,
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
  app.add_option(
      "--write-tuning", o.write_tuning,
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
    json meta{{"section", "meta"},
              {"device", g->device_name()},
              {"config", c.name},
              {"B", sh.B},
              {"T", sh.T},
              {"d", c.d},
              {"H", c.H},
              {"Hkv", c.Hkv},
              {"dh", c.dh()},
              {"L", c.L},
              {"dA", c.dA},
              {"dB", c.dB},
              {"V", c.V},
              {"params", c.param_count()},
              {"reps", o.reps},
              {"warmup", o.warmup},
              {"timing", "CUDA events around each rep; median"},
              {"precision", "bf16"},
              {"peak_gbps", o.peak_gbps},
              {"peak_tflops", o.peak_tflops}};
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
