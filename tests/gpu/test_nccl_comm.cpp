// The NCCL data plane on one GPU (ctest label "gpu"): the communicator
// contract of dist/comm.h on single-rank NCCL communicators (NCCL refuses two
// ranks on one device; the multi-rank logic is the MPI equivalence tests'
// and tests/gpu/multi_gpu.sh's), ordering against the backend's stream
// without host waits, traffic and exposed-time accounting, and the errors.
// Without a GPU or libnccl.so.2 every test is SKIPPED with the reason.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "dist/nccl/nccl_comm.h"
#include "dist/nccl/nccl_lib.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/profiled_ops.h"
#include "kernels/ops.h"
#include "util/error.h"

namespace wiola {
namespace {

#define REQUIRE_GPU_AND_NCCL()                                                       \
  do {                                                                               \
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_status();                     \
    if (!dist::nccl_available()) GTEST_SKIP() << "libnccl.so.2 does not load here"; \
  } while (0)

// A one-rank control plane in host memory (the kit has no MPI).
class SelfComm final : public dist::Comm {
 public:
  explicit SelfComm(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  dist::Request iall_reduce(const void* s, void* r, size_t n, DType t, dist::ReduceOp) override {
    if (s != r) std::memmove(r, s, n * dtype_bytes(t));
    return {};
  }
  dist::Request ireduce_scatter_sum(const void* s, void* r, size_t n, DType t) override {
    return iall_reduce(s, r, n, t, dist::ReduceOp::Sum);
  }
  dist::Request iall_gather(const void* s, void* r, size_t n, DType t) override {
    return iall_reduce(s, r, n, t, dist::ReduceOp::Sum);
  }
  dist::Request ibroadcast(void*, size_t, DType, int) override { return {}; }
  dist::Request ibarrier() override { return {}; }
  dist::Request isend(const void*, size_t, DType, int, int) override { fail("SelfComm: no peers"); }
  dist::Request irecv(void*, size_t, DType, int, int) override { fail("SelfComm: no peers"); }
  std::unique_ptr<Comm> split(int, int, const std::string& n) override { return std::make_unique<SelfComm>(n); }

 private:
  std::string name_;
};

struct Fixture {
  std::unique_ptr<Ops<float>> ops = make_cuda_ops(CudaPrecision::FP32);
  SelfComm ctrl{"dp"};
  std::unique_ptr<dist::Comm> comm;
  Fixture() {
    dist::NcclOptions o;
    o.compute_stream = cuda_stream_of(*ops);
    comm = dist::nccl_comm(ctrl, std::move(o));
  }
  float* dev(const std::vector<float>& h) {
    bufs.emplace_back(*ops, h.size());
    ops->upload(bufs.back().data(), h.data(), h.size() * sizeof(float));
    return bufs.back().data();
  }
  std::vector<float> host(const float* p, size_t n) {
    std::vector<float> h(n);
    ops->download(h.data(), p, n * sizeof(float));  // orders after the compute stream
    return h;
  }
  ~Fixture() { ops->synchronize(); }  // before the buffers go
  std::vector<Buffer<float>> bufs;
};

TEST(NcclComm, CollectivesFollowTheContractOnOneRank) {
  REQUIRE_GPU_AND_NCCL();
  Fixture f;
  const std::vector<float> x = {1.5f, -2.f, 3.25f, 0.f, 7.f};
  float* a = f.dev(x);
  float* b = f.dev(std::vector<float>(x.size(), -1.f));
  EXPECT_EQ(f.comm->rank(), 0);
  EXPECT_EQ(f.comm->size(), 1);
  EXPECT_EQ(f.comm->name(), "dp");

  f.comm->all_reduce(a, b, x.size(), DType::F32, dist::ReduceOp::Sum);  // out of place
  EXPECT_EQ(f.host(b, x.size()), x);
  f.comm->all_reduce(a, a, x.size(), DType::F32, dist::ReduceOp::Max);  // in place
  EXPECT_EQ(f.host(a, x.size()), x);
  f.comm->reduce_scatter_sum(a, b, x.size(), DType::F32);  // one rank: its chunk is all
  EXPECT_EQ(f.host(b, x.size()), x);
  f.comm->all_gather(a, b, x.size(), DType::F32);
  EXPECT_EQ(f.host(b, x.size()), x);
  f.comm->broadcast(a, x.size(), DType::F32, 0);
  EXPECT_EQ(f.host(a, x.size()), x);
  f.comm->barrier();

  const dist::CommTraffic& t = f.comm->traffic();
  EXPECT_EQ(t.ops, 6u);  // the barrier counts as an operation of no bytes
  EXPECT_EQ(t.wire_bytes, 0u);  // one rank sends nothing
  EXPECT_EQ(t.payload_bytes, 5u * x.size() * sizeof(float));
}

// Compute, communicate, compute: the collective sees the first op's result
// and the second op sees the collective's, with no host wait in between.
TEST(NcclComm, OrderedAgainstTheComputeStream) {
  REQUIRE_GPU_AND_NCCL();
  Fixture f;
  const size_t n = size_t(1) << 22;  // long enough that a missing order shows
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = float(i % 1000);
  float* a = f.dev(h);
  float* b = f.dev(std::vector<float>(n, 0.f));
  f.ops->scale(a, 2.f, n);                                  // a = 2h
  dist::Request r = f.comm->iall_reduce(a, b, n, DType::F32, dist::ReduceOp::Sum);
  r.wait();                                                 // the stream waits, not the host
  f.ops->add(b, b, b, n);                                   // b = 4h
  const std::vector<float> got = f.host(b, n);
  for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(got[i], 4.f * h[i]) << i;
  f.comm->settle_traffic();
  EXPECT_GE(f.comm->traffic().wait_s, 0.0);
  EXPECT_TRUE(r.test());
}

TEST(NcclComm, ErrorsNameWhatIsWrong) {
  REQUIRE_GPU_AND_NCCL();
  Fixture f;
  float* a = f.dev({1.f});
  try {
    (void)f.comm->isend(a, 1, DType::F32, 0, 0);
    FAIL() << "isend to itself must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not another rank of group 'dp'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f.comm->split(0, 0, "x"), Error);
  EXPECT_THROW(f.comm->broadcast(a, 1, DType::F32, 3), Error);
}

// The factory gives the pipeline group its point-to-point lanes; a one-rank
// group needs none, and every group reduces through NCCL.
TEST(NcclComm, DataPlaneFactory) {
  REQUIRE_GPU_AND_NCCL();
  auto ops = make_cuda_ops(CudaPrecision::FP32);
  SelfComm pp("pp");
  auto plane = dist::nccl_data_plane(cuda_stream_of(*ops));
  auto c = plane(pp);
  EXPECT_EQ(c->name(), "pp");
  Buffer<float> a(*ops, 1);
  const float one = 1.f;
  ops->upload(a.data(), &one, sizeof one);
  c->all_reduce(a.data(), a.data(), 1, DType::F32, dist::ReduceOp::Sum);
  float got = 0;
  ops->download(&got, a.data(), sizeof got);
  EXPECT_EQ(got, 1.f);
  EXPECT_EQ(cuda_stream_of(*make_backend<float>("cpu")), nullptr);
  ProfiledOps<float> profiled(*ops);  // a profiled backend keeps its stream
  EXPECT_NE(cuda_stream_of(profiled), nullptr);
  EXPECT_EQ(cuda_stream_of(profiled), cuda_stream_of(*ops));
  // The backend-neutral hooks the trainer's data-plane choice asks
  // (train/data_plane.cpp): the same stream, and a device identity that a
  // second backend on the same device shares; none on the CPU.
  EXPECT_EQ(ops->device_stream(), cuda_stream_of(*ops));
  EXPECT_EQ(profiled.device_stream(), cuda_stream_of(*ops));
  EXPECT_EQ(make_backend<float>("cpu")->device_stream(), nullptr);
  EXPECT_EQ(make_backend<float>("cpu")->device_identity(), "");
  EXPECT_FALSE(ops->device_identity().empty());
  EXPECT_EQ(ops->device_identity(), cuda_device_identity(*ops));
  EXPECT_EQ(profiled.device_identity(), ops->device_identity());
  EXPECT_EQ(make_cuda_ops(CudaPrecision::FP32)->device_identity(), ops->device_identity());
}

}  // namespace
}  // namespace wiola
