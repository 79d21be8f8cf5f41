// The op interface: every numerical operation the Wiola model needs, one
// function per op with its backward beside it, listed with its doc comment
// in kernels/op_list.h (which every backend and wrapper is made from;
// docs/architecture.md, "Adding an op"). `model/` calls only this;
// `kernels/cpu/` implements it with OpenBLAS + OpenMP (float and double, so
// tests can check gradients in double precision); a CUDA backend implements
// it with cuBLAS (bf16 operands, fp32 accumulate).
//
// Conventions
// - Row-major. Shapes are written in brackets; N = tokens = B*T.
// - Every pointer is backend memory (host for the CPU backend, device memory
//   for a GPU, inaccessible memory for the cpu-opaque debug backend). The
//   host never dereferences one; host<->backend copies go through
//   upload/download, and only where the host needs a value (logging, the
//   non-finite check, dumps), batched once per step.
// - Floating-point buffers are typed pointers (kernels/ptr.h): each knows its
//   storage dtype. T, the compute type of Ops<T>, is the type of master
//   weights, gradients and statistics; activations and weight copies use the
//   storage types of precision() (all T on the CPU). Index arrays (token ids,
//   ATM plans) are int32_t/uint8_t, device-side scalars double.
// - Reductions leave their result in backend memory (double accumulators):
//   a loss, a norm or dL/dφ never round-trips to the host inside model code.
// - Allocations are not zero-filled: callers zero() what must start at zero.
// - Backward ops: parameter gradients ACCUMULATE (+=, for micro-batches);
//   activation gradients OVERWRITE unless the comment says "accumulates"
//   (the residual stream and tensors that feed several consumers).
// - Sharded callers (TP) pass their local sizes (local heads, local FFN
//   columns, local vocabulary slice); no op here communicates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/ptr.h"

namespace wiola {

enum class Trans { N, T };

// Names one sequence of ops for Ops::graph: its owner and every host value
// its ops depend on (buffer addresses, sizes, flags) as words. Two calls with
// equal keys must issue equal ops.
struct GraphKey {
  const void* owner = nullptr;
  std::vector<uint64_t> words;
  bool operator==(const GraphKey&) const = default;
};

// Keys of one self-attention call after ATM (docs/model.md §2). Keys are rows sorted
// by `key_end`; key row j of sequence b is visible to the query at position
// p iff key_end[b*Tk + j] <= p. A query whose position opens a merged pair
// additionally sees its own raw key/value (its pair is not complete inside its
// prefix): self_open[b*Tq + i] != 0.
// Plain causal attention: key_end == nullptr (key j ends at position j),
// self_open == nullptr, keys == raw keys.
// Documents (docs/model.md §2 "Documents"): doc_start[b*Tq + i] is the first
// position of query i's document; the query then sees only the key rows of
// its document (plain: positions doc_start..p; ATM: the groups that end at
// or after doc_start, which never cross a document's start), and the work
// outside it is skipped. nullptr: the window is one document.
struct AttnKeys {
  const int32_t* key_end = nullptr;    // [B, Tk] or nullptr
  const int32_t* n_keys = nullptr;     // [B] valid key rows, or nullptr (= Tk)
  const uint8_t* self_open = nullptr;  // [B, Tq] or nullptr
  const int32_t* doc_start = nullptr;  // [B, Tq] or nullptr (training: q_pos0 = 0)
};

struct AttnShape {
  int B = 0;       // sequences
  int Tq = 0;      // queries per sequence
  int Tk = 0;      // key rows per sequence (capacity; n_keys may be less)
  int H = 0;       // query heads (local to this TP rank)
  int Hkv = 0;     // KV groups (local); query head h uses group h % Hkv
  int dh = 0;      // head dim
  int q_pos0 = 0;  // position of query row 0 (non-zero in cached decoding)
};

// Storage types of the model's buffers. T (Ops<T>) is always the type of
// master weights, gradients, optimizer state and statistics (norm rstd,
// softmax log-sum-exp, loss terms).
struct Precision {
  DType act;       // activations and their gradients (GEMM/attention operands)
  DType residual;  // the residual stream X, the GCLA summaries, their gradients
  DType weight;    // the weight copy GEMMs read
  // Weights live in a copy of the master parameters, refreshed after every
  // optimizer step (Model::refresh_weights), even when weight == T. A GPU
  // in bf16 needs the copy; cpu-opaque can force it to test the plumbing.
  bool separate_weights = false;
};

// Time marks in a backend's order of execution, for op profiles
// (kernels/profiled_ops.h). mark() returns the new mark's index; seconds()
// is the time between two marks, valid once the backend has synchronised.
// The host clock serves backends whose ops finish before they return (the
// CPU); a GPU records events on its stream instead.
class OpTimeline {
 public:
  virtual ~OpTimeline() = default;
  virtual int mark() = 0;
  virtual double seconds(int from, int to) = 0;
  virtual void clear() = 0;  // forget every mark
};
std::unique_ptr<OpTimeline> make_host_timeline();

template <class T>
class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;

