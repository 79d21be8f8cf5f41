// CudaOps: the CUDA backend (kernels/cuda/cuda_ops.h). One stream per
// backend; cuBLAS (GemmEx, fp32 compute: no TF32) for the matrix products,
// or cuBLASLt per the backend option gemm (gemm_tuner.cuh);
// the other ops forward to the launchers of kernels/cuda/*.cu. Memory comes
// from the caching allocator; host transfers synchronise the stream, so a
// value the host reads is complete.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublas_lib.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm_tuner.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/memory.cuh"
#include "kernels/profiled_ops.h"
#include "util/error.h"

namespace wiola {
namespace {

using cuda::check;

void check_blas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error in ", what, ": ", cuda::cublas().status_string(st));
}

cudaDataType blas_type(DType t, const char* op) {
  if (t == DType::F32) return CUDA_R_32F;
  if (t == DType::BF16) return CUDA_R_16BF;
  cuda::unsupported_dtype(t, op);
}

cublasOperation_t blas_op(Trans t) { return t == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

// Elements spanned by a row-major operand whose op() is rows x cols.
size_t span(Trans t, int rows, int cols, int ld) {
  const int r = t == Trans::N ? rows : cols, c = t == Trans::N ? cols : rows;
  return r > 0 && c > 0 ? size_t(r - 1) * size_t(ld) + size_t(c) : 0;
}

// Profiling marks (kernels/profiled_ops.h): events recorded on the backend's
// stream, so an op's time is its time on the device, not its launch's.
// Events are kept and re-recorded after clear().
class CudaTimeline final : public OpTimeline {
 public:
  explicit CudaTimeline(cudaStream_t stream) : stream_(stream) {}
  ~CudaTimeline() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  int mark() override {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreate(&e), "profile event");
      events_.push_back(e);
    }
    check(cudaEventRecord(events_[used_], stream_), "profile event");
    return int(used_++);
  }
  double seconds(int from, int to) override {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, events_[size_t(from)], events_[size_t(to)]), "profile event time");
    return 1e-3 * ms;
  }
  void clear() override { used_ = 0; }

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

