// NCCL loaded at run time: see nccl_lib.h.
#include "dist/nccl/nccl_lib.h"

#include "util/error.h"
#include "util/shared_lib.h"

namespace wiola::dist {
namespace {

Nccl load() {
  const SharedLib lib("libnccl.so.2", "nccl",
                      "put NCCL on LD_LIBRARY_PATH, or set parallel.data_plane = \"staged\"");
  Nccl n{};
  lib.bind(n.get_version, "ncclGetVersion");
  lib.bind(n.get_unique_id, "ncclGetUniqueId");
  lib.bind(n.comm_init_rank, "ncclCommInitRank");
  lib.bind(n.comm_destroy, "ncclCommDestroy");
  lib.bind(n.comm_abort, "ncclCommAbort");
  lib.bind(n.comm_get_async_error, "ncclCommGetAsyncError");
  lib.bind(n.get_error_string, "ncclGetErrorString");
  lib.bind(n.get_last_error, "ncclGetLastError");
  lib.bind(n.all_reduce, "ncclAllReduce");
  lib.bind(n.reduce_scatter, "ncclReduceScatter");
  lib.bind(n.all_gather, "ncclAllGather");
  lib.bind(n.broadcast, "ncclBroadcast");
  lib.bind(n.send, "ncclSend");
  lib.bind(n.recv, "ncclRecv");
  return n;
}

}  // namespace

const Nccl& nccl() {
  static const Nccl n = load();  // a throw leaves it unset: the next call retries
  return n;
}

bool nccl_available() {
  try {
    nccl();
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace wiola::dist
