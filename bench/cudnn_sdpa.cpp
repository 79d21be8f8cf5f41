// cuDNN's SDPA through the cuDNN frontend's graph API: see cudnn_sdpa.h.
// The frontend is compiled in its dynamic loading mode
// (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, set by bench/CMakeLists.txt): every
// cuDNN call goes through dlsym on cudnn_frontend::cudnn_dlhandle, which this
// file sets from libcudnn.so.9 opened by SONAME (util/shared_lib.h); the CUDA
// runtime calls the frontend makes itself go to a libcudart.so.13 it opens.
#include "bench/cudnn_sdpa.h"

#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <unordered_map>
#include <vector>

#include "util/shared_lib.h"

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // the frontend's handle of libcudnn (its shim looks every symbol up in it)
}  // namespace cudnn_frontend

namespace wiola::bench {
namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

constexpr const char* kSoname = "libcudnn.so.9";

// The library, opened once; its version or why it could not be opened.
struct Loaded {
  std::string version, error;
};
const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    try {
      // The frontend opens a CUDA runtime of its own for its few runtime
      // calls (libcudart.so.12, else .13; with both, .12 and a warning):
      // the major version this build compiled against, unless chosen.
      setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", ("libcudart.so." + std::to_string(CUDART_VERSION / 1000)).c_str(), 0);
      static const SharedLib lib(kSoname, "cuDNN reference",
                                 "put cuDNN 9 on LD_LIBRARY_PATH (the CUDA toolkit's lib64, or PyTorch's "
                                 "nvidia/cudnn/lib)");
      fe::cudnn_dlhandle = lib.handle();
      const size_t v = fe::detail::get_backend_version();  // cudnnGetVersion: 91300 for 9.13.0
      r.version = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    return r;
  }();
  return l;
}

// A frontend error: CudnnUnavailable while the graph is being built (this
// cuDNN or card cannot run it), std::runtime_error when it fails to run.
void check(fe::error_t e, const char* what, bool building) {
  if (e.is_good()) return;
  const std::string msg = std::string("cuDNN SDPA: ") + what + ": " + e.get_message();
  if (building) throw CudnnUnavailable(msg);
  throw std::runtime_error(msg);
}

// wiola's layout as cuDNN's [batch, heads, sequence, head dim] dimensions.
std::vector<int64_t> dims(const SdpaShape& s, int heads) { return {s.B, heads, s.T, s.dh}; }
std::vector<int64_t> strides(const SdpaShape& s, int heads) {
  const int64_t row = int64_t(heads) * s.dh;  // [B, T, heads, dh]: a token's row holds every head
  return {int64_t(s.T) * row, s.dh, row, 1};
}

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv };

TensorPtr input(Graph& g, const char* name, Uid uid, const SdpaShape& s, int heads) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims(s, heads)).set_stride(
      strides(s, heads)));
}
void output(const TensorPtr& t, Uid uid, const SdpaShape& s, int heads) {
  t->set_output(true).set_uid(uid).set_dim(dims(s, heads)).set_stride(strides(s, heads));
}
std::vector<int64_t> stats_dims(const SdpaShape& s) { return {s.B, s.H, s.T, 1}; }
std::vector<int64_t> stats_strides(const SdpaShape& s) { return {int64_t(s.H) * s.T, s.T, 1, 1}; }

// sm_version > 0: validated for that compute capability without asking a
// device (each node copies the graph's context when it is added).
std::shared_ptr<Graph> new_graph(int sm_version) {
  auto g = std::make_shared<Graph>();
  if (sm_version > 0) g->set_sm_version(sm_version);
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// The forward graph: O and the statistics (log-sum-exp) that the backward
// reads, from Q, K, V.
std::shared_ptr<Graph> fwd_graph(const SdpaShape& s, int sm_version = 0) {
  auto gp = new_graph(sm_version);
  Graph& g = *gp;
  auto q = input(g, "Q", kQ, s, s.H), k = input(g, "K", kK, s, s.Hkv), v = input(g, "V", kV, s, s.Hkv);
  auto opt = fe::graph::SDPA_attributes()
                 .set_name("sdpa_fwd")
                 .set_generate_stats(true)
                 .set_causal_mask(true)
                 .set_attn_scale(float(1.0 / std::sqrt(double(s.dh))));
  auto [o, stats] = g.sdpa(q, k, v, opt);
  output(o, kO, s, s.H);
  stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dims(s)).set_stride(
      stats_strides(s));
  return gp;
}

// The backward graph: dQ, dK, dV (the KV heads' gradients summed over their
// query heads) from Q, K, V, O, dO and the statistics.
std::shared_ptr<Graph> bwd_graph(const SdpaShape& s, int sm_version = 0) {
  auto gp = new_graph(sm_version);
  Graph& g = *gp;
  auto q = input(g, "Q", kQ, s, s.H), k = input(g, "K", kK, s, s.Hkv), v = input(g, "V", kV, s, s.Hkv);
  auto o = input(g, "O", kO, s, s.H), dout = input(g, "dO", kDout, s, s.H);
  auto stats = g.tensor(fe::graph::Tensor_attributes()
                            .set_name("Stats")
                            .set_uid(kStats)
                            .set_dim(stats_dims(s))
                            .set_stride(stats_strides(s))
                            .set_data_type(fe::DataType_t::FLOAT));
  auto opt = fe::graph::SDPA_backward_attributes().set_name("sdpa_bwd").set_causal_mask(true).set_attn_scale(
      float(1.0 / std::sqrt(double(s.dh))));
  auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, dout, stats, opt);
  output(dq, kDq, s, s.H);
  output(dk, kDk, s, s.Hkv);
  output(dv, kDv, s, s.Hkv);
  return gp;
}

