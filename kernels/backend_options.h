// Start-up switches of a backend, chosen once and recorded: the config keys
// train.cuda_attention, train.cuda_attention_bwd, train.cuda_gemm,
// train.cuda_attention_tile, train.cuda_attention_bwd_tile and
// train.cuda_attention_heads_per_block (docs/config.md), the flags
// --attention, --attention-bwd, --gemm, --attention-tile, --attention-bwd-tile
// and --attention-heads-per-block of wiola_gpu_bench and wiola_kernel_bench. The run
// report and the checkpoint manifest record them beside the backend's name. The attention switches
// were the environment variables WIOLA_CUDA_ATTENTION and
// WIOLA_CUDA_ATTENTION_BWD, read at every call; a backend refuses to start
// while either is still set (refuse_backend_env). The CPU backends ignore
// them.
#pragma once

#include <map>
#include <string>

namespace wiola {

struct BackendOptions {
  // The CUDA backend's self-attention forward in bf16 (docs/gpu.md): "tc"
  // (the WMMA tensor-core kernels), "fa2" (the FlashAttention-2 form of
  // attention_fa2.cu) or "rows" (the row kernels, forward and backward).
  std::string attention = "tc";
  // Its backward: "v1" (WMMA), "v2" (key-owning warps) or "fa2".
  std::string attention_bwd = "v1";
  // The matrix products: "cublas" (cublasGemmEx, its default algorithm),
  // "cublaslt" (cuBLASLt, its heuristic's first candidate for every shape)
  // or "auto" (per shape the tuning table's choice, kernels/gemm_tuning.h).
  std::string gemm = "cublas";
  // The tile shape of the fa2 forward (attention = fa2), query rows a block
  // x key rows a tile: "64x64" (four warps), "64x128", "128x64" or "128x128"
  // (eight warps).
  std::string attention_tile = "64x64";
  // The tile shape of the fa2 backward (attention_bwd = fa2), key rows a
  // dK/dV block x query rows a dQ block: "64x64" (four warps each), "64x128",
  // "128x64" or "128x128" (128 rows: eight warps).
  std::string attention_bwd_tile = "64x64";
  // The fa2 forward's query heads a block: "1" (one head, the kernel as it
  // was), "2" or "4" (heads of one KV group sharing each K/V tile, the
  // tile's query rows split among them); must divide n_heads / n_kv_heads
  // (check_attention_heads_per_block).
  std::string attention_heads_per_block = "1";
  // CUDA Graphs (train.cuda_graphs; docs/gpu.md, "CUDA Graphs"): "off"
  // (every op launched from the host) or "layers" (each layer's forward and
  // backward recorded once per distinct buffers, then replayed as one graph
  // launch).
  std::string cuda_graphs = "off";
};

// Throws wiola::Error naming the key (and flag) and the values it takes.
void check_backend_options(const BackendOptions& o);

// Throws wiola::Error naming the key (and flag) when attention_heads_per_block
// does not divide the query heads of a KV group, H / Hkv (the model's; under
// tensor parallelism a rank keeps whole KV groups, so the same on every rank).
void check_attention_heads_per_block(const BackendOptions& o, int H, int Hkv);

// Throws wiola::Error when WIOLA_CUDA_ATTENTION or WIOLA_CUDA_ATTENTION_BWD
// is set, naming the key and flag that replaced it.
void refuse_backend_env();

// The options as recorded, field -> value: {"attention": "tc",
// "attention_bwd": "v1", "attention_bwd_tile": "64x64",
// "attention_heads_per_block": "1", "attention_tile": "64x64",
// "gemm": "cublas"} (a JSON
// object as it is).
std::map<std::string, std::string> backend_option_fields(const BackendOptions& o);

}  // namespace wiola
