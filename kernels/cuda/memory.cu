#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/memory.cuh"
#include "util/env.h"
#include "util/error.h"

namespace wiola {
namespace cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

void after_launch(const char* op) {
  check(cudaGetLastError(), op);
  static const bool sync = env_flag("WIOLA_CUDA_SYNC");
  if (sync) check(cudaDeviceSynchronize(), op);
}

void unsupported_dtype(DType t, const char* op) {
  fail("cuda ", op, ": buffers of ", dtype_name(t), " are not supported (float32 or bfloat16)");
}

namespace {
constexpr size_t kSmall = 1 << 20;  // below: round to 512 B; above: to 2 MiB
size_t round_size(size_t b) {
  if (b <= kSmall) return (std::max<size_t>(b, 1) + 511) / 512 * 512;
  return (b + (size_t(2) << 20) - 1) / (size_t(2) << 20) * (size_t(2) << 20);
}
double mib(size_t b) { return double(b) / 1048576.0; }
}  // namespace

CachingAllocator::CachingAllocator() : cache_(!env_flag("WIOLA_CUDA_NO_CACHE")) {}

CachingAllocator::~CachingAllocator() {
  release_graph_pool();
  release_cache();
  for (auto& [p, s] : live_) cudaFree(p);  // leaked buffers: give them back anyway
}

void* CachingAllocator::take(std::multimap<size_t, void*>& pool, size_t size) {
  auto it = pool.lower_bound(size);
  if (it == pool.end() || it->first > (cache_ ? 2 * size : size)) return nullptr;
  void* p = it->second;
  const size_t s = it->first;
  pool.erase(it);
  cached_ -= s;
  live_[p] = s;
  in_use_ += s;
  peak_ = std::max(peak_, in_use_);
  return p;
}

void* CachingAllocator::alloc(size_t bytes, const char* what) {
  const size_t size = cache_ ? round_size(bytes) : std::max<size_t>(bytes, 1);
  // Recording a graph: a block of the graphs' pool, else one that joins it.
  if (capturing_)
    if (void* p = take(graph_free_, size)) return p;
  if (void* p = take(free_, size)) {
    if (capturing_) {
      graph_blocks_.insert(p);
      graph_bytes_ += live_[p];
    }
    return p;
  }
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, size);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error state
    release_cache();
    e = cudaMalloc(&p, size);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("CUDA out of memory allocating ", mib(size), " MiB for ", what, " (", cudaGetErrorString(e), "); wiola holds ",
         mib(in_use_), " MiB in use and ", mib(cached_), " MiB cached; the device has ", mib(free_b), " of ",
         mib(total_b), " MiB free");
  }
  ++mallocs_;
  live_[p] = size;
  in_use_ += size;
  peak_ = std::max(peak_, in_use_);
  if (capturing_) {
    graph_blocks_.insert(p);
    graph_bytes_ += size;
  }
  return p;
}

void CachingAllocator::free(void* p) {
  if (!p) return;
  const auto it = live_.find(p);
  WIOLA_CHECK(it != live_.end(), "cuda: free of a pointer the allocator does not own");
  const size_t s = it->second;
  live_.erase(it);
  in_use_ -= s;
  if (graph_blocks_.count(p)) {  // back to the graphs' pool, cache or not
    graph_free_.emplace(s, p);
    cached_ += s;
    return;
  }
  if (!cache_) {
    check(cudaFree(p), "cudaFree");
    return;
  }
  free_.emplace(s, p);
  cached_ += s;
}

void CachingAllocator::release_graph_pool() {
  for (auto& [s, p] : graph_free_) {
    graph_blocks_.erase(p);
    cached_ -= s;
    if (cache_) {
      free_.emplace(s, p);
      cached_ += s;
    } else {
      check(cudaFree(p), "cudaFree");
    }
  }
  graph_free_.clear();
  graph_bytes_ = 0;
  for (void* p : graph_blocks_) graph_bytes_ += live_.count(p) ? live_[p] : 0;  // still held: they stay its own
}

void CachingAllocator::release_cache() {
  for (auto& [s, p] : free_) cudaFree(p);
  free_.clear();
  cached_ = 0;
}

}  // namespace cuda

namespace {
struct DeviceProbe {
  int count = 0;
  std::string status;
  DeviceProbe() {
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      count = 0;
      status = std::string("no usable CUDA device: ") + cudaGetErrorString(e);
      cudaGetLastError();
    } else if (count == 0) {
      status = "no CUDA device on this machine";
    } else {
      cudaDeviceProp p{};
      cudaGetDeviceProperties(&p, 0);
      status = std::to_string(count) + " CUDA device(s); device 0: " + p.name + " (sm_" + std::to_string(p.major) +
               std::to_string(p.minor) + ")";
    }
  }
};
const DeviceProbe& probe() {
  static const DeviceProbe p;
  return p;
}
}  // namespace

int cuda_device_count() { return probe().count; }
const char* cuda_status() { return probe().status.c_str(); }

}  // namespace wiola