class CudaOps final : public Ops<float> {
 public:
  using T = float;  // the op list's compute type
  CudaOps(CudaPrecision p, int device, const BackendOptions& options) : prec_(p), device_(device) {
    set_options(options);
    WIOLA_CHECK(cuda_device_count() > 0, "cuda backend: ", cuda_status());
    WIOLA_CHECK(device >= 0 && device < cuda_device_count(), "cuda backend: device ", device, " of ",
                cuda_device_count());
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_blas(cuda::cublas().create(&blas_), "cublasCreate");
    check_blas(cuda::cublas().set_stream(blas_, stream_), "cublasSetStream");
    check_blas(cuda::cublas().set_math_mode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    tuner_ = std::make_unique<cuda::GemmTuner>(mem_, stream_, blas_, device);
    tuner_->set_mode(options.gemm);
    cuda::install_nvtx_ranges();
  }
  ~CudaOps() override {
    cudaStreamSynchronize(stream_);
    drop_graphs();
    tuner_.reset();  // its workspace goes back to the allocator
    cuda::cublas().destroy(blas_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return prec_ == CudaPrecision::BF16 ? "cuda-bf16" : "cuda-fp32"; }
  std::string device_name() const override {
    cudaDeviceProp prop{};
    return cudaGetDeviceProperties(&prop, device_) == cudaSuccess ? std::string(prop.name) : "CUDA device";
  }
  size_t peak_bytes() const override { return mem_.peak(); }
  void* device_stream() const override { return static_cast<void*>(stream_); }
  std::string device_identity() const override {
    cudaDeviceProp p{};
    cuda::check(cudaGetDeviceProperties(&p, device_), "cudaGetDeviceProperties");
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    char id[320];
    std::snprintf(id, sizeof id, "%s/%04x:%02x:%02x", host, unsigned(p.pciDomainID), unsigned(p.pciBusID),
                  unsigned(p.pciDeviceID));
    return id;
  }

  // ---- memory ----
  void* alloc_bytes(size_t bytes) override { return mem_.alloc(bytes, "a backend buffer"); }
  void free_bytes(void* p) override { mem_.free(p); }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
    check(cudaStreamSynchronize(stream_), "upload");
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
    check(cudaStreamSynchronize(stream_), "download");
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes && dst != src) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
  }
  void zero(void* p, size_t bytes) override {
    if (bytes) check(cudaMemsetAsync(p, 0, bytes, stream_), "zero");
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "synchronize"); }
  std::unique_ptr<OpTimeline> make_timeline() override { return std::make_unique<CudaTimeline>(stream_); }
  bool host_accessible() const override { return false; }
  Precision precision() const override {
    if (prec_ == CudaPrecision::BF16) return {DType::BF16, DType::F32, DType::BF16, true};
    return {DType::F32, DType::F32, DType::F32, false};
  }
  void convert(CPtr src, Ptr dst, size_t n) override { cuda::convert(ctx(), src, dst, n); }
  void copy_block(Ptr dst, int ld_dst, CPtr src, int ld_src, int rows, int cols) override {
    if (rows <= 0 || cols <= 0) return;
    WIOLA_CHECK(dst.dtype() == src.dtype(), "cuda copy_block: ", dtype_name(src.dtype()), " into ",
                dtype_name(dst.dtype()));
    WIOLA_CHECK(ld_dst >= cols && ld_src >= cols, "cuda copy_block: ", cols, " columns in rows of ", ld_dst, " and ",
                ld_src);
    const size_t es = dtype_bytes(src.dtype());
    check(cudaMemcpy2DAsync(dst.raw(), size_t(ld_dst) * es, src.raw(), size_t(ld_src) * es, size_t(cols) * es,
                            size_t(rows), cudaMemcpyDeviceToDevice, stream_),
          "copy_block");
  }

  // ---- BLAS ----
  void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, CPtr A, int lda, CPtr B, int ldb, float beta, Ptr C,
            int ldc) override {
    if (m <= 0 || n <= 0) return;
    // cuBLAS wants A and B of one type: an fp32 operand next to a bf16 one
    // (the fp32 GCLA summaries times a bf16 weight) is rounded to bf16 first.
    std::unique_ptr<cuda::DeviceTemp> ta_tmp, tb_tmp;
    if (A.dtype() != B.dtype()) {
      auto down = [&](CPtr x, size_t count, std::unique_ptr<cuda::DeviceTemp>& t) {
        t = std::make_unique<cuda::DeviceTemp>(mem_, count * 2, "gemm operand in bf16");
        const Ptr dst(t->as<void>(), DType::BF16);
        cuda::convert(ctx(), x, dst, count);
        return CPtr(dst);
      };
      if (A.dtype() == DType::F32) A = down(A, span(ta, m, k, lda), ta_tmp);
      else B = down(B, span(tb, k, n, ldb), tb_tmp);
    }
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T; the
    // backend option gemm picks the algorithm (gemm_tuner.cuh).
    tuner_->gemm({blas_op(tb), blas_op(ta), n, m, k, alpha, B.raw(), blas_type(B.dtype(), "gemm"), ldb, A.raw(),
                  blas_type(A.dtype(), "gemm"), lda, beta, C.raw(), blas_type(C.dtype(), "gemm"), ldc},
                 GemmKey{m, n, k, ta == Trans::T, tb == Trans::T, lda, ldb, ldc, A.dtype(), C.dtype(), beta == 0.f});
  }
  std::string gemm_tuning() const override { return tuner_->table(); }
  void adopt_gemm_tuning(const std::string& table_json) override {
    tuner_->adopt(table_json, "the tuning table adopted");
    if (options_.gemm == GemmMode::Auto) drop_graphs();  // recordings name the algorithms chosen before
  }

  // ---- CUDA Graphs (Ops::graph; the option cuda_graphs; docs/gpu.md) ----
  // A key's first call runs body op by op: the GEMM tuner meets its shapes
  // (its sweeps read back timings and products, which a capture forbids) and
  // the allocator its sizes. The second records body with stream capture
  // (relaxed mode: a temporary the allocator lacks may still be cudaMalloc'd,
  // into the graphs' pool), instantiates it and launches it; later calls
  // launch it. While recording, a nested call is part of the recording.
  void graph(const GraphKey& key, const std::function<void()>& body) override {
    if (options_.cuda_graphs == CudaGraphs::Off || capturing_) {
      body();
      return;
    }
    std::vector<uint64_t> k{uint64_t(reinterpret_cast<uintptr_t>(key.owner))};
    k.insert(k.end(), key.words.begin(), key.words.end());
    Graph& g = graphs_[k];
    if (!g.exec) {
      if (g.calls++ == 0) {
        body();
        return;
      }
      capture(g, body);
    }
    check(cudaGraphLaunch(g.exec, stream_), "cudaGraphLaunch");
    ++graph_stats_.launches;
  }
  void forget_graphs(const void* owner) override {
    const uint64_t o = uint64_t(reinterpret_cast<uintptr_t>(owner));
    for (auto it = graphs_.begin(); it != graphs_.end();) {
      if (it->first.front() != o) {
        ++it;
        continue;
      }
      if (it->second.exec) cudaGraphExecDestroy(it->second.exec);
      it = graphs_.erase(it);
    }
    if (graphs_.empty()) mem_.release_graph_pool();
  }
  CudaGraphStats graph_stats() const {
    CudaGraphStats s = graph_stats_;
    s.recordings = 0;
    for (const auto& [k, g] : graphs_) s.recordings += g.exec != nullptr;
    s.pool_bytes = mem_.graph_pool_bytes();
    return s;
  }
  void gemm_strided_batched(Trans ta, Trans tb, int m, int n, int k, float alpha, CPtr A, int lda, long sA, CPtr B,
                            int ldb, long sB, float beta, Ptr C, int ldc, long sC, int batch) override {
    if (m <= 0 || n <= 0 || batch <= 0) return;
    WIOLA_CHECK(A.dtype() == B.dtype(), "cuda gemm_strided_batched: operands of ", dtype_name(A.dtype()), " and ",
                dtype_name(B.dtype()));
    check_blas(cuda::cublas().gemm_strided_batched_ex(
                   blas_, blas_op(tb), blas_op(ta), n, m, k, &alpha, B.raw(), blas_type(B.dtype(), "gemm"), ldb, sB,
                   A.raw(), blas_type(A.dtype(), "gemm"), lda, sA, &beta, C.raw(), blas_type(C.dtype(), "gemm"), ldc,
                   sC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "gemm_strided_batched");
  }

  // ---- every other op of kernels/op_list.h: its launcher cuda::NAME (kernels.cuh) ----
#define WIOLA_BACKEND_OP(name, cls, params, args)
#define WIOLA_OP(name, cls, params, args) \
  void name params override { cuda::name(ctx(), WIOLA_OP_ARGS args); }
#include "kernels/op_list.h"

  // Takes the options (kernels/backend_options.h); refuses the
  // environment variables they replaced.
  void set_options(const BackendOptions& o) {
    refuse_backend_env();
    if (tuner_) tuner_->set_mode(o.gemm);
    drop_graphs();  // recordings name the kernels the options chose
    options_ = o;
  }

 private:
  struct Graph {
    int calls = 0;                   // before its recording
    cudaGraphExec_t exec = nullptr;  // the recording, once made
  };
  void capture(Graph& g, const std::function<void()>& body) {
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
    capturing_ = true;
    mem_.begin_capture();
    std::string failure;
    try {
      body();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    mem_.end_capture();
    capturing_ = false;
    if (e != cudaSuccess || !failure.empty()) {
      if (graph) cudaGraphDestroy(graph);
      const std::string why = e != cudaSuccess ? std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"
                                               : std::string("the capture itself succeeded");
      cudaGetLastError();
      fail("CUDA Graph capture (train.cuda_graphs = layers) failed: ", failure.empty() ? "" : failure + "; ",
           "cudaStreamEndCapture: ", why,
           ". The ops of a recorded segment must not synchronise with the host or copy to or from it "
           "(docs/gpu.md, CUDA Graphs)");
    }
    size_t nodes = 0;
    check(cudaGraphGetNodes(graph, nullptr, &nodes), "cudaGraphGetNodes");
    const cudaError_t ie = cudaGraphInstantiate(&g.exec, graph, 0);
    cudaGraphDestroy(graph);
    check(ie, "cudaGraphInstantiate");
    ++graph_stats_.captures;
    graph_stats_.nodes += nodes;
  }
  void drop_graphs() {
    for (auto& [k, g] : graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
    mem_.release_graph_pool();
  }

  cuda::Ctx ctx() {
    const BackendOptions& o = options_;
    return cuda::Ctx{stream_,
                     mem_,
                     o.attention,
                     o.attention_bwd,
                     o.attention_tile,
                     o.attention_bwd_tile,
                     heads_per_block(o.attention_heads_per_block)};
  }

  CudaPrecision prec_;
  int device_;
  BackendOptions options_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<cuda::GemmTuner> tuner_;         // the GEMMs' algorithms (options_.gemm)
  std::map<std::vector<uint64_t>, Graph> graphs_;  // by owner and key words
  bool capturing_ = false;
  CudaGraphStats graph_stats_;
  cuda::CachingAllocator mem_;  // declared last: destroyed first, while the context lives
};

}  // namespace

std::unique_ptr<Ops<float>> make_cuda_ops(CudaPrecision precision, int device, const BackendOptions& options) {
  return std::make_unique<CudaOps>(precision, device, options);
}

namespace {
CudaOps* cuda_ops_of(Ops<float>& ops) {
  // A profiled backend (kernels/profiled_ops.h) wraps the CUDA one.
  if (auto* p = dynamic_cast<ProfiledOps<float>*>(&ops)) return cuda_ops_of(p->inner());
  return dynamic_cast<CudaOps*>(&ops);
}
}  // namespace

std::string cuda_device_identity(Ops<float>& ops) {
  const CudaOps* c = cuda_ops_of(ops);
  return c ? c->device_identity() : "";
}

void set_cuda_backend_options(Ops<float>& ops, const BackendOptions& options) {
  if (CudaOps* c = cuda_ops_of(ops)) c->set_options(options);
}

CudaGraphStats cuda_graph_stats(Ops<float>& ops) {
  const CudaOps* c = cuda_ops_of(ops);
  return c ? c->graph_stats() : CudaGraphStats{};
}

void* cuda_stream_of(Ops<float>& ops) {
  CudaOps* c = cuda_ops_of(ops);
  return c ? c->device_stream() : nullptr;
}

}  // namespace wiola
