// Every collective of the MPI communicator against a serial computation,
// split groups, a point-to-point ring and the grid's communicators.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dist/grid.h"
#include "dist/mpi_comm.h"
#ifdef WIOLA_HAVE_CUDA
#include "dist/nccl/nccl_comm.h"
#include "dist/nccl/nccl_lib.h"
#include "kernels/cuda/cuda_ops.h"
#endif
#include "dist/staged_comm.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "dist/tp_collectives.h"
#include "util/error.h"

using namespace wiola::dist;

namespace {

// Exactly representable values so sums are order-independent.
template <class T>
T val(int rank, size_t i) {
  return T((rank * 7 + int(i) * 3) % 23);
}

template <class T>
void check_all_reduce(Comm& c, ReduceOp op, bool in_place) {
  const size_t n = 37;
  std::vector<T> x(n), y(n, T(-1));
  for (size_t i = 0; i < n; ++i) x[i] = val<T>(c.rank(), i);
  if (in_place)
    c.all_reduce(x.data(), x.data(), n, dtype_of<T>(), op);
  else
    c.all_reduce(x.data(), y.data(), n, dtype_of<T>(), op);
  const std::vector<T>& got = in_place ? x : y;
  for (size_t i = 0; i < n; ++i) {
    T want = val<T>(0, i);
    for (int r = 1; r < c.size(); ++r)
      want = op == ReduceOp::Sum ? T(want + val<T>(r, i))
                                 : std::max(want, val<T>(r, i));
    ASSERT_EQ(got[i], want) << "element " << i;
  }
}

template <class T>
void check_reduce_scatter(Comm& c, bool in_place) {
  const size_t cnt = 5, p = size_t(c.size());
  std::vector<T> send(cnt * p), recv(cnt, T(-1));
  for (size_t i = 0; i < send.size(); ++i) send[i] = val<T>(c.rank(), i);
  const T* got;
  if (in_place) {
    T* mine = send.data() + size_t(c.rank()) * cnt;
    c.reduce_scatter_sum(send.data(), mine, cnt, dtype_of<T>());
    got = mine;
  } else {
    c.reduce_scatter_sum(send.data(), recv.data(), cnt, dtype_of<T>());
    got = recv.data();
  }
  for (size_t j = 0; j < cnt; ++j) {
    T want = 0;
    for (int r = 0; r < c.size(); ++r)
      want = T(want + val<T>(r, size_t(c.rank()) * cnt + j));
    ASSERT_EQ(got[j], want) << "element " << j;
  }
}

template <class T>
void check_all_gather(Comm& c, bool in_place) {
  const size_t cnt = 6, p = size_t(c.size());
  std::vector<T> send(cnt), recv(cnt * p, T(-1));
  for (size_t i = 0; i < cnt; ++i) send[i] = val<T>(c.rank(), i);
  if (in_place) {
    std::copy(send.begin(), send.end(), recv.begin() + c.rank() * cnt);
    c.all_gather(recv.data() + c.rank() * cnt, recv.data(), cnt, dtype_of<T>());
  } else {
    c.all_gather(send.data(), recv.data(), cnt, dtype_of<T>());
  }
  for (int r = 0; r < c.size(); ++r)
    for (size_t i = 0; i < cnt; ++i)
      ASSERT_EQ(recv[r * cnt + i], val<T>(r, i)) << "rank " << r << " elem " << i;
}

template <class T>
void check_broadcast(Comm& c) {
  for (int root = 0; root < c.size(); ++root) {
    std::vector<T> x(9);
    for (size_t i = 0; i < x.size(); ++i) x[i] = val<T>(c.rank(), i);
    c.broadcast(x.data(), x.size(), root);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], val<T>(root, i));
  }
}

template <class T>
void check_all(Comm& c) {
  for (bool ip : {false, true}) {
    check_all_reduce<T>(c, ReduceOp::Sum, ip);
    check_all_reduce<T>(c, ReduceOp::Max, ip);
    check_reduce_scatter<T>(c, ip);
    check_all_gather<T>(c, ip);
  }
  check_broadcast<T>(c);
}

}  // namespace

TEST(MpiComm, CollectivesAllTypes) {
  auto w = mpi_world_comm();
  EXPECT_EQ(w->name(), "world");
  check_all<float>(*w);
  check_all<double>(*w);
  check_all<int32_t>(*w);
  check_all<int64_t>(*w);
  check_all<uint8_t>(*w);
}

