#include "perf/hardware.h"

#include <algorithm>
#include <cctype>

#include "util/error.h"

namespace wiola::perf {

const std::vector<Accelerator>& accelerators() {
  static const std::vector<Accelerator> table = {
      {"h100", "NVIDIA H100 SXM5 80 GB", 989.4, 494.7, 66.9, 80, 3.35, 8, "nvlink4",
       "NVIDIA H100 Tensor Core GPU datasheet (SXM5 column): BF16 1,979 TFLOPS and TF32 989 TFLOPS "
       "with sparsity, halved for dense; FP32 67 TFLOPS; 80 GB HBM3 at 3.35 TB/s; NVLink 900 GB/s"},
      {"h200", "NVIDIA H200 SXM 141 GB", 989.4, 494.7, 66.9, 141, 4.8, 8, "nvlink4",
       "NVIDIA H200 Tensor Core GPU datasheet (SXM column): BF16 1,979 TFLOPS and TF32 989 TFLOPS "
       "with sparsity, halved for dense; FP32 67 TFLOPS; 141 GB HBM3e at 4.8 TB/s; NVLink 900 GB/s"},
      {"a100", "NVIDIA A100 SXM4 80 GB", 312, 156, 19.5, 80, 2.039, 8, "nvlink3",
       "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column): BF16 312 TFLOPS dense (624 sparse), "
       "TF32 156 dense, FP32 19.5 TFLOPS; 80 GB HBM2e at 2,039 GB/s; NVLink 600 GB/s"},
  };
  return table;
}

const std::vector<Interconnect>& interconnects() {
  static const std::vector<Interconnect> table = {
      {"nvlink4", "NVLink 4 (NVSwitch, H100/H200 HGX)", 450, 3,
       "H100/H200 datasheets: 900 GB/s total NVLink bandwidth per GPU = 450 GB/s each direction; "
       "latency assumed"},
      {"nvlink3", "NVLink 3 (NVSwitch, A100 HGX)", 300, 3,
       "A100 datasheet: 600 GB/s total NVLink bandwidth per GPU = 300 GB/s each direction; latency assumed"},
      {"ib-ndr", "InfiniBand NDR 400 Gb/s, one port per GPU", 50, 5,
       "NVIDIA ConnectX-7 / DGX H100 user guide: eight 400 Gb/s NDR ports, one per GPU; "
       "400 Gb/s = 50 GB/s each direction; latency assumed"},
      {"ib-hdr", "InfiniBand HDR 200 Gb/s, one port per GPU", 25, 5,
       "NVIDIA ConnectX-6 / DGX A100 user guide: eight 200 Gb/s HDR ports, one per GPU; "
       "200 Gb/s = 25 GB/s each direction; latency assumed"},
  };
  return table;
}

namespace {
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}
}  // namespace

const Accelerator* find_accelerator(const std::string& key_or_device) {
  const std::string k = lower(key_or_device);
  for (const Accelerator& a : accelerators())
    if (k == a.key || k.find(a.key) != std::string::npos) return &a;
  return nullptr;
}

const Interconnect& find_interconnect(const std::string& key) {
  const std::string k = lower(key);
  std::string keys;
  for (const Interconnect& i : interconnects()) {
    if (i.key == k) return i;
    keys += (keys.empty() ? "" : ", ") + i.key;
  }
  fail("unknown interconnect '", key, "' (known: ", keys, ")");
}

}  // namespace wiola::perf
