// The attention problems of wiola_kernel_bench (kernel_bench_attention.cpp
// times them; kernel_bench_cudnn.cpp gives cuDNN the same): bf16 inputs on the
// GPU, for ATM the merge plan, and the CPU backend's reference.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bench/kernel_bench.h"

namespace kernel_bench {

// FLOPs as FlashAttention counts them: causal forward 2 * 2 * B * H * T^2 * dh / 2
// (QK^T and PV, half the square), backward 2.5 x forward. An ATM layer is
// counted as the plain causal layer it replaces (its merged keys do less).
inline constexpr const char* kAttnFlopRule =
    "FlashAttention: causal fwd = 2*2*B*H*T*T*dh/2, bwd = 2.5*fwd; ATM layers counted as plain causal";
double attn_fwd_flops(const AttnShape& s);

// One attention problem on the GPU: bf16 q, k, v, dout; for ATM the merge plan
// of random X-tilde and the merged keys and values; packed documents
// (doc_start, bench/document_layout.h) or none; outputs.
struct AttnProblem {
  AttnShape s;
  bool atm = false;
  size_t nq = 0, nk = 0, nl = 0;
  DynBuffer<float> q, k, v, dout, mk, mv, o, dq, dk, dv, drk, drv;
  Buffer<float> lse;
  Buffer<float, int32_t> key_end, n_groups, group_first, doc_start;
  Buffer<float, uint8_t> open;
  double tau = 0, merged_pairs = 0, keys_frac = 1;
  // Host copies (bf16 values) for the correctness check; hdoc: the document
  // starts (empty: one document a window).
  Vec hq, hk, hv, hdout;
  std::vector<int32_t> hdoc;

  AttnKeys keys() const {
    AttnKeys a = atm ? AttnKeys{key_end.data(), n_groups.data(), open.data()} : AttnKeys{};
    if (!hdoc.empty()) a.doc_start = doc_start.data();
    return a;
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

// mean_doc_len > 0: plain causal attention over windows of packed documents
// of that mean length (bench/document_layout.h; not with ATM).
std::unique_ptr<AttnProblem> make_attn(Ops<float>& g, const Shapes& sh, int B, int T, bool atm, uint64_t seed,
                                       int mean_doc_len = 0);

// The CPU backend's o, lse, dq, dk, dv (and draw_k, draw_v for ATM) on
// exactly the GPU problem's bf16 inputs (merged keys as the GPU merged them).
std::vector<Vec> cpu_reference(Ops<float>& g, const AttnProblem& p);

// The CUDA op tests' AttentionTensorCoresBf16 bounds (tests/gpu/cuda_attention_test.cpp).
inline const char* const kAttnNames[] = {"o", "lse", "dq", "dk", "dv", "draw_k", "draw_v"};
inline const double kAttnTols[] = {2e-2, 1e-3, 3e-2, 3e-2, 3e-2, 3e-2, 3e-2};

}  // namespace kernel_bench
