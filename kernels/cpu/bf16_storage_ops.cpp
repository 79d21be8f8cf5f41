// cpu-bf16 (kernels/cpu/bf16_storage_ops.h): the CPU backend behind fp32
// shadows of every bf16 buffer an op receives.
#include "kernels/cpu/bf16_storage_ops.h"

#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/forwarding_ops.h"
#include "util/error.h"

namespace wiola {
namespace {

// The inner CPU backend, made before the ForwardingOps base that refers to it.
struct OwnedCpu {
  std::unique_ptr<Ops<float>> cpu = make_cpu_ops<float>(CpuMemory::Host);
};

class Bf16StorageOps final : private OwnedCpu, public ForwardingOps<float> {
 public:
  Bf16StorageOps() : ForwardingOps<float>(*cpu) {}

  const char* name() const override { return "cpu-bf16"; }
  void* alloc_bytes(size_t bytes) override {
    void* p = inner_.alloc_bytes(bytes);
    if (p) allocs_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  void free_bytes(void* p) override {
    allocs_.erase(reinterpret_cast<uintptr_t>(p));
    inner_.free_bytes(p);
  }
  // The cuda backend's bf16 mode (kernels/cuda/cuda_ops.cu).
  Precision precision() const override { return {DType::BF16, DType::F32, DType::BF16, true}; }

  // The fused blend and gate round their intermediate (o, dL/do) to the
  // activation type between the two steps, as the GPU's kernels do; here
  // that is the two ops one after the other, each rounding its outputs.
  void blend_gate_fwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, size_t n, Ptr o, Ptr og) override {
    blend_fwd(o_self, o_ctx, phi, n, o);
    sigmoid_gate_fwd(pre, o, n, og);
  }
  void blend_gate_bwd(CPtr o_self, CPtr o_ctx, CPtr phi, CPtr pre, CPtr o, CPtr dog, size_t n, Ptr dpre, Ptr d_self,
                      Ptr d_ctx, double* dphi) override {
    DynBuffer<float> d_o(*this, d_self.dtype(), n);
    sigmoid_gate_bwd(pre, o, dog, n, dpre, d_o.data());
    blend_bwd(o_self, o_ctx, phi, d_o.data(), n, d_self, d_ctx, dphi);
  }

 protected:
  CPtr arg(CPtr p) override {
    if (!p || p.dtype() != DType::BF16) return p;
    return CPtr(shadow(p.raw(), false), DType::F32);
  }
  Ptr arg(Ptr p) override {
    if (!p || p.dtype() != DType::BF16) return p;
    return Ptr(shadow(p.raw(), true), DType::F32);
  }
  void op_end(OpId) noexcept override {
    for (const Shadow& s : shadows_)
      if (s.before) write_back(s);
    shadows_.clear();
  }

 private:
  struct Shadow {
    uint16_t* bits;                      // the bf16 buffer from the argument's pointer on
    size_t n;                            // elements up to the end of its allocation
    std::unique_ptr<float[]> f;          // their widened values: what the op reads and writes
    std::unique_ptr<uint16_t[]> before;  // their bits when the op began (outputs only)
  };

  // The shadow of the bf16 buffer at p for the op in progress: one per
  // pointer, so an op that writes in place reads and writes the same one.
  float* shadow(const void* p, bool written) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    for (Shadow& s : shadows_)
      if (reinterpret_cast<uintptr_t>(s.bits) == at) {
        if (written && !s.before) s.before = snapshot(s.bits, s.n);
        return s.f.get();
      }
    auto it = allocs_.upper_bound(at);
    WIOLA_CHECK(it != allocs_.begin() && at < std::prev(it)->first + std::prev(it)->second,
                "cpu-bf16: a bf16 buffer at ", p, " outside this backend's allocations");
    --it;
    Shadow s{static_cast<uint16_t*>(const_cast<void*>(p)), (it->first + it->second - at) / 2, nullptr, nullptr};
    s.f.reset(new float[s.n]);  // not value-initialised: every element is set next
    const uint16_t* b = s.bits;
    float* f = s.f.get();
#pragma omp parallel for schedule(static) if (s.n >= kParallel)
    for (size_t i = 0; i < s.n; ++i) f[i] = bf16_widen(b[i]);
    if (written) s.before = snapshot(s.bits, s.n);
    shadows_.push_back(std::move(s));
    return f;
  }

  static std::unique_ptr<uint16_t[]> snapshot(const uint16_t* bits, size_t n) {
    std::unique_ptr<uint16_t[]> c(new uint16_t[n]);
    std::memcpy(c.get(), bits, n * sizeof(uint16_t));
    return c;
  }

  // Rounds back only the elements whose fp32 bits the op changed: a shadow
  // may reach over other buffers of the same allocation (other outputs, fp32
  // tensors whose halves need not survive a round trip as bf16).
  static void write_back(const Shadow& s) {
    const float* f = s.f.get();
    const uint16_t* before = s.before.get();
    uint16_t* bits = s.bits;
#pragma omp parallel for schedule(static) if (s.n >= kParallel)
    for (size_t i = 0; i < s.n; ++i) {
      uint32_t now;
      std::memcpy(&now, f + i, 4);
      if (now != uint32_t(before[i]) << 16) bits[i] = bf16_round(f[i]);
    }
  }
  static constexpr size_t kParallel = size_t(1) << 16;  // elements worth the threads

  std::map<uintptr_t, size_t> allocs_;  // start -> bytes
  std::vector<Shadow> shadows_;         // of the op in progress
};

}  // namespace

std::unique_ptr<Ops<float>> make_cpu_bf16_ops() { return std::make_unique<Bf16StorageOps>(); }

}  // namespace wiola
