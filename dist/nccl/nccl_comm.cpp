// NCCL data-plane communicator: see nccl_comm.h.
#include "dist/nccl/nccl_comm.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "dist/diagnostics.h"
#include "dist/nccl/nccl_lib.h"
#include "util/env.h"
#include "util/error.h"

namespace wiola::dist {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  return ncclUint8;
}

// The launcher's world rank (this library has no MPI): Open MPI, Slurm,
// MPICH/PMI; -1 when none is set.
int launcher_rank() { return env_first_int({"OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"}); }

// "<error string> (<NCCL's last message>)"; either may be missing.
std::string nccl_error(ncclResult_t r, ncclComm_t c) {
  const char* s = nccl().get_error_string(r);
  const char* last = nccl().get_last_error(c);
  std::string m = s ? s : "unknown NCCL error";
  if (last && *last) m += std::string(" (") + last + ")";
  return m;
}

[[noreturn]] void default_fatal(const std::string& msg) {
  std::fprintf(stderr, "%s\n", msg.c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

// One issued operation, as the watchdog and the exposure accounting see it.
struct InFlight {
  const char* op = "";
  size_t count = 0;
  DType dtype = DType::F32;
  std::string context;           // the trainer's, at issue
  cudaEvent_t ready = nullptr;   // compute stream at issue
  cudaEvent_t begin = nullptr;   // the lane's stream reached the operation
  cudaEvent_t done = nullptr;    // the operation's end
  cudaEvent_t waited = nullptr;  // compute stream at wait(), if it waited
  bool settled = false;          // the request is finished with
  bool started = false;          // the watchdog saw `ready` complete ...
  Clock::time_point start{};     // ... at this time
};

class NcclComm;

// One per process: polls every live NCCL communicator.
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog w;
    return w;
  }
  void add(NcclComm* c, int device);
  void remove(NcclComm* c) {
    std::lock_guard<std::mutex> l(mu_);
    comms_.erase(std::remove(comms_.begin(), comms_.end(), c), comms_.end());
  }
  ~Watchdog() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  Watchdog() = default;
  void run(int device);
  std::mutex mu_;
  std::vector<NcclComm*> comms_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

// The three lanes of a communicator: collectives, and point-to-point
// towards higher and towards lower ranks.
enum class Lane { Coll, Up, Down };

class NcclRequest;

class NcclComm final : public Comm {
 public:
  NcclComm(Comm& ctrl, NcclOptions opt)
      : name_(ctrl.name()),
        rank_(ctrl.rank()),
        size_(ctrl.size()),
        compute_(static_cast<cudaStream_t>(opt.compute_stream)),
        fatal_(opt.fatal ? std::move(opt.fatal) : std::function<void(const std::string&)>(default_fatal)) {
    WIOLA_CHECK(compute_, "nccl: no compute stream given (group '", name_, "')");
    const Nccl& n = nccl();
    cuda(cudaGetDevice(&device_), "cudaGetDevice");
    lanes_[0].comm = init(ctrl, n);
    if (opt.p2p && size_ > 1) {
      lanes_[1].comm = init(ctrl, n);
      lanes_[2].comm = init(ctrl, n);
    }
    int lo = 0, hi = 0;
    cuda(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
    for (auto& l : lanes_)
      if (l.comm) cuda(cudaStreamCreateWithPriority(&l.stream, cudaStreamNonBlocking, hi), "cudaStreamCreate");
    cuda(cudaMalloc(&scratch_, sizeof(int32_t)), "cudaMalloc (barrier word)");
    Watchdog::get().add(this, device_);
  }

  ~NcclComm() override {
    Watchdog::get().remove(this);
    for (auto& l : lanes_)
      if (l.stream) cudaStreamSynchronize(l.stream);
    cudaStreamSynchronize(compute_);
    settle_traffic();
    for (auto& e : inflight_) release(*e);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    for (auto& l : lanes_) {
      if (l.comm) nccl().comm_destroy(l.comm);
      if (l.stream) cudaStreamDestroy(l.stream);
    }
    cudaFree(scratch_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  Request iall_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
    count_traffic("all_reduce", count, t);
    const ncclRedOp_t rop = op == ReduceOp::Sum ? ncclSum : ncclMax;
    return issue("all_reduce", count, t, Lane::Coll, [&](ncclComm_t c, cudaStream_t s) {
      return nccl().all_reduce(send, recv, count, nccl_type(t), rop, c, s);
    });
  }
  Request ireduce_scatter_sum(const void* send, void* recv, size_t recv_count, DType t) override {
    count_traffic("reduce_scatter_sum", recv_count, t);
    return issue("reduce_scatter_sum", recv_count, t, Lane::Coll, [&](ncclComm_t c, cudaStream_t s) {
      return nccl().reduce_scatter(send, recv, recv_count, nccl_type(t), ncclSum, c, s);
    });
  }
  Request iall_gather(const void* send, void* recv, size_t send_count, DType t) override {
    count_traffic("all_gather", send_count, t);
    return issue("all_gather", send_count, t, Lane::Coll, [&](ncclComm_t c, cudaStream_t s) {
      return nccl().all_gather(send, recv, send_count, nccl_type(t), c, s);
    });
  }
  Request ibroadcast(void* buf, size_t count, DType t, int root) override {
    WIOLA_CHECK(root >= 0 && root < size_, "nccl broadcast: root ", root, " outside group '", name_, "' of ", size_);
    count_traffic("broadcast", count, t, root);
    return issue("broadcast", count, t, Lane::Coll, [&](ncclComm_t c, cudaStream_t s) {
      return nccl().broadcast(buf, buf, count, nccl_type(t), root, c, s);
    });
  }
  Request ibarrier() override {
    count_traffic("barrier", 0, DType::U8);  // as MPI: an operation of no bytes
    return issue("barrier", 1, DType::I32, Lane::Coll, [&](ncclComm_t c, cudaStream_t s) {
      return nccl().all_reduce(scratch_, scratch_, 1, ncclInt32, ncclSum, c, s);
    });
  }
  Request isend(const void* buf, size_t count, DType t, int peer, int) override {
    check_peer(peer, "isend");
    count_traffic("isend", count, t);
    return issue("isend", count, t, peer > rank_ ? Lane::Up : Lane::Down,
                 [&](ncclComm_t c, cudaStream_t s) { return nccl().send(buf, count, nccl_type(t), peer, c, s); });
  }
  Request irecv(void* buf, size_t count, DType t, int peer, int) override {
    check_peer(peer, "irecv");
    count_traffic("irecv", count, t);
    return issue("irecv", count, t, peer < rank_ ? Lane::Up : Lane::Down,
                 [&](ncclComm_t c, cudaStream_t s) { return nccl().recv(buf, count, nccl_type(t), peer, c, s); });
  }
  std::unique_ptr<Comm> split(int, int, const std::string& name) override {
    fail("nccl data plane '", name_, "': split('", name,
         "') is not offered; split the control-plane communicator and wrap the parts");
  }

  // Completed operations' exposed time into wait_s; their events back to
  // the pool. Main thread only.
  void settle_traffic() override {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      InFlight& e = **it;
      if (!e.settled || cudaEventQuery(e.done) != cudaSuccess ||
          (e.waited && cudaEventQuery(e.waited) != cudaSuccess)) {
        ++it;
        continue;
      }
      float ms = 0;
      if (e.waited && cudaEventElapsedTime(&ms, e.waited, e.done) == cudaSuccess && ms > 0)
        *wait_clock() += double(ms) * 1e-3;
      if (cudaEventElapsedTime(&ms, e.begin, e.done) == cudaSuccess && ms > 0) *busy_clock() += double(ms) * 1e-3;
      release(e);
      it = inflight_.erase(it);
    }
  }

  // The compute stream waits for `e` (its part of Request::wait()).
  void order_after(InFlight& e, bool done_already) {
    std::lock_guard<std::mutex> l(mu_);
    if (e.settled) return;
    if (!done_already) {
      e.waited = take_event();
      cuda(cudaEventRecord(e.waited, compute_), "cudaEventRecord", &e);
      cuda(cudaStreamWaitEvent(compute_, e.done, 0), "cudaStreamWaitEvent", &e);
    }
    e.settled = true;
  }

  // cudaEventQuery of `e`'s end: true when done; errors end the job.
  bool query(InFlight& e) {
    const cudaError_t q = cudaEventQuery(e.done);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) cuda(q, "cudaEventQuery", &e);
    return false;
  }

  // Watchdog thread: one poll.
  void poll(Clock::time_point now) {
    std::lock_guard<std::mutex> l(mu_);
    const Nccl& n = nccl();
    for (const auto& lane : lanes_) {
      if (!lane.comm) continue;
      ncclResult_t r = ncclSuccess;
      n.comm_get_async_error(lane.comm, &r);
      if (r != ncclSuccess && r != ncclInProgress) {
        InFlight* first = nullptr;
        for (auto& e : inflight_)
          if (cudaEventQuery(e->done) != cudaSuccess) {
            first = e.get();
            break;
          }
        die(first, "asynchronous NCCL error: " + nccl_error(r, lane.comm));
      }
    }
    const double limit = Diagnostics::instance().timeout_s();
    for (auto& p : inflight_) {
      InFlight& e = *p;
      if (!e.started) {
        if (cudaEventQuery(e.ready) != cudaSuccess) continue;  // not started: the compute stream is behind
        e.started = true;
        e.start = now;
      }
      if (cudaEventQuery(e.done) == cudaSuccess) continue;
      const double age = std::chrono::duration<double>(now - e.start).count();
      if (age > limit) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "running %.1f s (limit %.1f s, parallel.comm_timeout_s)", age, limit);
        die(&e, std::string("communication timeout: ") + buf);
      }
    }
  }

 private:
  struct LaneState {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
  };

  ncclComm_t init(Comm& ctrl, const Nccl& n) {
    ncclUniqueId id{};
    if (rank_ == 0) nccl_check(n.get_unique_id(&id), "ncclGetUniqueId");
    ctrl.broadcast(&id, sizeof id, DType::U8, 0);
    ncclComm_t c = nullptr;
    nccl_check(n.comm_init_rank(&c, size_, id, rank_), "ncclCommInitRank");
    return c;
  }

  template <class Call>
  Request issue(const char* op, size_t count, DType t, Lane lane, const Call& call) {
    settle_traffic();
    LaneState& L = lanes_[int(lane)];
    WIOLA_CHECK(L.comm, "nccl data plane '", name_, "': ", op,
                " needs the point-to-point communicators (made for the pipeline group only)");
    auto e = std::make_shared<InFlight>();
    e->op = op;
    e->count = count;
    e->dtype = t;
    e->context = Diagnostics::instance().context();
    {
      std::lock_guard<std::mutex> l(mu_);
      e->ready = take_event();
      e->begin = take_event();
      e->done = take_event();
    }
    cuda(cudaEventRecord(e->ready, compute_), "cudaEventRecord", e.get());
    cuda(cudaStreamWaitEvent(L.stream, e->ready, 0), "cudaStreamWaitEvent", e.get());
    cuda(cudaEventRecord(e->begin, L.stream), "cudaEventRecord", e.get());
    const ncclResult_t r = call(L.comm, L.stream);
    if (r != ncclSuccess && r != ncclInProgress) die(e.get(), "NCCL error: " + nccl_error(r, L.comm));
    cuda(cudaEventRecord(e->done, L.stream), "cudaEventRecord", e.get());
    {
      std::lock_guard<std::mutex> l(mu_);
      inflight_.push_back(e);
    }
    return make_request(e);
  }
  Request make_request(std::shared_ptr<InFlight> e);

  void check_peer(int peer, const char* op) const {
    WIOLA_CHECK(peer >= 0 && peer < size_ && peer != rank_, "nccl ", op, ": peer ", peer,
                " is not another rank of group '", name_, "' (rank ", rank_, " of ", size_, ")");
  }

  // Pool of timing events (mu_ held).
  cudaEvent_t take_event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cuda(cudaEventCreate(&e), "cudaEventCreate");
    return e;
  }
  void release(InFlight& e) {
    for (cudaEvent_t* p : {&e.ready, &e.begin, &e.done, &e.waited})
      if (*p) free_events_.push_back(std::exchange(*p, nullptr));
  }

  void nccl_check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) die(nullptr, std::string(what) + " failed: " + nccl_error(r, nullptr));
  }
  void cuda(cudaError_t r, const char* what, InFlight* e = nullptr) {
    if (r != cudaSuccess) die(e, std::string("CUDA error in ") + what + ": " + cudaGetErrorString(r));
  }

  // One message naming rank, group, operation and context; the NCCL
  // communicators are aborted first so that no kernel keeps the GPU.
  [[noreturn]] void die(const InFlight* e, const std::string& why) {
    std::string msg = "wiola: " + why + "; world rank " + std::to_string(launcher_rank()) + ", group '" + name_ +
                      "' (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")";
    if (e) {
      msg += ", operation " + std::string(e->op) + " of " + std::to_string(e->count) + " " + dtype_name(e->dtype) +
             "; context at issue: " + (e->context.empty() ? "(none)" : e->context);
    }
    for (auto& l : lanes_)
      if (l.comm) nccl().comm_abort(l.comm);
    fatal_(msg);
    std::_Exit(3);  // fatal_ must not return
  }

  std::string name_;
  int rank_, size_, device_ = 0;
  cudaStream_t compute_;
  std::function<void(const std::string&)> fatal_;
  LaneState lanes_[3];
  void* scratch_ = nullptr;
  std::mutex mu_;  // inflight_, free_events_, InFlight fields (with the watchdog)
  std::deque<std::shared_ptr<InFlight>> inflight_;
  std::vector<cudaEvent_t> free_events_;
};

