// wiola_kernel_bench's shared pieces (bench/kernel_bench.cpp has the
// program and its sections' description): the options and shapes, the JSON
// report, timing, the buffers' helpers, and the sections, one file each
// (kernel_bench_attention.cpp, kernel_bench_cudnn.cpp, kernel_bench_gemm.cpp,
// kernel_bench_merge.cpp, kernel_bench_memory.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "util/error.h"

namespace kernel_bench {

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

Shapes make_shapes(bool small, const std::string& preset);

// The JSON lines, written and kept: the cuDNN rows compare with the rows
// before them (with --append, also those already in the file).
class Report {
 public:
  Report(const std::string& path, bool append);
  ~Report() {
    if (f_) std::fclose(f_);
  }
  Report(const Report&) = delete;
  Report& operator=(const Report&) = delete;
  void emit(const json& j);
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
Timing time_op(Ops<float>& ops, const Options& o, const std::function<void()>& f);
void put_timing(json& j, const Timing& t);
// A result whose ops threw e: synchronises (the error is reported, the stream
// drained), marks j not ok with the message; returns the log line "ERROR: ...".
std::string put_error(Ops<float>& g, json& j, const std::exception& e);

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
                 const std::function<void()>& f);

// ---- buffers ---------------------------------------------------------------------------

Vec randn(size_t n, uint64_t seed);
// Host values rounded to bf16, uploaded as bf16; returns the rounded values.
Vec upload_bf16(Ops<float>& ops, const Vec& h, DynBuffer<float>& dst);
Vec download_bf16(Ops<float>& ops, CPtr src, size_t n);

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
void fill(Ops<float>& ops, Ptr p, size_t n, uint64_t seed, bool positive = false);

// max |a - b| / max(max |a|, floor): the CUDA op tests' measure (tests/gpu/cuda_test_util.h).
double rel(const Vec& ref, const Vec& got, double floor = 1e-20);

const char* dtype_short(DType t);

// ---- the sections ----------------------------------------------------------------------

void run_attention(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep);
void run_cudnn(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep);
void run_gemm(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep);
void run_merges(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep);
void run_memory(Ops<float>& g, const Shapes& sh, const Options& o, Report& rep);

}  // namespace kernel_bench
