// MPI implementation of dist::Comm: non-blocking MPI calls + bounded polling.
#include "dist/mpi_comm.h"

// The C API only (no deprecated C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "dist/diagnostics.h"
#include "dist/rank_states.h"
#include "util/error.h"

namespace wiola::dist {
namespace {

bool mpi_active() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::BF16: return MPI_UINT16_T;  // bits; reduced by the ops below
  }
  return MPI_DATATYPE_NULL;
}

// MPI has no bfloat16: its sum and max are user-defined ops on the bits.
// Each pairwise sum is taken in fp32 and rounded to nearest even, as NCCL's
// bf16 sum does; the order of the pairs is MPI's, fixed for a layout.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16_round(bf16_widen(a[i]) + bf16_widen(b[i]));
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    if (bf16_widen(a[i]) > bf16_widen(b[i]) || std::isnan(bf16_widen(a[i]))) b[i] = a[i];
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  if (t != DType::BF16) return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
  // Made once, after MPI_Init (every caller holds a communicator); freed by
  // MPI_Finalize.
  static const MPI_Op sum = [] {
    MPI_Op o;
    MPI_Op_create(bf16_sum, 1, &o);
    return o;
  }();
  static const MPI_Op max = [] {
    MPI_Op o;
    MPI_Op_create(bf16_max, 1, &o);
    return o;
  }();
  return op == ReduceOp::Sum ? sum : max;
}

// Every communicator returns MPI errors to the caller (MPI_ERRORS_RETURN),
// so the job ends with this message, naming the operation and the group,
// instead of Open MPI's generic abort. abort_job adds the world rank and the
// step context.
void check_mpi(int rc, const char* what, const std::string& group = "", int grank = -1, int gsize = -1) {
  if (rc == MPI_SUCCESS) return;
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  std::string where;
  if (!group.empty())
    where = " on group '" + group + "'" +
            (grank >= 0 ? " (rank " + std::to_string(grank) + " of " + std::to_string(gsize) + ")" : "");
  abort_job(std::string("MPI error in ") + what + where + ": " + std::string(buf, len), 3);
}

// Largest element count one MPI call gets; longer buffers are split.
constexpr size_t kMaxChunk = size_t(1) << 30;

int to_int_count(size_t count, const char* op) {
  WIOLA_CHECK(count <= size_t(INT_MAX), "dist: ", op, " of ", count,
              " elements per rank exceeds MPI's int count; split the buffer "
              "(smaller buckets)");
  return int(count);
}

// One pending MPI operation (possibly several MPI requests, for split
// buffers) with an optional completion step (in-place fix-ups).
class MpiRequest final : public RequestImpl {
 public:
  MpiRequest(std::string group, int group_rank, int group_size, const char* op, size_t count, DType t,
             double* wait_clock)
      : group_(std::move(group)),
        group_rank_(group_rank),
        group_size_(group_size),
        op_(op),
        count_(count),
        dtype_(t),
        wait_clock_(wait_clock) {}

  std::vector<MPI_Request> reqs;
  std::function<void()> on_done;

  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Testall(int(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), op_, group_, group_rank_,
              group_size_);
    if (flag) finish();
    return done_;
  }

  void wait() override {
    if (done_) return;
    const double limit = Diagnostics::instance().timeout_s();
    const double publish_after = rank_wait_publish_after_s(limit);
    bool published = false;  // a long wait is on the rank state board
    const auto start = std::chrono::steady_clock::now();
    for (long it = 0;; ++it) {
      const bool done = test();
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (done) {
        *wait_clock_ += waited;
        if (published) publish_rank_wait_done();
        return;
      }
      if (!published && waited > publish_after) {
        publish_rank_wait(describe(), waited);
        published = true;
      }
      if (waited > limit) timeout(waited);
      // Back off: spin, then yield, then sleep (ranks may share cores).
      if (it > 2000) std::this_thread::sleep_for(std::chrono::microseconds(100));
      else if (it > 200) std::this_thread::yield();
    }
  }

 private:
  void finish() {
    done_ = true;
    if (on_done) on_done();
  }

  // "all_reduce on group 'tp' (rank 1 of 2), count 5 float32"
  std::string describe() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s on group '%s' (rank %d of %d), count %zu %s", op_, group_.c_str(), group_rank_,
                  group_size_, count_, dtype_name(dtype_));
    return buf;
  }

  [[noreturn]] void timeout(double waited) {
    const std::string ctx = Diagnostics::instance().context();
    std::fprintf(stderr,
                 "wiola: communication timeout: world rank %d waited %.1f s "
                 "(limit %.1f s) in %s; context: %s\n",
                 world_rank(), waited, Diagnostics::instance().timeout_s(), describe().c_str(),
                 ctx.empty() ? "(none)" : ctx.c_str());
    // The other ranks cannot be asked (one of them may be stuck): what each
    // last published (dist/rank_states.h), when the trainer opened a board.
    std::fputs(rank_states_report().c_str(), stderr);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    std::_Exit(3);
  }

  std::string group_;
  int group_rank_, group_size_;
  const char* op_;
  size_t count_;
  DType dtype_;
  double* wait_clock_;
  bool done_ = false;
};

