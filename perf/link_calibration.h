// The CPU transport measured as the trainer uses it (docs/performance.md):
// all-reduce, reduce-scatter and all-gather of 4 KiB to 16 MiB per rank over
// a dist::Comm (the trainer's MPI communicator, its bounded wait loop
// included), fitted to latency x ring steps + wire bytes / rate by least
// squares. A microbenchmark of the link, like nccl-tests for GPUs; no
// training run is involved. `wiola plan --calibrate-link FILE` runs it under
// mpirun and `wiola plan --cpu --link FILE` reads its result. Across several
// nodes (ranks placed by host name) it measures the link inside a node (each
// node's ranks together, every node at once) and between nodes (one rank a
// node: one flow on each node's link).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "dist/comm.h"

namespace wiola::perf {

struct LinkPoint {
  double ring_steps = 0, wire_bytes = 0, seconds = 0;
};
struct LinkFit {
  double latency_s = 0;    // per ring step
  double bytes_per_s = 0;  // on the wire
};

// t = latency_s * ring_steps + wire_bytes / bytes_per_s, least squares
// without an intercept; both terms held positive (a latency of at least
// 0.1 us, a rate of at most 1 TB/s).
LinkFit fit_link(const std::vector<LinkPoint>& points);

// Collective over `world` (at least 2 ranks): the measured points (median
// of repeats, the slowest rank's time) and their fit, as the JSON that
// --link reads: ranks, latency_s, gbs, points (several nodes: also nodes,
// per_node, intra, inter). Complete on world rank 0, which writes it; on a
// rank that measured no inter-node flow, "inter" is null.
nlohmann::json calibrate_link(dist::Comm& world);

}  // namespace wiola::perf
