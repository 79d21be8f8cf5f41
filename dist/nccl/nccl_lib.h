// NCCL loaded at run time (dlopen by SONAME, libnccl.so.2), like cuBLAS
// (kernels/cuda/cublas_lib.cuh): a CUDA build that runs on the CPU, or on
// one GPU, never needs the library, and a multi-GPU run finds it through
// LD_LIBRARY_PATH or the binary's RUNPATH (the GPU kit packs it).
#pragma once

#include <nccl.h>

#include "dist/nccl_plane.h"

namespace wiola::dist {

// The NCCL entry points the communicator uses.
struct Nccl {
  ncclResult_t (*get_version)(int*);
  ncclResult_t (*get_unique_id)(ncclUniqueId*);
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*comm_abort)(ncclComm_t);
  ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t*);
  const char* (*get_error_string)(ncclResult_t);
  const char* (*get_last_error)(ncclComm_t);
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t);
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                 ncclComm_t, cudaStream_t);
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
};

// Loads NCCL on the first call (thread-safe); a missing library or symbol is
// a wiola::Error naming it and the loader's message.
const Nccl& nccl();
// nccl_available() and require_nccl(): dist/nccl_plane.h.

}  // namespace wiola::dist
