// NCCL for the CUDA emulator (tools/cuda_emu/emu.h): the entry points of
// dist/nccl/nccl_lib.h, replacing the library the real build loads.
//
// - A one-rank communicator needs no MPI (the GPU kit's contract tests have
//   the same limit: NCCL refuses two ranks on one device).
// - A communicator of several ranks runs over MPI, one process per rank
//   under mpirun, as `wiola train` runs them; the members find each other
//   through the unique id (its maker's world rank and a serial number) and
//   make an MPI communicator of their own.
//
// Each operation checks its buffers, completes what its stream waits for,
// copies its input, posts a non-blocking MPI operation and becomes work its
// stream holds (wiola_emu::Held): it completes when the stream's later work
// needs it, and only then writes its output. Until then the output holds NaN
// bytes, so a reader that did not wait sees NaN; and a send buffer that
// changes before the operation completes is reported, as an asynchronous
// error naming the operation: on a GPU that write would race with NCCL.
#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "dist/nccl/nccl_lib.h"
#include "tools/cuda_emu/emu.h"

namespace wiola::dist {
namespace {

constexpr uint32_t kIdMagic = 0x57454d55;  // "WEMU"
constexpr int kTagBase = 30000;            // the members' meeting on MPI_COMM_WORLD

// What ncclGetUniqueId puts in the id.
struct IdData {
  uint32_t magic;
  int root;    // the maker's world rank (-1 without MPI)
  int serial;  // the maker's count of ids
};

struct EmuComm {
  int nranks = 1, rank = 0;
  MPI_Comm mpi = MPI_COMM_NULL;
  std::atomic<int> async{ncclSuccess};  // read by the NCCL communicator's watchdog
  std::mutex mu;
  std::string error;  // the asynchronous error's message (mu)

  void fail(ncclResult_t r, const std::string& why, bool report = true) {
    if (report) std::fprintf(stderr, "cuda-emu: NCCL: %s\n", why.c_str());
    std::lock_guard<std::mutex> l(mu);
    if (async.load() == ncclSuccess) {
      error = why;
      async.store(r);
    }
  }
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

// ---- bf16 reductions (MPI has no bf16) -------------------------------------
float bf16_to_float(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest even, NaN kept
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
template <class F>
void bf16_reduce(void* in, void* inout, int* len, F f) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(f(bf16_to_float(a[i]), bf16_to_float(b[i])));
}
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_reduce(in, inout, len, [](float x, float y) { return x + y; });
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_reduce(in, inout, len, [](float x, float y) { return x > y ? x : y; });
}
struct Bf16 {
  MPI_Datatype type;
  MPI_Op sum, max;
};
const Bf16& bf16() {
  static const Bf16 b = [] {
    Bf16 r{};
    MPI_Type_contiguous(2, MPI_BYTE, &r.type);
    MPI_Type_commit(&r.type);
    MPI_Op_create(bf16_sum, 1, &r.sum);
    MPI_Op_create(bf16_max, 1, &r.max);
    return r;
  }();
  return b;
}

// The MPI type and operation of a reduction; false if not offered.
bool reduction(ncclDataType_t t, ncclRedOp_t op, MPI_Datatype* mt, MPI_Op* mo) {
  if (t == ncclBfloat16) {
    if (op != ncclSum && op != ncclMax) return false;
    *mt = bf16().type;
    *mo = op == ncclSum ? bf16().sum : bf16().max;
    return true;
  }
  switch (t) {
    case ncclInt8: *mt = MPI_INT8_T; break;
    case ncclUint8: *mt = MPI_UINT8_T; break;
    case ncclInt32: *mt = MPI_INT32_T; break;
    case ncclUint32: *mt = MPI_UINT32_T; break;
    case ncclInt64: *mt = MPI_INT64_T; break;
    case ncclUint64: *mt = MPI_UINT64_T; break;
    case ncclFloat32: *mt = MPI_FLOAT; break;
    case ncclFloat64: *mt = MPI_DOUBLE; break;
    default: return false;  // fp16
  }
  switch (op) {
    case ncclSum: *mo = MPI_SUM; break;
    case ncclProd: *mo = MPI_PROD; break;
    case ncclMax: *mo = MPI_MAX; break;
    case ncclMin: *mo = MPI_MIN; break;
    default: return false;  // ncclAvg
  }
  return true;
}

// ---- one operation in flight -------------------------------------------------
class Message final : public ::wiola_emu::Held {
 public:
  Message(std::string op, EmuComm* comm) : op_(std::move(op)), comm_(comm) {}
  std::vector<char> in, out;   // the input as it was at issue; the result
  const void* src = nullptr;   // the send buffer, checked at completion ...
  bool check_src = false;      // ... unless it is the output too
  void* dst = nullptr;         // where `out` goes at completion
  MPI_Request req = MPI_REQUEST_NULL;