// bfloat16 (MPI has none: the communicator's own sum and max on the bits).
// Small integers, so every order of the sums is exact; plus one rounding.
TEST(MpiComm, Bf16SumAndMax) {
  auto w = mpi_world_comm();
  const int p = w->size(), r = w->rank();
  const size_t n = 37;
  auto bits = [](float f) { return wiola::bf16_round(f); };
  for (bool in_place : {false, true})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      std::vector<uint16_t> x(n), y(n, 0xFFFF);
      for (size_t i = 0; i < n; ++i) x[i] = bits(val<float>(r, i) - 11.0f);
      w->all_reduce(x.data(), in_place ? x.data() : y.data(), n, DType::BF16, op);
      const std::vector<uint16_t>& got = in_place ? x : y;
      for (size_t i = 0; i < n; ++i) {
        float want = val<float>(0, i) - 11.0f;
        for (int q = 1; q < p; ++q)
          want = op == ReduceOp::Sum ? want + (val<float>(q, i) - 11.0f) : std::max(want, val<float>(q, i) - 11.0f);
        ASSERT_EQ(got[i], bits(want)) << (op == ReduceOp::Sum ? "sum" : "max") << " element " << i;
      }
    }
  const size_t c = 5;
  std::vector<uint16_t> send(c * size_t(p)), recv(c);
  for (size_t i = 0; i < send.size(); ++i) send[i] = bits(val<float>(r, i));
  w->reduce_scatter_sum(send.data(), recv.data(), c, DType::BF16);
  for (size_t j = 0; j < c; ++j) {
    float want = 0;
    for (int q = 0; q < p; ++q) want += val<float>(q, size_t(r) * c + j);
    ASSERT_EQ(recv[j], bits(want)) << "reduce-scatter element " << j;
  }
  // A sum that rounds: 1 + 3·2^-9 lies 3/4 of the way from 1 to the next
  // bfloat16 (1 + 2^-7): rounded to nearest it is 1 + 2^-7 (truncation
  // would give 1).
  if (p == 2) {
    uint16_t a = bits(r == 0 ? 1.0f : 3.0f / 512.0f), got = 0;
    w->all_reduce(&a, &got, 1, DType::BF16, ReduceOp::Sum);
    EXPECT_EQ(got, bits(1.0f + 1.0f / 128.0f));
  }
}

TEST(MpiComm, ZeroCountAndBarrier) {
  auto w = mpi_world_comm();
  float dummy = 0;
  w->all_reduce(&dummy, &dummy, 0, DType::F32, ReduceOp::Sum);
  w->broadcast(&dummy, 0, DType::F32, 0);
  w->barrier();
  SUCCEED();
}

// Traffic as the scaling report counts it (dist/comm.cpp): payload and wire
// bytes per operation for p ranks; one rank puts nothing on the wire (the
// emulated NCCL run of the same contract found a one-rank broadcast counted).
TEST(MpiComm, TrafficCounts) {
  auto w = mpi_world_comm();
  const uint64_t p = uint64_t(w->size()), n = 8, b = n * sizeof(float);
  std::vector<float> x(n * p, 1.f), y(n * p, 0.f);
  w->all_reduce(x.data(), y.data(), n, DType::F32, ReduceOp::Sum);
  w->reduce_scatter_sum(x.data(), y.data(), n, DType::F32);
  w->all_gather(x.data(), y.data(), n, DType::F32);
  w->broadcast(x.data(), n, DType::F32, 0);
  w->barrier();
  const wiola::dist::CommTraffic& t = w->traffic();
  EXPECT_EQ(t.ops, 5u);
  EXPECT_EQ(t.payload_bytes, b + 2 * b * p + b);
  const uint64_t all_reduce_wire = p > 1 ? uint64_t(2.0 * double(p - 1) / double(p) * double(b)) : 0;
  const uint64_t broadcast_wire = p > 1 && w->rank() == 0 ? b : 0;
  EXPECT_EQ(t.wire_bytes, all_reduce_wire + 2 * (p - 1) * b + broadcast_wire);
}

TEST(MpiComm, NonBlockingOverlapOfSeveralCollectives) {
  auto w = mpi_world_comm();
  const size_t n = 1000;
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  std::vector<Request> reqs;
  reqs.push_back(w->iall_reduce(a.data(), a.data(), n, DType::F32, ReduceOp::Sum));
  reqs.push_back(w->iall_reduce(b.data(), b.data(), n, DType::F32, ReduceOp::Max));
  while (!reqs[0].test()) {
  }
  EXPECT_FALSE(reqs[0].pending());
  wait_all(reqs);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(a[i], float(w->size()));
    ASSERT_EQ(b[i], 2.0f);
  }
}