class NcclRequest final : public RequestImpl {
 public:
  NcclRequest(NcclComm* c, std::shared_ptr<InFlight> e) : comm_(c), e_(std::move(e)) {}
  bool test() override {
    if (done_) return true;
    if (!comm_->query(*e_)) return false;
    comm_->order_after(*e_, true);
    done_ = true;
    return true;
  }
  void wait() override {
    if (done_) return;
    comm_->order_after(*e_, comm_->query(*e_));
    done_ = true;
  }

 private:
  NcclComm* comm_;
  std::shared_ptr<InFlight> e_;
  bool done_ = false;
};

Request NcclComm::make_request(std::shared_ptr<InFlight> e) {
  return Request(std::make_unique<NcclRequest>(this, std::move(e)));
}

void Watchdog::add(NcclComm* c, int device) {
  std::lock_guard<std::mutex> l(mu_);
  comms_.push_back(c);
  if (!thread_.joinable()) thread_ = std::thread([this, device] { run(device); });
}

void Watchdog::run(int device) {
  cudaSetDevice(device);
  while (!stop_) {
    {
      std::lock_guard<std::mutex> l(mu_);
      const auto now = Clock::now();
      for (NcclComm* c : comms_) c->poll(now);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

std::unique_ptr<Comm> nccl_comm(Comm& ctrl, NcclOptions opt) {
  return std::make_unique<NcclComm>(ctrl, std::move(opt));
}

void require_nccl() { (void)nccl(); }

DataPlaneFactory nccl_data_plane(void* compute_stream, std::function<void(const std::string&)> fatal) {
  return [compute_stream, fatal](Comm& ctrl) {
    NcclOptions o;
    o.compute_stream = compute_stream;
    o.p2p = ctrl.name() == "pp";
    o.fatal = fatal;
    return nccl_comm(ctrl, std::move(o));
  };
}

}  // namespace wiola::dist