  bool progress(bool block) override {
    int flag = 1;
    const int rc = block ? MPI_Wait(&req, MPI_STATUS_IGNORE) : MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      char s[MPI_MAX_ERROR_STRING];
      int n = 0;
      MPI_Error_string(rc, s, &n);
      comm_->fail(ncclSystemError, op_ + ": MPI error " + std::string(s, size_t(n)));
      return true;
    }
    if (!flag) return false;
    if (check_src && !in.empty() && std::memcmp(src, in.data(), in.size()) != 0)
      comm_->fail(ncclInvalidUsage, op_ + " (rank " + std::to_string(comm_->rank) + " of " +
                                        std::to_string(comm_->nranks) +
                                        "): its send buffer changed while the operation was in flight; on a GPU "
                                        "that write races with NCCL (a missing wait before it)");
    if (dst && !out.empty()) std::memcpy(dst, out.data(), out.size());
    return true;
  }

 private:
  std::string op_;
  EmuComm* comm_;
};

bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return na && nb && x < y + nb && y < x + na;
}

// Checks what every operation needs; ncclSuccess when it may go on.
ncclResult_t check(const char* op, ncclComm_t comm, ncclDataType_t t, const void* send, size_t send_bytes,
                   const void* recv, size_t recv_bytes) {
  if (!comm) return refuse(ncclInvalidArgument, std::string(op) + ": no communicator");
  if (type_bytes(t) == 0) return refuse(ncclInvalidArgument, std::string(op) + ": unknown data type");
  if (auto* c = reinterpret_cast<EmuComm*>(comm); c->async.load() != ncclSuccess)
    return refuse(ncclInvalidUsage, std::string(op) + ": the communicator has failed");
  if (send_bytes > size_t(INT_MAX) || recv_bytes > size_t(INT_MAX))
    return refuse(ncclInvalidArgument, std::string(op) + ": messages of 2 GiB and more are not emulated");
  if (send_bytes && !wiola_emu::in_device_memory(send, send_bytes))
    return refuse(ncclInvalidArgument, std::string(op) + ": the send buffer's " + std::to_string(send_bytes) +
                                           " bytes are not inside one device allocation");
  if (recv_bytes && !wiola_emu::in_device_memory(recv, recv_bytes))
    return refuse(ncclInvalidArgument, std::string(op) + ": the receive buffer's " + std::to_string(recv_bytes) +
                                           " bytes are not inside one device allocation");
  return ncclSuccess;
}

// Issues one operation on `s`: after the stream's earlier work, with its
// input copied and its output poisoned; post(in, out, req) starts the MPI
// operation. poison: whether the output reads as NaN until completion.
template <class Post>
ncclResult_t issue(const char* op, ncclComm_t comm, cudaStream_t s, const void* send, size_t send_bytes, void* recv,
                   size_t recv_bytes, bool poison, const Post& post) {
  auto* c = reinterpret_cast<EmuComm*>(comm);
  wiola_emu::stream_ready(s);  // what the operation waits for (the compute stream's point)
  auto m = std::make_unique<Message>(op, c);
  m->in.assign(static_cast<const char*>(send), static_cast<const char*>(send) + send_bytes);
  m->out.resize(recv_bytes);
  m->src = send;
  m->check_src = !overlap(send, send_bytes, recv, recv_bytes);
  m->dst = recv;
  if (poison && recv_bytes) std::memset(recv, 0xff, recv_bytes);
  if (const int rc = post(m->in.data(), m->out.data(), &m->req); rc != MPI_SUCCESS)
    return refuse(ncclSystemError, std::string(op) + ": MPI refused to start it (error " + std::to_string(rc) + ")");
  wiola_emu::hold(s, std::move(m));
  return ncclSuccess;
}

// A one-rank collective: after the stream's earlier work, at once.
ncclResult_t one_rank_copy(const void* send, void* recv, size_t bytes, cudaStream_t s) {
  wiola_emu::stream_ready(s);
  if (bytes && send != recv) std::memmove(recv, send, bytes);
  return ncclSuccess;
}

ncclResult_t get_version(int* v) {
  *v = 22800;  // reports itself as NCCL 2.28
  return ncclSuccess;
}
ncclResult_t get_unique_id(ncclUniqueId* id) {
  static int serial = 0;
  std::memset(id->internal, 0, sizeof id->internal);
  IdData d{kIdMagic, -1, serial++};
  int init = 0;
  MPI_Initialized(&init);
  if (init) MPI_Comm_rank(MPI_COMM_WORLD, &d.root);
  std::memcpy(id->internal, &d, sizeof d);
  return ncclSuccess;
}