TEST(MpiComm, RingSendRecv) {
  auto w = mpi_world_comm();
  const int p = w->size(), r = w->rank();
  std::vector<int64_t> out(11), in(11, -1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = int64_t(r) * 1000 + int64_t(i);
  std::vector<Request> reqs;
  reqs.push_back(w->irecv(in.data(), in.size(), DType::I64, (r + p - 1) % p, 7));
  reqs.push_back(w->isend(out.data(), out.size(), DType::I64, (r + 1) % p, 7));
  wait_all(reqs);
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(in[i], int64_t((r + p - 1) % p) * 1000 + int64_t(i));
}

TEST(MpiComm, SplitGroups) {
  auto w = mpi_world_comm();
  // Even and odd ranks, ordered by descending world rank.
  auto g = w->split(w->rank() % 2, -w->rank(), "parity");
  EXPECT_EQ(g->name(), "parity");
  std::vector<int> members;
  for (int r = w->size() - 1; r >= 0; --r)
    if (r % 2 == w->rank() % 2) members.push_back(r);
  ASSERT_EQ(g->size(), int(members.size()));
  EXPECT_EQ(members[g->rank()], w->rank());
  std::vector<int32_t> got(members.size());
  const int32_t me = w->rank();
  g->all_gather(&me, got.data(), 1, DType::I32);
  for (size_t i = 0; i < members.size(); ++i) EXPECT_EQ(got[i], members[i]);
  check_all<float>(*g);
}

TEST(MpiComm, GridGroupsMatchArithmetic) {
  auto w = mpi_world_comm();
  const int W = w->size();
  for (int tp = 1; tp <= W; ++tp)
    for (int pp = 1; pp <= W; ++pp) {
      if (W % (tp * pp)) continue;
      const GridConfig cfg{tp, pp, W / (tp * pp)};
      Grid grid(cfg, *w);
      EXPECT_EQ(grid.coord(), grid_coord(cfg, w->rank()));
      for (GroupKind k : {GroupKind::Tp, GroupKind::Pp, GroupKind::Dp,
                          GroupKind::Embed, GroupKind::Mp, GroupKind::World}) {
        Comm& c = grid.group(k);
        const std::vector<int> want = group_ranks(cfg, w->rank(), k);
        std::vector<int32_t> got(size_t(c.size()));
        const int32_t me = w->rank();
        c.all_gather(&me, got.data(), 1, DType::I32);
        ASSERT_EQ(got.size(), want.size()) << group_name(k);
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_EQ(got[i], want[i]) << group_name(k) << " tp=" << tp
                                     << " pp=" << pp;
        if (k != GroupKind::World) { EXPECT_EQ(c.name(), group_name(k)); }
      }
    }
}

TEST(MpiComm, GridRejectsWrongWorldSize) {
  auto w = mpi_world_comm();
  const GridConfig bad{w->size() + 1, 1, 1};
  EXPECT_THROW(Grid(bad, *w), wiola::Error);
}

TEST(MpiComm, TpCollectivesAdapter) {
  auto w = mpi_world_comm();
  CommTpCollectives tp(*w);
  std::vector<double> x = {double(w->rank()), -double(w->rank())};
  tp.all_reduce_sum(x.data(), 2);
  const double s = w->size() * (w->size() - 1) / 2.0;
  EXPECT_EQ(x[0], s);
  EXPECT_EQ(x[1], -s);
  std::vector<float> y = {float(w->rank()), 0.5f};
  CommTpCollectives(*w).all_reduce_max(y.data(), 2);
  EXPECT_EQ(y[0], float(w->size() - 1));
  EXPECT_EQ(y[1], 0.5f);
  // Split sums: two in flight at once, finished out of order, one by its
  // destructor; a finished one finishes again as a no-op.
  std::vector<float> a(3, 1.0f), b(3, 2.0f);
  {
    wiola::TpInFlight sa = tp.start_sum(a.data(), a.size());
    wiola::TpInFlight sb = tp.start_sum(b.data(), b.size());
    sb.finish();
    sb.finish();
    EXPECT_EQ(b, std::vector<float>(3, 2.0f * float(w->size())));
    wiola::TpInFlight moved = std::move(sa);
    sa.finish();  // moved from: nothing to finish
  }
  EXPECT_EQ(a, std::vector<float>(3, float(w->size())));
  wiola::tp_start_sum(nullptr, a.data(), a.size()).finish();  // one TP rank: nothing to do
}

namespace {

// The data-plane contract: every collective and the point-to-point ring on
// `ops`'s buffers through `data` give exactly what MPI gives on host buffers
// through `w`, NCCL's in-place forms included.
void check_data_plane(Comm* w, wiola::Ops<float>* ops, Comm* data) {
  const int p = w->size(), r = w->rank();
  const size_t c = 5, n = c * size_t(p);
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = float(r + 1) * 0.5f + float(i);
  wiola::Buffer<float> dev(*ops, n);
  auto load = [&](const std::vector<float>& v) { ops->upload(dev.data(), v.data(), v.size() * sizeof(float)); };
  auto read = [&](size_t count, size_t off = 0) {
    std::vector<float> v(count);
    ops->download(v.data(), dev.data() + off, count * sizeof(float));
    return v;
  };
  // all-reduce (sum and max), in place
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
    load(host);
    std::vector<float> want = host;
    w->all_reduce(want.data(), want.size(), op);
    data->all_reduce(dev.data(), dev.data(), n, DType::F32, op);
    EXPECT_EQ(read(n), want);
  }
  // reduce-scatter, NCCL in place: recv = send + rank * c
  {
    load(host);
    std::vector<float> want = host;
    w->reduce_scatter_sum(want.data(), want.data() + size_t(r) * c, c, DType::F32);
    data->reduce_scatter_sum(dev.data(), dev.data() + size_t(r) * c, c, DType::F32);
    EXPECT_EQ(read(c, size_t(r) * c), std::vector<float>(want.begin() + long(r * c), want.begin() + long((r + 1) * c)));
  }
  // all-gather, in place: send = recv + rank * c
  {
    load(host);
    std::vector<float> want = host;
    w->all_gather(want.data() + size_t(r) * c, want.data(), c, DType::F32);
    data->all_gather(dev.data() + size_t(r) * c, dev.data(), c, DType::F32);
    EXPECT_EQ(read(n), want);
  }
  // broadcast from the last rank
  {
    load(host);
    std::vector<float> want = host;
    w->broadcast(want.data(), n, DType::F32, p - 1);
    data->broadcast(dev.data(), n, DType::F32, p - 1);
    EXPECT_EQ(read(n), want);
  }
  // ring: send to the next rank, receive from the previous one
  if (p > 1) {
    load(host);
    wiola::Buffer<float> in(*ops, n);
    Request s = data->isend(dev.data(), n, DType::F32, (r + 1) % p, 11);
    data->irecv(in.data(), n, DType::F32, (r + p - 1) % p, 11).wait();
    s.wait();
    std::vector<float> got(n), want(n);
    ops->download(got.data(), in.data(), n * sizeof(float));
    for (size_t i = 0; i < n; ++i) want[i] = float((r + p - 1) % p + 1) * 0.5f + float(i);
    EXPECT_EQ(got, want);
  }
}

}  // namespace