class MpiComm final : public Comm {
 public:
  MpiComm(MPI_Comm c, std::string name, bool owned) : comm_(c), name_(std::move(name)), owned_(owned) {
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", name_);
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", name_);
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", name_);
  }
  ~MpiComm() override {
    if (owned_ && mpi_active()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  Request iall_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
    auto r = make("all_reduce", count, t);
    const size_t eb = dtype_bytes(t);
    for (size_t off = 0; off < count || (count == 0 && off == 0); off += kMaxChunk) {
      const size_t c = std::min(kMaxChunk, count - off);
      char* rb = static_cast<char*>(recv) + off * eb;
      const void* sb = send == recv ? MPI_IN_PLACE : static_cast<const char*>(send) + off * eb;
      r->reqs.emplace_back();
      check(MPI_Iallreduce(sb, rb, int(c), mpi_type(t), mpi_op(op, t), comm_, &r->reqs.back()), "MPI_Iallreduce");
      if (count == 0) break;
    }
    return Request(std::move(r));
  }

  Request ireduce_scatter_sum(const void* send, void* recv, size_t recv_count, DType t) override {
    const int c = to_int_count(recv_count, "reduce_scatter");
    auto r = make("reduce_scatter_sum", recv_count, t);
    const size_t eb = dtype_bytes(t);
    const char* s = static_cast<const char*>(send);
    char* d = static_cast<char*>(recv);
    r->reqs.emplace_back();
    if (d == s + size_t(rank_) * recv_count * eb) {
      // NCCL-style in place: MPI leaves the result at the start of the
      // buffer; move it to this rank's chunk when done.
      char* base = const_cast<char*>(s);
      check(MPI_Ireduce_scatter_block(MPI_IN_PLACE, base, c, mpi_type(t), mpi_op(ReduceOp::Sum, t), comm_,
                                      &r->reqs.back()),
            "MPI_Ireduce_scatter_block");
      if (rank_ != 0) r->on_done = [base, d, n = recv_count * eb] { std::memmove(d, base, n); };
    } else {
      check(MPI_Ireduce_scatter_block(s, d, c, mpi_type(t), mpi_op(ReduceOp::Sum, t), comm_, &r->reqs.back()),
            "MPI_Ireduce_scatter_block");
    }
    return Request(std::move(r));
  }

  Request iall_gather(const void* send, void* recv, size_t send_count, DType t) override {
    const int c = to_int_count(send_count, "all_gather");
    auto r = make("all_gather", send_count, t);
    const size_t eb = dtype_bytes(t);
    char* d = static_cast<char*>(recv);
    const void* s = send == d + size_t(rank_) * send_count * eb ? MPI_IN_PLACE : send;
    r->reqs.emplace_back();
    check(MPI_Iallgather(s, s == MPI_IN_PLACE ? 0 : c, s == MPI_IN_PLACE ? MPI_DATATYPE_NULL : mpi_type(t), d, c,
                         mpi_type(t), comm_, &r->reqs.back()),
          "MPI_Iallgather");
    return Request(std::move(r));
  }

  Request ibroadcast(void* buf, size_t count, DType t, int root) override {
    WIOLA_CHECK(root >= 0 && root < size_, "dist: broadcast root ", root, " outside group '", name_, "' of size ",
                size_);
    auto r = make("broadcast", count, t, root);
    const size_t eb = dtype_bytes(t);
    for (size_t off = 0; off < count || (count == 0 && off == 0); off += kMaxChunk) {
      const size_t c = std::min(kMaxChunk, count - off);
      r->reqs.emplace_back();
      check(MPI_Ibcast(static_cast<char*>(buf) + off * eb, int(c), mpi_type(t), root, comm_, &r->reqs.back()),
            "MPI_Ibcast");
      if (count == 0) break;
    }
    return Request(std::move(r));
  }

  Request ibarrier() override {
    auto r = make("barrier", 0, DType::U8);
    r->reqs.emplace_back();
    check(MPI_Ibarrier(comm_, &r->reqs.back()), "MPI_Ibarrier");
    return Request(std::move(r));
  }

  Request isend(const void* buf, size_t count, DType t, int peer, int tag) override {
    check_peer(peer, "isend");
    auto r = make("isend", count, t);
    const size_t eb = dtype_bytes(t);
    for (size_t off = 0; off < count || (count == 0 && off == 0); off += kMaxChunk) {
      const size_t c = std::min(kMaxChunk, count - off);
      r->reqs.emplace_back();
      check(MPI_Isend(static_cast<const char*>(buf) + off * eb, int(c), mpi_type(t), peer, tag, comm_, &r->reqs.back()),
            "MPI_Isend");
      if (count == 0) break;
    }
    return Request(std::move(r));
  }

  Request irecv(void* buf, size_t count, DType t, int peer, int tag) override {
    check_peer(peer, "irecv");
    auto r = make("irecv", count, t);
    const size_t eb = dtype_bytes(t);
    for (size_t off = 0; off < count || (count == 0 && off == 0); off += kMaxChunk) {
      const size_t c = std::min(kMaxChunk, count - off);
      r->reqs.emplace_back();
      check(MPI_Irecv(static_cast<char*>(buf) + off * eb, int(c), mpi_type(t), peer, tag, comm_, &r->reqs.back()),
            "MPI_Irecv");
      if (count == 0) break;
    }
    return Request(std::move(r));
  }

  std::unique_ptr<Comm> split(int color, int key, const std::string& name) override {
    WIOLA_CHECK(color >= 0, "dist: split color must be >= 0, got ", color);
    // MPI_Comm_split blocks; a bounded barrier first turns a rank that never
    // arrives into a timeout diagnostic instead of a hang.
    barrier();
    MPI_Comm c;
    check(MPI_Comm_split(comm_, color, key, &c), "MPI_Comm_split");
    return std::make_unique<MpiComm>(c, name, true);
  }

 private:
  void check(int rc, const char* op) const { check_mpi(rc, op, name_, rank_, size_); }
  std::unique_ptr<MpiRequest> make(const char* op, size_t count, DType t, int root = -1) {
    count_traffic(op, count, t, root);
    return std::make_unique<MpiRequest>(name_, rank_, size_, op, count, t, wait_clock());
  }
  void check_peer(int peer, const char* op) const {
    WIOLA_CHECK(peer >= 0 && peer < size_, "dist: ", op, " peer ", peer, " outside group '", name_, "' of size ",
                size_);
  }

  MPI_Comm comm_;
  std::string name_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

// ---- diagnostics ------------------------------------------------------------------

// Diagnostics itself: dist/diagnostics.cpp (no MPI).

int world_rank() {
  if (!mpi_active()) return 0;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void abort_job(const std::string& msg, int code) {
  const std::string ctx = Diagnostics::instance().context();
  std::fprintf(stderr, "rank %d: %s%s%s\n", world_rank(), msg.c_str(),
               ctx.empty() ? "" : " [context: ", ctx.empty() ? "" : (ctx + "]").c_str());
  std::fputs(rank_states_report().c_str(), stderr);  // where every rank was ("" without a board)
  std::fflush(stderr);
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

// ---- runtime --------------------------------------------------------------------------

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    owns_ = true;
    if (provided < MPI_THREAD_FUNNELED) abort_job("MPI does not provide MPI_THREAD_FUNNELED", 3);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiRuntime::~MpiRuntime() {
  if (owns_ && mpi_active()) MPI_Finalize();
}

std::unique_ptr<Comm> mpi_world_comm() {
  WIOLA_CHECK(mpi_active(), "dist: MPI is not initialised (create an MpiRuntime first)");
  return std::make_unique<MpiComm>(MPI_COMM_WORLD, "world", false);
}

}  // namespace wiola::dist
