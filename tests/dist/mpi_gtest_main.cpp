// GoogleTest main for MPI tests: MPI up, rank 0 prints the usual report,
// other ranks print only their failures (prefixed with the rank), and the
// exit status is the MAX over ranks so every rank agrees.
#include <gtest/gtest.h>

#include <cstdio>

#include "dist/diagnostics.h"
#include "dist/mpi_comm.h"

namespace {
class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  wiola::dist::MpiRuntime mpi(&argc, &argv);
  // A test that breaks collective order ends the job instead of hanging.
  wiola::dist::set_comm_timeout(30.0);
  testing::InitGoogleTest(&argc, argv);
  if (mpi.world_rank() != 0) {
    auto& ls = testing::UnitTest::GetInstance()->listeners();
    delete ls.Release(ls.default_result_printer());
    ls.Append(new FailurePrinter(mpi.world_rank()));
  }
  int rc = RUN_ALL_TESTS();
  auto world = wiola::dist::mpi_world_comm();
  rc = world->all_reduce_value(rc, wiola::dist::ReduceOp::Max);
  return rc;
}