// The data plane for memory the host cannot touch (cpu-opaque): staged
// through host buffers.
TEST(MpiComm, HostStagedDataPlaneOverOpaqueMemory) {
  auto w = mpi_world_comm();
  auto ops = wiola::make_cpu_ops<float>(wiola::CpuMemory::Opaque);
  ASSERT_FALSE(ops->host_accessible());
  const auto make = data_plane_for(*ops);
  ASSERT_TRUE(bool(make));
  auto data = make(*w);
  check_data_plane(w.get(), ops.get(), data.get());
}

// The same contract on NCCL, one GPU per rank (the device at the local rank,
// as wiola train picks it), with the point-to-point lanes. Runs on a node
// with a GPU for every rank (tests/gpu/multi_gpu.sh); every rank skips,
// together, anywhere else.
TEST(MpiComm, NcclDataPlaneMatchesMpi) {
  auto w = mpi_world_comm();
#ifdef WIOLA_HAVE_CUDA
  const int local = std::max(0, wiola::launcher_local_rank());
  const int unusable = local < wiola::cuda_device_count() && nccl_available() ? 0 : 1;
  if (w->all_reduce_value(unusable, ReduceOp::Max) != 0)
    GTEST_SKIP() << "needs a GPU per rank and libnccl.so.2 on every rank (" << wiola::cuda_status() << ")";
  auto ops = wiola::make_cuda_ops(wiola::CudaPrecision::FP32, local);
  NcclOptions o;
  o.compute_stream = wiola::cuda_stream_of(*ops);
  o.p2p = true;
  auto data = nccl_comm(*w, std::move(o));
  check_data_plane(w.get(), ops.get(), data.get());
#else
  GTEST_SKIP() << "built without CUDA (WIOLA_CUDA=OFF)";
#endif
}
