// NCCL for the CUDA emulator (tests/cuda_emu/emu.h): the entry points of
// dist/nccl/nccl_lib.h, replacing the library the real build loads, for
// one-rank communicators (a GPU run of the contract tests has the same
// limit: NCCL refuses two ranks on one device). Each collective checks that
// its buffers lie in device memory and copies the one rank's data; sends
// and receives have no peer and are refused, as a one-rank NCCL would.
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "dist/nccl/nccl_lib.h"
#include "tests/cuda_emu/emu.h"

namespace wiola::dist {
namespace {

struct EmuComm {
  int nranks = 1;
};
thread_local std::string t_last_error;

ncclResult_t refuse(ncclResult_t r, std::string why) {
  std::fprintf(stderr, "cuda-emu: NCCL: %s\n", why.c_str());
  t_last_error = std::move(why);
  return r;
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
  }
  return 0;
}

// Checks the buffers and the communicator, then copies count elements.
ncclResult_t one_rank_copy(const char* op, const void* send, void* recv, size_t count, ncclDataType_t t,
                           ncclComm_t comm) {
  if (!comm) return refuse(ncclInvalidArgument, std::string(op) + ": no communicator");
  const size_t bytes = count * type_bytes(t);
  if (type_bytes(t) == 0) return refuse(ncclInvalidArgument, std::string(op) + ": unknown data type");
  if (bytes && (!wiola_emu::in_device_memory(send, bytes) || !wiola_emu::in_device_memory(recv, bytes)))
    return refuse(ncclInvalidArgument, std::string(op) + ": a buffer of " + std::to_string(bytes) +
                                           " bytes is not inside one device allocation");
  if (bytes && send != recv) std::memmove(recv, send, bytes);
  return ncclSuccess;
}

ncclResult_t get_version(int* v) {
  *v = 22800;  // reports itself as NCCL 2.28
  return ncclSuccess;
}
ncclResult_t get_unique_id(ncclUniqueId* id) {
  std::random_device rd;
  for (char& c : id->internal) c = char(rd());
  return ncclSuccess;
}
ncclResult_t comm_init_rank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
  if (nranks != 1 || rank != 0)
    return refuse(ncclInvalidUsage, "the emulator has one rank per communicator (asked rank " + std::to_string(rank) +
                                        " of " + std::to_string(nranks) + ")");
  *comm = reinterpret_cast<ncclComm_t>(new EmuComm);
  return ncclSuccess;
}
ncclResult_t comm_destroy(ncclComm_t comm) {
  delete reinterpret_cast<EmuComm*>(comm);
  return ncclSuccess;
}
ncclResult_t comm_abort(ncclComm_t comm) { return comm_destroy(comm); }
ncclResult_t comm_get_async_error(ncclComm_t, ncclResult_t* r) {
  *r = ncclSuccess;
  return ncclSuccess;
}
const char* get_error_string(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}
const char* get_last_error(ncclComm_t) { return t_last_error.c_str(); }

ncclResult_t all_reduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t, ncclComm_t c,
                        cudaStream_t) {
  return one_rank_copy("ncclAllReduce", s, r, n, t, c);
}
ncclResult_t reduce_scatter(const void* s, void* r, size_t recv_count, ncclDataType_t t, ncclRedOp_t, ncclComm_t c,
                            cudaStream_t) {
  return one_rank_copy("ncclReduceScatter", s, r, recv_count, t, c);
}
ncclResult_t all_gather(const void* s, void* r, size_t send_count, ncclDataType_t t, ncclComm_t c, cudaStream_t) {
  return one_rank_copy("ncclAllGather", s, r, send_count, t, c);
}
ncclResult_t broadcast(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t) {
  if (root != 0) return refuse(ncclInvalidArgument, "ncclBroadcast: root " + std::to_string(root) + " of 1 rank");
  return one_rank_copy("ncclBroadcast", s, r, n, t, c);
}
ncclResult_t send(const void*, size_t, ncclDataType_t, int peer, ncclComm_t, cudaStream_t) {
  return refuse(ncclInvalidArgument, "ncclSend to rank " + std::to_string(peer) + " of a one-rank communicator");
}
ncclResult_t recv(void*, size_t, ncclDataType_t, int peer, ncclComm_t, cudaStream_t) {
  return refuse(ncclInvalidArgument, "ncclRecv from rank " + std::to_string(peer) + " of a one-rank communicator");
}

}  // namespace

const Nccl& nccl() {
  static const Nccl n{get_version, get_unique_id, comm_init_rank, comm_destroy, comm_abort, comm_get_async_error,
                      get_error_string, get_last_error, all_reduce, reduce_scatter, all_gather, broadcast, send,
                      recv};
  return n;
}

bool nccl_available() { return true; }

}  // namespace wiola::dist
