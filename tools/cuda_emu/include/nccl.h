// NCCL for the CUDA emulator (tools/cuda_emu/emu.h): the types of the entry
// points the NCCL communicator binds (dist/nccl/nccl_lib.h); the emulated
// library (one rank without MPI, several over MPI) is tools/cuda_emu/nccl_emu.cpp.
#pragma once

#include "cuda_runtime.h"

typedef struct ncclComm* ncclComm_t;
struct ncclUniqueId {
  char internal[128];
};
enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum ncclDataType_t {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
};
enum ncclRedOp_t { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };
