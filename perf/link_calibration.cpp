// The CPU transport's calibration (perf/link_calibration.h).
#include "perf/link_calibration.h"

#include <algorithm>
#include <chrono>

#include "dist/placement.h"
#include "util/error.h"

namespace wiola::perf {

LinkFit fit_link(const std::vector<LinkPoint>& points) {
  WIOLA_CHECK(points.size() >= 2, "link calibration: at least two measurements are needed (got ", points.size(), ")");
  double s11 = 0, s12 = 0, s22 = 0, r1 = 0, r2 = 0;
  for (const LinkPoint& p : points) {
    s11 += p.ring_steps * p.ring_steps;
    s12 += p.ring_steps * p.wire_bytes;
    s22 += p.wire_bytes * p.wire_bytes;
    r1 += p.ring_steps * p.seconds;
    r2 += p.wire_bytes * p.seconds;
  }
  const double det = s11 * s22 - s12 * s12;
  WIOLA_CHECK(det > 0, "link calibration: the measurements do not separate latency from bandwidth");
  const double a = std::max(1e-7, (r1 * s22 - r2 * s12) / det), b = std::max(1e-12, (s11 * r2 - s12 * r1) / det);
  return {a, 1.0 / b};
}

namespace {

// The collectives of 4 KiB .. 16 MiB per rank over `c` (median of repeats,
// the slowest rank's time), with their fit. Every group of a split runs at
// once, as the trainer's groups do.
nlohmann::json measure(dist::Comm& c) {
  using dist::DType;
  const int p = c.size();
  std::vector<LinkPoint> points;
  nlohmann::json pts = nlohmann::json::array();
  for (size_t kib = 4; kib <= 16384; kib *= 4) {
    const size_t n = kib * 1024 / 4 / size_t(p) * size_t(p);  // floats, a multiple of p
    std::vector<float> buf(n, 1.0f), out_buf(n);
    for (int op = 0; op < 3; ++op) {
      const int reps = kib <= 256 ? 50 : 8;
      std::vector<double> t;
      for (int r = 0; r < reps + 1; ++r) {
        c.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        if (op == 0) c.all_reduce(buf.data(), buf.data(), n, DType::F32, dist::ReduceOp::Sum);
        else if (op == 1) c.reduce_scatter_sum(buf.data(), out_buf.data(), n / size_t(p), DType::F32);
        else c.all_gather(buf.data(), out_buf.data(), n / size_t(p), DType::F32);
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) t.push_back(c.all_reduce_value(dt, dist::ReduceOp::Max));
      }
      std::sort(t.begin(), t.end());
      const double med = t[t.size() / 2];
      const double bytes = double(n) * 4, wire = op == 0 ? 2.0 * (p - 1) / p * bytes : double(p - 1) / p * bytes;
      points.push_back({op == 0 ? 2.0 * (p - 1) : double(p - 1), wire, med});
      pts.push_back({{"op", op == 0   ? "all_reduce"
                            : op == 1 ? "reduce_scatter"
                                      : "all_gather"},
                     {"bytes_per_rank", bytes},
                     {"wire_bytes", wire},
                     {"seconds", med}});
    }
  }
  const LinkFit f = fit_link(points);
  return {{"ranks", p}, {"latency_s", f.latency_s}, {"gbs", f.bytes_per_s / 1e9}, {"points", pts}};
}

}  // namespace

nlohmann::json calibrate_link(dist::Comm& world) {
  const int p = world.size();
  WIOLA_CHECK(p >= 2, "plan --calibrate-link: run it under mpirun with the ranks the layouts will use (>= 2)");
  // Several nodes: the ranks of each node together (intra, every node at
  // once), and one rank a node (inter: one flow on each node's link; the
  // planner divides the rate among the flows a layout puts on it).
  const dist::Placement pl = dist::gather_placement(dist::GridConfig{1, 1, p}, world);
  const int nodes = int(pl.nodes.size());
  std::vector<int> local(size_t(p), 0), node_of(size_t(p), 0), per(size_t(nodes), 0);
  for (int r = 0; r < p; ++r) {
    node_of[size_t(r)] = int(std::find(pl.nodes.begin(), pl.nodes.end(), pl.rank_node[size_t(r)]) - pl.nodes.begin());
    local[size_t(r)] = per[size_t(node_of[size_t(r)])]++;
  }
  const int per_node = per[0];
  WIOLA_CHECK(std::all_of(per.begin(), per.end(), [&](int k) { return k == per_node; }),
              "plan --calibrate-link: every node needs the same number of ranks (", pl.nodes_summary(), ")");
  const std::string what =
      "dist::MpiComm collectives, median of repeats, fitted t = latency x ring steps + wire bytes / rate";
  if (nodes == 1) {
    nlohmann::json j = measure(world);
    j["what"] = what;
    return j;
  }
  const int me = world.rank();
  nlohmann::json intra, inter;
  if (per_node > 1) {
    auto c = world.split(node_of[size_t(me)], me, "intra");
    intra = measure(*c);
  }
  {  // One flow a node link: the ranks of place 0 on each node (world rank 0
     // among them), the others wait.
    auto c = world.split(local[size_t(me)], me, "inter");
    if (local[size_t(me)] == 0) inter = measure(*c);
  }
  const nlohmann::json& top = per_node > 1 ? intra : inter;
  nlohmann::json j = {{"ranks", p},
                      {"nodes", nodes},
                      {"per_node", per_node},
                      {"latency_s", top["latency_s"]},
                      {"gbs", top["gbs"]},
                      {"inter", inter},
                      {"placement", pl.nodes_summary()},
                      {"what", what}};
  if (per_node > 1) j["intra"] = intra;
  return j;
}

}  // namespace wiola::perf