  // ---- memory (its transfers are ops: kernels/op_list.h) ------------------
  virtual void* alloc_bytes(size_t bytes) = 0;  // contents undefined
  virtual void free_bytes(void* p) = 0;
  virtual void synchronize() {}
  // True when the host may touch this backend's buffers directly (plain CPU
  // memory): a communicator may then use them as message buffers.
  virtual bool host_accessible() const = 0;
  // The accelerator this backend runs on, in words ("" for the host CPU,
  // which reports describe themselves): reports and the peak-FLOP table key.
  virtual std::string device_name() const { return ""; }
  // The device stream every op of this backend runs on, as an opaque handle
  // (the CUDA backend's cudaStream_t), which a GPU data plane orders its
  // communication against; nullptr for the host backends.
  virtual void* device_stream() const { return nullptr; }
  // Which device this backend runs on, the same string for two backends on
  // one device ("host/domain:bus:device", a GPU's PCI address), so that
  // ranks can tell whether they share one; "" for the host backends.
  virtual std::string device_identity() const { return ""; }
  // Most bytes this backend has held allocated at once (0: not tracked; the
  // CPU backends live in the process's resident set instead).
  virtual size_t peak_bytes() const { return 0; }
  virtual Precision precision() const { return {dtype_of<T>(), dtype_of<T>(), dtype_of<T>(), false}; }
  // Marks for profiling this backend's ops (see OpTimeline).
  virtual std::unique_ptr<OpTimeline> make_timeline() { return make_host_timeline(); }
  // The per-shape GEMM choices of a backend that tunes its matrix products
  // (the CUDA backend with the option gemm = auto; kernels/gemm_tuning.h), as
  // the JSON text of a tuning table: those in use and those measured since
  // the last adopt_gemm_tuning. "" for a backend that does not tune.
  virtual std::string gemm_tuning() const { return ""; }
  // Uses the choices of a table (gemm_tuning()'s text, rank 0's: the trainer
  // broadcasts it so that every rank computes with the same algorithms;
  // docs/gpu.md). Ignored by a backend that does not tune.
  virtual void adopt_gemm_tuning(const std::string& table_json) { (void)table_json; }
  // ---- CUDA Graphs (the backend option cuda_graphs; docs/gpu.md) ----
  // Runs body, which issues ops on this backend, or replays what it issued
  // before. A backend that records graphs (cuda with cuda_graphs = layers)
  // calls body as usual the first time it sees `key`, records what body
  // issues the second time (and runs the recording), and from then on runs
  // the recording without calling body. So body must issue the same ops with
  // the same arguments whenever it is called with an equal key, change no
  // host state the caller relies on, and neither read nor write host memory
  // (no upload, download or synchronize: those invalidate the recording, a
  // loud error). Every other backend calls body().
  virtual void graph(const GraphKey& key, const std::function<void()>& body) {
    (void)key;
    body();
  }
  // Drops the recordings of the keys of this owner (a Model going away:
  // its buffers, which recordings name, are freed).
  virtual void forget_graphs(const void* owner) { (void)owner; }
  // ---- the ops (kernels/op_list.h: each with its doc comment) -------------
  // Memory transfers (upload, download, copy, zero, convert, copy_block),
  // matrix products, and every numerical op of the model.
#define WIOLA_OP(name, cls, params, args) virtual void name params = 0;
#include "kernels/op_list.h"
};

// Owning typed buffer in backend memory.
template <class T, class E = T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Ops<T>& ops, size_t n) : ops_(&ops), n_(n) {
    p_ = n ? static_cast<E*>(ops.alloc_bytes(n * sizeof(E))) : nullptr;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      ops_ = o.ops_;
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  ~Buffer() { release(); }
  E* data() { return p_; }
  const E* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(E); }
  static constexpr DType dtype() { return dtype_of<E>(); }

 private:
  void release() {
    if (p_) ops_->free_bytes(p_);
    p_ = nullptr;
  }
  Ops<T>* ops_ = nullptr;
  E* p_ = nullptr;
  size_t n_ = 0;
};

// Owning buffer whose element type is chosen at run time (activations, in the
// storage type the backend's precision() names).
template <class T>
class DynBuffer {
 public:
  DynBuffer() = default;
  DynBuffer(Ops<T>& ops, DType t, size_t n) : bytes_(Buffer<T, unsigned char>(ops, n * dtype_bytes(t))), t_(t), n_(n) {}
  Ptr data() { return Ptr(bytes_.data(), t_); }
  CPtr data() const { return CPtr(bytes_.data(), t_); }
  size_t size() const { return n_; }
  size_t bytes() const { return bytes_.bytes(); }
  DType dtype() const { return t_; }

 private:
  Buffer<T, unsigned char> bytes_;
  DType t_ = DType::F32;
  size_t n_ = 0;
};

}  // namespace wiola
