#include "dist/staged_comm.h"

#include <vector>

#include "util/error.h"

namespace wiola::dist {
namespace {

// The inner request, the host staging it reads or writes, and what to copy
// back to the backend once it completes.
class StagedRequest final : public RequestImpl {
 public:
  explicit StagedRequest(size_t bytes) : staging(bytes) {}
  std::vector<unsigned char> staging;
  Request inner;
  std::function<void()> on_done;

  bool test() override {
    if (done_) return true;
    if (!inner.test()) return false;
    finish();
    return true;
  }
  void wait() override {
    if (done_) return;
    inner.wait();
    finish();
  }

 private:
  void finish() {
    done_ = true;
    if (on_done) on_done();
  }
  bool done_ = false;
};

class StagedComm final : public Comm {
 public:
  StagedComm(Comm& inner, HostStaging s) : inner_(inner), s_(std::move(s)) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& name() const override { return inner_.name(); }

  Request iall_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
    const size_t n = count * dtype_bytes(t);
    auto r = std::make_unique<StagedRequest>(n);
    unsigned char* h = r->staging.data();
    s_.download(h, send, n);
    r->inner = inner_.iall_reduce(h, h, count, t, op);
    r->on_done = [this, recv, h, n] { s_.upload(recv, h, n); };
    return Request(std::move(r));
  }

  // Runs in place on the staging copy of the whole send buffer.
  Request ireduce_scatter_sum(const void* send, void* recv, size_t recv_count, DType t) override {
    const size_t c = recv_count * dtype_bytes(t), n = c * size_t(size());
    auto r = std::make_unique<StagedRequest>(n);
    unsigned char* h = r->staging.data();
    unsigned char* mine = h + size_t(rank()) * c;
    s_.download(h, send, n);
    r->inner = inner_.ireduce_scatter_sum(h, mine, recv_count, t);
    r->on_done = [this, recv, mine, c] { s_.upload(recv, mine, c); };
    return Request(std::move(r));
  }

  Request iall_gather(const void* send, void* recv, size_t send_count, DType t) override {
    const size_t c = send_count * dtype_bytes(t), n = c * size_t(size());
    auto r = std::make_unique<StagedRequest>(n);
    unsigned char* h = r->staging.data();
    unsigned char* mine = h + size_t(rank()) * c;
    s_.download(mine, send, c);
    r->inner = inner_.iall_gather(mine, h, send_count, t);
    r->on_done = [this, recv, h, n] { s_.upload(recv, h, n); };
    return Request(std::move(r));
  }

  Request ibroadcast(void* buf, size_t count, DType t, int root) override {
    const size_t n = count * dtype_bytes(t);
    auto r = std::make_unique<StagedRequest>(n);
    unsigned char* h = r->staging.data();
    if (rank() == root) s_.download(h, buf, n);
    r->inner = inner_.ibroadcast(h, count, t, root);
    if (rank() != root) r->on_done = [this, buf, h, n] { s_.upload(buf, h, n); };
    return Request(std::move(r));
  }

  Request ibarrier() override { return inner_.ibarrier(); }

  Request isend(const void* buf, size_t count, DType t, int peer, int tag) override {
    const size_t n = count * dtype_bytes(t);
    auto r = std::make_unique<StagedRequest>(n);
    s_.download(r->staging.data(), buf, n);
    r->inner = inner_.isend(r->staging.data(), count, t, peer, tag);
    return Request(std::move(r));
  }

  Request irecv(void* buf, size_t count, DType t, int peer, int tag) override {
    const size_t n = count * dtype_bytes(t);
    auto r = std::make_unique<StagedRequest>(n);
    unsigned char* h = r->staging.data();
    r->inner = inner_.irecv(h, count, t, peer, tag);
    r->on_done = [this, buf, h, n] { s_.upload(buf, h, n); };
    return Request(std::move(r));
  }

  std::unique_ptr<Comm> split(int, int, const std::string& name) override {
    fail("dist: a host-staged communicator cannot split (split the control plane for '", name, "')");
  }

 private:
  Comm& inner_;
  HostStaging s_;
};

}  // namespace

std::unique_ptr<Comm> host_staged_comm(Comm& inner, HostStaging staging) {
  return std::make_unique<StagedComm>(inner, std::move(staging));
}

}  // namespace wiola::dist
