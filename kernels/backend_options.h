// Start-up switches of a backend, chosen once and recorded: the config keys
// train.cuda_* (docs/config.md), the flags of wiola_gpu_bench and
// wiola_kernel_bench (bench/backend_flags.h). The run report and the
// checkpoint manifest record them beside the backend's name. The attention
// switches were the environment variables WIOLA_CUDA_ATTENTION and
// WIOLA_CUDA_ATTENTION_BWD, read at every call; a backend refuses to start
// while either is still set (refuse_backend_env). The CPU backends ignore
// them.
#pragma once

#include <array>
#include <map>
#include <string>
#include <string_view>

#include "util/named_enum.h"

namespace wiola {

// The backends by their start-up names (train.backend; kernels/backend.h
// make_backend): "cuda" and "cuda-fp32" exist in builds with WIOLA_CUDA=ON
// (backend_names() lists this build's).
enum class BackendKind { Cpu, CpuOpaque, CpuBf16, Cuda, CudaFp32 };
constexpr std::array<std::string_view, 5> enum_names(BackendKind) {
  return {"cpu", "cpu-opaque", "cpu-bf16", "cuda", "cuda-fp32"};
}

// The values of the switches below, each an enum with its names
// (util/named_enum.h); the first enumerator is the default.
// train.cuda_attention: the self-attention forward in bf16.
enum class AttentionFwd { Tc, Fa2, Rows };
constexpr std::array<std::string_view, 3> enum_names(AttentionFwd) { return {"tc", "fa2", "rows"}; }
// train.cuda_attention_bwd: its backward.
enum class AttentionBwd { V1, V2, Fa2 };
constexpr std::array<std::string_view, 3> enum_names(AttentionBwd) { return {"v1", "v2", "fa2"}; }
// train.cuda_gemm: the matrix products' algorithms.
enum class GemmMode { Cublas, Cublaslt, Auto };
constexpr std::array<std::string_view, 3> enum_names(GemmMode) { return {"cublas", "cublaslt", "auto"}; }
// train.cuda_attention_tile and train.cuda_attention_bwd_tile: the fa2
// kernels' tile shapes, rows x rows (which rows: the keys' doc lines).
enum class AttentionTile { T64x64, T64x128, T128x64, T128x128 };
constexpr std::array<std::string_view, 4> enum_names(AttentionTile) { return {"64x64", "64x128", "128x64", "128x128"}; }
// train.cuda_attention_heads_per_block: the fa2 forward's query heads a block.
enum class HeadsPerBlock { One, Two, Four };
constexpr std::array<std::string_view, 3> enum_names(HeadsPerBlock) { return {"1", "2", "4"}; }
constexpr int heads_per_block(HeadsPerBlock h) { return 1 << static_cast<int>(h); }
// train.cuda_graphs.
enum class CudaGraphs { Off, Layers };
constexpr std::array<std::string_view, 2> enum_names(CudaGraphs) { return {"off", "layers"}; }

// Every switch, declared once: X(field of BackendOptions, its enum, config
// key in [train], benchmarks' flag, the environment variable it replaced or
// nullptr, the doc line of docs/config.md). Its values are its enum's names.
// config/run_config.cpp makes its schema lines from this list;
// bench/backend_flags.h its flags; refuse_backend_env and
// backend_option_fields read it too.
#define WIOLA_BACKEND_OPTIONS(X) \
  X(attention, AttentionFwd, "cuda_attention", "--attention", "WIOLA_CUDA_ATTENTION", \
    "the CUDA backend's self-attention forward in bf16: `\"tc\"` (WMMA tensor cores), `\"fa2\"` " \
    "(FlashAttention-2 form), `\"rows\"` (the row kernels, forward and backward). Recorded in the " \
    "run report and checkpoint manifests; replaces `WIOLA_CUDA_ATTENTION` (refused when set). " \
    "[gpu.md](gpu.md#backend-options)") \
  X(attention_bwd, AttentionBwd, "cuda_attention_bwd", "--attention-bwd", "WIOLA_CUDA_ATTENTION_BWD", \
    "its backward: `\"v1\"`, `\"v2\"` or `\"fa2\"`; replaces `WIOLA_CUDA_ATTENTION_BWD`") \
  X(gemm, GemmMode, "cuda_gemm", "--gemm", nullptr, \
    "the CUDA backend's matrix products: `\"cublas\"` (`cublasGemmEx`), `\"cublaslt\"` " \
    "(cuBLASLt's heuristic), `\"auto\"` (tuned per shape; rank 0's choices on every rank, cached " \
    "in `RUN_DIR/gemm_tuning.json`). [gpu.md](gpu.md#gemms-tuned-per-shape)") \
  X(attention_tile, AttentionTile, "cuda_attention_tile", "--attention-tile", nullptr, \
    "the tile shape of the `\"fa2\"` forward, query rows a block × key rows a tile: `\"64x64\"`, " \
    "`\"64x128\"`, `\"128x64\"` or `\"128x128\"`. " \
    "[gpu.md](gpu.md#the-fa2-forwards-tile-shapes)") \
  X(attention_bwd_tile, AttentionTile, "cuda_attention_bwd_tile", "--attention-bwd-tile", nullptr, \
    "the tile shape of the `\"fa2\"` backward, key rows a dK/dV block × query rows a dQ block: " \
    "`\"64x64\"`, `\"64x128\"`, `\"128x64\"` or `\"128x128\"` (the same bits at every shape). " \
    "[gpu.md](gpu.md#the-fa2-backwards-tile-shapes)") \
  X(attention_heads_per_block, HeadsPerBlock, "cuda_attention_heads_per_block", "--attention-heads-per-block", \
    nullptr, \
    "the `\"fa2\"` forward's query heads a block: `\"1\"` (one head), `\"2\"` or `\"4\"` (heads of " \
    "one KV group sharing each K/V tile, the tile's query rows split among them); must divide " \
    "`model.n_heads / model.n_kv_heads` (refused otherwise; the same under TP, whose ranks keep " \
    "whole KV groups). Not yet measured on a GPU. [gpu.md](gpu.md#head-packing-in-the-fa2-forward)") \
  X(cuda_graphs, CudaGraphs, "cuda_graphs", "--cuda-graphs", nullptr, \
    "CUDA Graphs: `\"off\"` (every op launched from the host) or `\"layers\"` (each layer's forward " \
    "and backward recorded once per distinct buffers, then replayed as one graph launch; not with TP " \
    "or a split backward). Same bits either way; not yet measured on a GPU. " \
    "[gpu.md](gpu.md#cuda-graphs)")

struct BackendOptions {
#define WIOLA_BACKEND_OPTION_FIELD(field, type, key, flag, old_env, doc) type field{};
  WIOLA_BACKEND_OPTIONS(WIOLA_BACKEND_OPTION_FIELD)
#undef WIOLA_BACKEND_OPTION_FIELD
};

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
// "cuda_graphs": "off", "gemm": "cublas"} (a JSON object as it is).
std::map<std::string, std::string> backend_option_fields(const BackendOptions& o);

}  // namespace wiola