void check_shape(const SdpaShape& s) {
  if (s.B < 1 || s.T < 1 || s.H < 1 || s.Hkv < 1 || s.dh < 1 || s.H % s.Hkv)
    throw std::runtime_error("cuDNN SDPA: bad shape");
}

// Validation, the operation graph, the heuristics' plans (A, then the
// fallback list), support, the chosen plan built.
void build(Graph& g, cudnnHandle_t handle) {
  check(g.validate(), "validate", true);
  check(g.build_operation_graph(handle), "build_operation_graph", true);
  check(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans", true);
  check(g.check_support(), "check_support", true);
  check(g.build_plans(), "build_plans", true);
}

std::string plan_name(const Graph& g) {
  std::string name;
  return g.get_plan_name(name).is_good() ? name : "?";
}

}  // namespace

std::string cudnn_version() {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw CudnnUnavailable(l.error);
  return l.version;
}

void cudnn_sdpa_validate(const SdpaShape& s, int sm_version) {
  cudnn_version();
  check_shape(s);
  for (const auto& g : {fwd_graph(s, sm_version), bwd_graph(s, sm_version)}) check(g->validate(), "validate", true);
}

struct CudnnSdpa::Impl {
  SdpaShape s;
  cudnnHandle_t handle = nullptr;
  std::shared_ptr<Graph> fwd, bwd;
  int64_t ws_fwd = 0, ws_bwd = 0;

  ~Impl() {
    if (handle) (void)fe::detail::destroy_handle(handle);
  }
  void run(const Graph& g, std::unordered_map<int64_t, void*>& pack, void* workspace, const char* what) const {
    check(g.execute(handle, pack, workspace), what, false);
  }
};

CudnnSdpa::CudnnSdpa(const SdpaShape& s, void* stream) : impl_(std::make_unique<Impl>()) {
  cudnn_version();  // loaded, or CudnnUnavailable
  check_shape(s);
  Impl& m = *impl_;
  m.s = s;
  try {
    if (const cudnnStatus_t st = fe::detail::create_handle(&m.handle); st != CUDNN_STATUS_SUCCESS) {
      m.handle = nullptr;
      throw CudnnUnavailable(std::string("cuDNN SDPA: cudnnCreate: ") + fe::detail::get_error_string(st));
    }
    if (const cudnnStatus_t st = fe::detail::set_stream(m.handle, static_cast<cudaStream_t>(stream));
        st != CUDNN_STATUS_SUCCESS)
      throw CudnnUnavailable(std::string("cuDNN SDPA: cudnnSetStream: ") + fe::detail::get_error_string(st));
    m.fwd = fwd_graph(s);
    build(*m.fwd, m.handle);
    check(m.fwd->get_workspace_size(m.ws_fwd), "forward workspace", true);
    m.bwd = bwd_graph(s);
    build(*m.bwd, m.handle);
    check(m.bwd->get_workspace_size(m.ws_bwd), "backward workspace", true);
  } catch (const CudnnUnavailable&) {
    throw;
  } catch (const std::exception& e) {
    // The frontend's own loading (the CUDA runtime and driver it opens for
    // itself, a cuDNN symbol it looks up) throws std::runtime_error: this
    // host cannot build the graphs.
    throw CudnnUnavailable(std::string("cuDNN SDPA: building the graphs: ") + e.what());
  }
}

CudnnSdpa::~CudnnSdpa() = default;

size_t CudnnSdpa::workspace_bytes() const { return size_t(std::max(impl_->ws_fwd, impl_->ws_bwd)); }

void CudnnSdpa::fwd(const SdpaTensors& t, void* workspace) {
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(t.q)}, {kK, const_cast<void*>(t.k)},
                                          {kV, const_cast<void*>(t.v)}, {kO, t.o},
                                          {kStats, t.stats}};
  impl_->run(*impl_->fwd, pack, workspace, "forward");
}

void CudnnSdpa::bwd(const SdpaTensors& t, void* workspace) {
  std::unordered_map<int64_t, void*> pack{
      {kQ, const_cast<void*>(t.q)}, {kK, const_cast<void*>(t.k)},   {kV, const_cast<void*>(t.v)},
      {kO, t.o},                    {kStats, t.stats},              {kDout, const_cast<void*>(t.dout)},
      {kDq, t.dq},                  {kDk, t.dk},                    {kDv, t.dv}};
  impl_->run(*impl_->bwd, pack, workspace, "backward");
}

std::string CudnnSdpa::fwd_plan() const { return plan_name(*impl_->fwd); }
std::string CudnnSdpa::bwd_plan() const { return plan_name(*impl_->bwd); }

}  // namespace wiola::bench
