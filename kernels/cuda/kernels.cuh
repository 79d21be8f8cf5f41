// Host launchers of the CUDA kernels, one file per component under the name
// of its kernels/cpu/ file (a fused kernel lives with the component whose
// output it writes); semantics are those of kernels/op_list.h (same names,
// same arguments) plus the stream and the allocator for temporaries. A
// launcher's __global__ kernels are named after its op: k_NAME, or
// k_NAME_PART for an op of several kernels (ptxas budgets, profilers and
// the emulator's launch record show those names). Each
// launcher dispatches on the storage dtypes of its typed pointers (fp32 or
// bf16; statistics are always fp32).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/backend_options.h"
#include "kernels/cuda/memory.cuh"
#include "kernels/op_info.h"
#include "kernels/ops.h"

namespace wiola::cuda {

struct Ctx {
  cudaStream_t s;
  CachingAllocator& mem;
  // The attention kernels the backend's options select
  // (kernels/backend_options.h): the forward and backward, the fa2 forward's
  // tile (query rows a block x key rows a tile) and the fa2 backward's (key
  // rows a dK/dV block x query rows a dQ block).
  AttentionFwd attn_fwd{};
  AttentionBwd attn_bwd{};
  AttentionTile attn_tile{};
  AttentionTile attn_bwd_tile{};
  // The fa2 forward's query heads a block (attention_heads_per_block): 1, or
  // 2 or 4 heads of one KV group sharing each K/V tile, the tile's query rows
  // split among them.
  int attn_heads = 1;
};

// The launcher of every op of kernels/op_list.h but memory and BLAS (which
// CudaOps issues itself): cuda::NAME(Ctx, the op's arguments), in the file of
// its component:
//   elementwise.cu: vector arithmetic, deterministic reductions, accumulate
//   vocab.cu: vocab-parallel embedding and the three-phase cross-entropy
//   norm.cu: WiolaRMSNorm (alone or after the residual add)
//   srpe.cu: SRPE rotation (alone or fused with the Q|K|V|gate split)
//   atm.cu: ATM similarity, plan and key/value merging
//   gcla.cu: prefix mean, context attention, blend, output gate (and the two fused)
//   dsff.cu: SwiGLU, GELU, stream fusion
//   optimizer.cu: AdamW (fused with the weight copy and the gradient zeroing)
//   attention.cu: self-attention (its kernels below)
using T = float;  // the compute type of the CUDA backend (Ops<float>)
#define WIOLA_BACKEND_OP(name, cls, params, args)
#define WIOLA_OP(name, cls, params, args) void name(Ctx c, WIOLA_OP_ARGS params);
#include "kernels/op_list.h"
// The op convert's kernel, which CudaOps and the GEMMs' operand rounding use.
void convert(Ctx c, CPtr src, Ptr dst, size_t n);
// nvtx.cu: the timeline's spans (util/trace.h) as NVTX ranges from now on.
void install_nvtx_ranges();

// ---- attention.cu --------------------------------------------------------------------
// attention_tc.cu: the tensor-core forward and backward for bf16 (head dims
// 32, 64, 96, 128). Return false, launching nothing, where they do not apply
// (fp32, other head dims, c.attn_fwd == ROWS); attention_fwd then runs the
// row kernel. c.attn_fwd == FA2: the forward runs attention_fa2_fwd.cu's kernel
// (the FlashAttention-2 form: register fragments, cp.async double
// buffering); TC, the default, until fa2 is measured on a GPU.
// attention_fa2_fwd.cu: the forward of attention_fwd_tc in the FlashAttention-2
// form (bf16, head dims 32, 64, 96, 128, 16-byte aligned q, k, v, o), at the
// tile shape c.attn_tile with c.attn_heads query heads a block (throws
// wiola::Error where that does not divide H / H_kv); false, launching
// nothing, where it does not apply.
bool attention_fwd_fa2(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                       Ptr o, Ptr lse);
// c.attn_bwd == V2 selects the second form of the tensor-core backward
// (attention_tc.cu), FA2 attention_fa2_bwd.cu's; V1, the default, is the one
// measured on a GPU.
// attention_fa2_bwd.cu: the backward in the FlashAttention-2 form (bf16, head dims
// 32, 64, 96, 128, 16-byte aligned q, k, v, dout, dq, dk, dv; q_pos0 = 0); a
// dK/dV kernel and a dQ kernel, deterministic, at the tile shape
// c.attn_bwd_tile (the same bits at each); false, launching nothing, where it
// does not apply.
bool attention_bwd_fa2(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                       CPtr lse, const float* Dterm, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v);
bool attention_fwd_tc(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                      Ptr o, Ptr lse);
// The backward's dq, dk, dv and raw-key gradients from D = rowsum(dO * O)
// (float [B, H, Tq], device memory); false where it does not apply.
bool attention_bwd_tc(Ctx c, const AttnShape& s, const AttnKeys& keys, CPtr q, CPtr k, CPtr v, CPtr raw_k, CPtr raw_v,
                      CPtr lse, const float* Dterm, CPtr dout, Ptr dq, Ptr dk, Ptr dv, Ptr draw_k, Ptr draw_v);

}  // namespace wiola::cuda