// The members send their world ranks to the id's maker, which sends the
// list back; each then makes the MPI communicator of the list (blocking, as
// ncclCommInitRank is).
ncclResult_t join(EmuComm* c, const IdData& d) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init)
    return refuse(ncclInvalidUsage, "a communicator of " + std::to_string(c->nranks) +
                                        " ranks needs MPI: the emulator runs one process per rank (mpirun)");
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  const int tag = kTagBase + d.serial % 1000;
  std::vector<int> members(size_t(c->nranks), -1);
  if (c->rank == 0) {
    if (world != d.root)
      return refuse(ncclInvalidUsage, "rank 0 is world rank " + std::to_string(world) + ", not the id's maker " +
                                          std::to_string(d.root));
    members[0] = world;
    for (int i = 1; i < c->nranks; ++i) {
      int m[2];
      MPI_Recv(m, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (m[0] <= 0 || m[0] >= c->nranks || members[size_t(m[0])] != -1)
        return refuse(ncclInvalidUsage, "rank " + std::to_string(m[0]) + " joined twice or out of range");
      members[size_t(m[0])] = m[1];
    }
    for (int i = 1; i < c->nranks; ++i)
      MPI_Send(members.data(), c->nranks, MPI_INT, members[size_t(i)], tag, MPI_COMM_WORLD);
  } else {
    int m[2] = {c->rank, world};
    MPI_Send(m, 2, MPI_INT, d.root, tag, MPI_COMM_WORLD);
    MPI_Recv(members.data(), c->nranks, MPI_INT, d.root, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  MPI_Group wg, g;
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  MPI_Group_incl(wg, c->nranks, members.data(), &g);
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &c->mpi);
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  if (rc != MPI_SUCCESS) return refuse(ncclSystemError, "MPI_Comm_create_group failed");
  MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
  return ncclSuccess;
}

ncclResult_t comm_init_rank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return refuse(ncclInvalidArgument, "rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  IdData d;
  std::memcpy(&d, id.internal, sizeof d);
  if (d.magic != kIdMagic) return refuse(ncclInvalidArgument, "not an id of ncclGetUniqueId");
  auto c = std::make_unique<EmuComm>();
  c->nranks = nranks;
  c->rank = rank;
  if (nranks > 1)
    if (const ncclResult_t r = join(c.get(), d); r != ncclSuccess) return r;
  *comm = reinterpret_cast<ncclComm_t>(c.release());
  return ncclSuccess;
}
// Called on the thread that issues work, streams drained (the communicator's
// destructor synchronises its lanes first).
ncclResult_t comm_destroy(ncclComm_t comm) {
  auto* c = reinterpret_cast<EmuComm*>(comm);
  int fin = 0;
  MPI_Finalized(&fin);
  if (c && c->mpi != MPI_COMM_NULL && !fin) MPI_Comm_free(&c->mpi);
  delete c;
  return ncclSuccess;
}
// May come from the watchdog's thread, which must not call MPI: the
// communicator is left to the job's end.
ncclResult_t comm_abort(ncclComm_t comm) {
  if (auto* c = reinterpret_cast<EmuComm*>(comm)) c->fail(ncclRemoteError, "communicator aborted", false);
  return ncclSuccess;
}
ncclResult_t comm_get_async_error(ncclComm_t comm, ncclResult_t* r) {
  *r = comm ? ncclResult_t(reinterpret_cast<EmuComm*>(comm)->async.load()) : ncclSuccess;
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
// The communicator's asynchronous error if it has one, else this thread's
// last refusal.
const char* get_last_error(ncclComm_t comm) {
  if (auto* c = reinterpret_cast<EmuComm*>(comm); c && c->async.load() != ncclSuccess) {
    std::lock_guard<std::mutex> l(c->mu);
    t_last_error = c->error;
  }
  return t_last_error.c_str();
}

ncclResult_t all_reduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                        cudaStream_t st) {
  const size_t b = n * type_bytes(t);
  if (const ncclResult_t e = check("ncclAllReduce", comm, t, s, b, r, b); e != ncclSuccess) return e;
  auto* c = reinterpret_cast<EmuComm*>(comm);
  if (c->nranks == 1) return one_rank_copy(s, r, b, st);
  MPI_Datatype mt;
  MPI_Op mo;
  if (!reduction(t, op, &mt, &mo)) return refuse(ncclInvalidArgument, "ncclAllReduce: reduction not emulated");
  return issue("ncclAllReduce", comm, st, s, b, r, b, true, [&](const void* in, void* out, MPI_Request* q) {
    return MPI_Iallreduce(in, out, int(n), mt, mo, c->mpi, q);
  });
}
ncclResult_t reduce_scatter(const void* s, void* r, size_t recv_count, ncclDataType_t t, ncclRedOp_t op,
                            ncclComm_t comm, cudaStream_t st) {
  if (!comm) return refuse(ncclInvalidArgument, "ncclReduceScatter: no communicator");
  auto* c = reinterpret_cast<EmuComm*>(comm);
  const size_t rb = recv_count * type_bytes(t), sb = rb * size_t(c->nranks);
  if (const ncclResult_t e = check("ncclReduceScatter", comm, t, s, sb, r, rb); e != ncclSuccess) return e;
  if (c->nranks == 1) return one_rank_copy(s, r, rb, st);
  MPI_Datatype mt;
  MPI_Op mo;
  if (!reduction(t, op, &mt, &mo)) return refuse(ncclInvalidArgument, "ncclReduceScatter: reduction not emulated");
  return issue("ncclReduceScatter", comm, st, s, sb, r, rb, true, [&](const void* in, void* out, MPI_Request* q) {
    return MPI_Ireduce_scatter_block(in, out, int(recv_count), mt, mo, c->mpi, q);
  });
}
ncclResult_t all_gather(const void* s, void* r, size_t send_count, ncclDataType_t t, ncclComm_t comm,
                        cudaStream_t st) {
  if (!comm) return refuse(ncclInvalidArgument, "ncclAllGather: no communicator");
  auto* c = reinterpret_cast<EmuComm*>(comm);
  const size_t sb = send_count * type_bytes(t), rb = sb * size_t(c->nranks);
  if (const ncclResult_t e = check("ncclAllGather", comm, t, s, sb, r, rb); e != ncclSuccess) return e;
  if (c->nranks == 1) return one_rank_copy(s, r, sb, st);
  return issue("ncclAllGather", comm, st, s, sb, r, rb, true, [&](const void* in, void* out, MPI_Request* q) {
    return MPI_Iallgather(in, int(sb), MPI_BYTE, out, int(sb), MPI_BYTE, c->mpi, q);
  });
}
ncclResult_t broadcast(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t comm,
                       cudaStream_t st) {
  if (!comm) return refuse(ncclInvalidArgument, "ncclBroadcast: no communicator");
  auto* c = reinterpret_cast<EmuComm*>(comm);
  if (root < 0 || root >= c->nranks)
    return refuse(ncclInvalidArgument,
                  "ncclBroadcast: root " + std::to_string(root) + " of " + std::to_string(c->nranks) + " ranks");
  const size_t b = n * type_bytes(t);
  const bool is_root = c->rank == root;
  if (const ncclResult_t e = check("ncclBroadcast", comm, t, s, is_root ? b : 0, r, b); e != ncclSuccess) return e;
  if (c->nranks == 1) return one_rank_copy(s, r, b, st);
  // The root sends its input and receives it back; the others' send buffer is not read.
  return issue("ncclBroadcast", comm, st, s, is_root ? b : 0, r, b, !(is_root && s == r),
               [&](const void* in, void* out, MPI_Request* q) {
                 if (is_root) std::memcpy(out, in, b);
                 return MPI_Ibcast(out, int(b), MPI_BYTE, root, c->mpi, q);
               });
}
// A send's or receive's peer: another rank of the communicator.
ncclResult_t check_peer(const char* op, const EmuComm* c, int peer) {
  if (peer >= 0 && peer < c->nranks && peer != c->rank) return ncclSuccess;
  return refuse(ncclInvalidArgument, std::string(op) + ": peer " + std::to_string(peer) + " is not another rank (rank " +
                                         std::to_string(c->rank) + " of " + std::to_string(c->nranks) + ")");
}
ncclResult_t send(const void* s, size_t n, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t st) {
  const size_t b = n * type_bytes(t);
  if (const ncclResult_t e = check("ncclSend", comm, t, s, b, nullptr, 0); e != ncclSuccess) return e;
  auto* c = reinterpret_cast<EmuComm*>(comm);
  if (const ncclResult_t e = check_peer("ncclSend", c, peer); e != ncclSuccess) return e;
  return issue("ncclSend", comm, st, s, b, nullptr, 0, false, [&](const void* in, void*, MPI_Request* q) {
    return MPI_Isend(in, int(b), MPI_BYTE, peer, 0, c->mpi, q);
  });
}
ncclResult_t recv(void* r, size_t n, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t st) {
  const size_t b = n * type_bytes(t);
  if (const ncclResult_t e = check("ncclRecv", comm, t, nullptr, 0, r, b); e != ncclSuccess) return e;
  auto* c = reinterpret_cast<EmuComm*>(comm);
  if (const ncclResult_t e = check_peer("ncclRecv", c, peer); e != ncclSuccess) return e;
  return issue("ncclRecv", comm, st, nullptr, 0, r, b, true, [&](const void*, void* out, MPI_Request* q) {
    return MPI_Irecv(out, int(b), MPI_BYTE, peer, 0, c->mpi, q);
  });
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
