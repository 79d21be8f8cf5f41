// The CUDA backend's options (kernels/backend_options.h) as command-line
// flags of the GPU kit's programs (wiola_gpu_bench, wiola_kernel_bench):
// --attention, --attention-bwd, --gemm, --attention-tile, --attention-bwd-tile,
// --attention-heads-per-block. The backend checks the values.
#pragma once

#include <CLI/CLI.hpp>

#include "kernels/backend_options.h"

namespace wiola {

inline void add_backend_flags(CLI::App& app, BackendOptions& o) {
  app.add_option("--attention", o.attention, "self-attention forward in bf16: tc, fa2 or rows (train.cuda_attention)")
      ->capture_default_str();
  app.add_option("--attention-bwd", o.attention_bwd, "its backward: v1, v2 or fa2 (train.cuda_attention_bwd)")
      ->capture_default_str();
  app.add_option("--gemm", o.gemm, "matrix products: cublas, cublaslt or auto (train.cuda_gemm)")
      ->capture_default_str();
  app.add_option("--attention-tile", o.attention_tile,
                 "the fa2 forward's tile, query rows x key rows: 64x64, 64x128, 128x64 or 128x128 "
                 "(train.cuda_attention_tile)")
      ->capture_default_str();
  app.add_option("--attention-bwd-tile", o.attention_bwd_tile,
                 "the fa2 backward's tile, key rows a dK/dV block x query rows a dQ block: 64x64, 64x128, 128x64 "
                 "or 128x128 (train.cuda_attention_bwd_tile)")
      ->capture_default_str();
  app.add_option("--attention-heads-per-block", o.attention_heads_per_block,
                 "the fa2 forward's query heads a block, of one KV group sharing its K/V tiles: 1, 2 or 4 "
                 "(train.cuda_attention_heads_per_block)")
      ->capture_default_str();
  app.add_option("--cuda-graphs", o.cuda_graphs,
                 "CUDA Graphs: off, or layers (each layer's forward and backward replayed as one graph; "
                 "train.cuda_graphs)")
      ->capture_default_str();
}

}  // namespace wiola
