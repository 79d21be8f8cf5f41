// Hardware figures behind MFU and the cluster planner: accelerators and
// interconnects, each with the public source of every number. Datasheet
// peaks are dense (no 2:4 sparsity); link rates are per GPU per direction.
// The achievable fractions are modelling assumptions, named as such in
// docs/performance.md, not measurements.
#pragma once

#include <string>
#include <vector>

namespace wiola::perf {

struct Accelerator {
  std::string key;            // "h100", "h200", "a100"
  std::string name;           // marketing name, form factor
  double bf16_tflops = 0;     // dense BF16 tensor-core peak
  double tf32_tflops = 0;     // dense TF32 tensor-core peak (the fp32 mode, TF32 on)
  double fp32_tflops = 0;     // non-tensor FP32 peak (fp32 mode, TF32 off)
  double memory_gib = 0;      // HBM capacity
  double memory_tbs = 0;      // HBM bandwidth, TB/s
  int gpus_per_node = 8;      // the node the planner assumes (DGX/HGX)
  std::string intra_link;     // interconnect key inside a node
  std::string source;
};

struct Interconnect {
  std::string key;            // "nvlink4", "nvlink3", "ib-ndr", "ib-hdr", "cpu-shm"
  std::string name;
  double gbs = 0;             // GB/s per GPU per direction
  double latency_us = 0;      // per message (collective step), assumed
  std::string source;
};

const std::vector<Accelerator>& accelerators();
const std::vector<Interconnect>& interconnects();
// By key ("h100") or by a device name containing the key ("NVIDIA H100 80GB
// HBM3"); nullptr when none matches.
const Accelerator* find_accelerator(const std::string& key_or_device);
// Throws wiola::Error listing the keys when none matches.
const Interconnect& find_interconnect(const std::string& key);

// Modelling assumptions (docs/performance.md): the share of a link's rate a
// ring collective reaches (NCCL bus bandwidth over the link rate), and the
// share of the dense BF16 peak the GEMMs of a transformer step reach on a
// GPU before the planner has measured figures of its own.
inline constexpr double kLinkEfficiency = 0.80;
inline constexpr double kGpuGemmEfficiency = 0.60;

}  // namespace wiola::perf
