// The pieces the CUDA backend's op tests share (tests/gpu/cuda_*_test.cpp,
// one file per component of kernels/cuda/): random inputs, one function run
// on the CPU backend and on cuda-fp32, bf16 round trips, and both sides of one
// attention call (the device's buffers, the CPU's reference on the same
// bf16-valued inputs). Without a usable GPU every test is SKIPPED with the
// reason (REQUIRE_GPU), never passed.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "model/atm.h"

#define REQUIRE_GPU() \
  do { \
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_status(); \
  } while (0)

namespace wiola::cuda_test {

using Vec = std::vector<float>;

Vec randn(size_t n, uint64_t seed, float sd = 1.f);

// Uploads host inputs into backend buffers, runs `op` on the backend,
// downloads the buffers named as outputs.
struct OnBackend {
  Ops<float>& ops;
  std::vector<Buffer<float>> bufs;
  explicit OnBackend(Ops<float>& o) : ops(o) {}
  float* in(const Vec& h);
  Vec out(const float* p, size_t n);
};

// max |a - b| / max(max |a|, floor)
double rel(const Vec& a, const Vec& b, double floor = 1e-20);

// Runs f on the CPU backend and on cuda-fp32; every output within tol.
void same_on_gpu(const char* name, double tol, const std::function<std::vector<Vec>(Ops<float>&)>& f);
// The same on the cpu-bf16 backend and on cuda (bf16): f takes its bf16
// buffers' type from the backend (precision().act).
void same_on_gpu_bf16(const char* name, double tol, const std::function<std::vector<Vec>(Ops<float>&)>& f);

// Rounds h through the bf16 buffer dst on the GPU; returns the rounded values.
Vec bf16_round_trip(Ops<float>& gpu, const Vec& h, DynBuffer<float>& dst);
// n values of the bf16 buffer src as floats.
Vec bf16_download(Ops<float>& gpu, CPtr src, size_t n);

// Packed documents for the attention tests: doc_start [B, T] (AttnKeys::
// doc_start) from each sequence's document starts (position 0 is always one;
// starts[b] lists the others, increasing).
std::vector<int32_t> doc_starts(int T, const std::vector<std::vector<int>>& starts);
// The bf16 attention tests' documents for B sequences of T positions:
// even sequences start documents at 3, 4 (an EOS-only one), 40 (inside a
// 64-row tile), 64 (on a tile boundary), 100, 101 (EOS-only; the next one
// runs across the boundary at 128), 140, 192, 193; odd ones at 1 (after an
// EOS-only first document), 2, 63, 64 (an EOS-only one ending on a tile
// boundary), 128, 129 and T - 1 (the last position alone); those below T.
std::vector<int32_t> test_documents(int B, int T);
// Clears open[b, t] where t + 1 starts a document (an ATM plan with
// documents never merges across a start): open as atm_plan makes it.
void no_merge_across(std::vector<uint8_t>& open, const std::vector<int32_t>& doc_start, int B, int T);

// The device side of one bf16 attention call in the attention tests: the ATM
// layout uploaded, the merged keys and values (with_atm), the outputs and
// gradients, the document starts (doc_start, empty: one document), and the
// key and raw-key pointers the op takes.
struct GpuAttnCall {
  Buffer<float, int32_t> ke, ng, gf, ds;
  Buffer<float, uint8_t> so;
  DynBuffer<float> mk, mv, go, gdq, gdk, gdv, gdrk, gdrv;
  Buffer<float> glse;
  CPtr keys_k, keys_v, raw_k, raw_v;
  Ptr draw_k, draw_v;
  AttnKeys keys{};
  GpuAttnCall(Ops<float>& gpu, const AttnShape& s, const AtmLayout& lay, const std::vector<uint8_t>& open, CPtr k,
              CPtr v, bool with_atm, const std::vector<int32_t>& doc_start = {});
  static size_t nq(const AttnShape& s) { return size_t(s.B) * s.Tq * s.H * s.dh; }
  static size_t nk(const AttnShape& s) { return size_t(s.B) * s.Tk * s.Hkv * s.dh; }
  static size_t nl(const AttnShape& s) { return size_t(s.B) * s.H * s.Tq; }
};

// The same ATM layout and documents on the CPU backend, for the reference
// call: `keys` has no ATM keys unless with_atm.
struct CpuAttnKeys {
  Buffer<float, int32_t> ke, ng, ds;
  Buffer<float, uint8_t> so;
  AttnKeys keys{};
  CpuAttnKeys(Ops<float>& cpu, const AtmLayout& lay, const std::vector<uint8_t>& open, bool with_atm,
              const std::vector<int32_t>& doc_start = {});
};

// The host copies of one bf16 attention problem (the values the GPU's bf16
// buffers hold), its ATM plan and its document starts (empty: one document).
struct AttnInputs {
  Vec q, k, v, dout;  // dout empty: forward only
  std::vector<uint8_t> open;
  AtmLayout lay;
  std::vector<int32_t> doc_start = {};
};

// The CPU's attention on exactly the GPU's bf16 inputs of call `c` (its
// merged keys and values where with_atm): o and lse, then, where in.dout is
// not empty, dq, dk, dv (and draw_k, draw_v with ATM). One reference for
// every kernel a test compares with it.
std::vector<Vec> cpu_attention(Ops<float>& cpu, Ops<float>& gpu, const AttnShape& s, const AttnInputs& in,
                               const GpuAttnCall& c, bool with_atm);

}  // namespace wiola::cuda_test
