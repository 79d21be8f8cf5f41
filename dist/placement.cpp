#include "dist/placement.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <set>

namespace wiola::dist {

const char* link_name(LinkKind k) {
  switch (k) {
    case LinkKind::None: return "none";
    case LinkKind::Intra: return "intra";
    case LinkKind::Inter: return "inter";
  }
  return "?";
}

namespace {

// The link of `kind`'s groups: none (single ranks), intra (every group on
// one node) or inter; `across` gets the first group that spans nodes,
// `flows` the most spanning groups with a rank on one node.
LinkKind links_of(const GridConfig& g, const std::vector<std::string>& node, GroupKind kind, std::vector<int>* across,
                  int* flows) {
  LinkKind out = LinkKind::None;
  std::map<std::string, int> on_node;  // crossing groups with a rank on each node
  for (int r = 0; r < g.world(); ++r) {
    const std::vector<int> group = group_ranks(g, r, kind);
    if (group.size() < 2 || group.front() != r) continue;  // each group once, from its first rank
    std::set<std::string> touched;                         // the nodes the group has ranks on
    for (int q : group) touched.insert(node[size_t(q)]);
    if (touched.size() == 1) {
      if (out == LinkKind::None) out = LinkKind::Intra;
      continue;
    }
    if (across && across->empty()) *across = group;
    out = LinkKind::Inter;
    for (const std::string& n : touched) ++on_node[n];
  }
  *flows = 0;
  for (const auto& [n, k] : on_node) *flows = std::max(*flows, k);
  return out;
}

}  // namespace

Placement placement_of(const GridConfig& g, std::vector<std::string> rank_node) {
  Placement p;
  p.rank_node = std::move(rank_node);
  for (const std::string& n : p.rank_node)
    if (std::find(p.nodes.begin(), p.nodes.end(), n) == p.nodes.end()) p.nodes.push_back(n);
  p.tp = links_of(g, p.rank_node, GroupKind::Tp, &p.tp_across, &p.tp_flows);
  p.pp = links_of(g, p.rank_node, GroupKind::Pp, nullptr, &p.pp_flows);
  p.dp = links_of(g, p.rank_node, GroupKind::Dp, nullptr, &p.dp_flows);
  return p;
}

std::string Placement::nodes_summary() const {
  std::string out;
  for (const std::string& n : nodes) {
    std::string ranks;
    for (size_t r = 0; r < rank_node.size();) {
      if (rank_node[r] != n) {
        ++r;
        continue;
      }
      size_t e = r;
      while (e + 1 < rank_node.size() && rank_node[e + 1] == n) ++e;
      if (!ranks.empty()) ranks += ',';
      ranks += std::to_string(r);
      if (e > r) ranks += '-' + std::to_string(e);
      r = e + 1;
    }
    if (!out.empty()) out += "; ";
    out += n + " ranks " + ranks;
  }
  return out;
}

Placement gather_placement(const GridConfig& g, Comm& world) {
  constexpr size_t kName = 64;
  std::array<char, kName> mine{};
  if (gethostname(mine.data(), kName - 1) != 0) std::strcpy(mine.data(), "?");
  mine[kName - 1] = '\0';
  std::vector<char> all(kName * size_t(world.size()));
  if (world.size() > 1) world.all_gather(mine.data(), all.data(), kName, DType::U8);
  else std::memcpy(all.data(), mine.data(), kName);
  std::vector<std::string> node;
  for (int r = 0; r < world.size(); ++r) node.emplace_back(all.data() + size_t(r) * kName);
  return placement_of(g, std::move(node));
}

}  // namespace wiola::dist
