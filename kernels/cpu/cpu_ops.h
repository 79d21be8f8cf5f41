// The CPU backend of the op interface (kernels/ops.h): OpenBLAS for the
// matrix products, OpenMP loops for everything else, float (training) and
// double (gradient checks). The op bodies live in one file per family, as
// free functions in wiola::cpu on host pointers (kernels/cpu/kernels.h);
// this class checks each typed pointer's dtype and forwards (every op of
// kernels/op_list.h but memory and BLAS is made from the list).
//
// Memory: host memory, or (CpuMemory::Opaque, the "cpu-opaque" debug
// backend) memory the host cannot touch outside these functions; see
// kernels/cpu/opaque_memory.h. Every function below opens it for its
// duration.
//
// Threading: static OpenMP schedules over rows/tokens; every reduction is
// combined in a fixed order, so results repeat exactly for a fixed
// OMP_NUM_THREADS.
#pragma once

#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/opaque_memory.h"
#include "kernels/ops.h"

namespace wiola {

// One matrix product as the backend was asked for it (C[m x n] = op(A) op(B),
// inner dimension k).
struct GemmShape {
  Trans ta, tb;
  int m, n, k;
};

template <class T>
class CpuOps final : public Ops<T> {
 public:
  // While set, every gemm call appends its shape here (wiola bench step
  // replays one step's shapes to measure the BLAS rate on exactly them);
  // null stops recording.
  void record_gemm_shapes(std::vector<GemmShape>* log) { gemm_log_ = log; }

  explicit CpuOps(CpuMemory memory = CpuMemory::Host);
  ~CpuOps() override;
  const char* name() const override;
  void* alloc_bytes(size_t bytes) override;
  void free_bytes(void* p) override;
  bool host_accessible() const override;
  Precision precision() const override;
  // Every op of kernels/op_list.h: memory and BLAS here (cpu_ops.cpp), the
  // others cpu::NAME of the same arguments on host pointers
  // (kernels/cpu/kernels.h, kernels/cpu/attention.h).
#define WIOLA_OP(name, cls, params, args) void name params override;
#include "kernels/op_list.h"

 private:
  std::unique_ptr<cpu::OpaqueMemory> mem_;  // null: host memory
  std::vector<GemmShape>* gemm_log_ = nullptr;
  cpu::OpaqueMemory* opaque() { return mem_.get(); }
};

extern template class CpuOps<float>;
extern template class CpuOps<double>;

}  // namespace wiola
