// Where each rank runs (docs/launch.md "Several nodes"): every rank's node
// (its host name), and for each parallel dimension whether its groups stay
// inside a node ("intra"), cross nodes ("inter"), or are single ranks
// ("none"). TP all-reduces every layer, so a TP group across nodes is the
// layout to warn about; DP and PP are the dimensions meant to cross.
#pragma once

#include <string>
#include <vector>

#include "dist/grid.h"

namespace wiola::dist {

enum class LinkKind { None, Intra, Inter };
const char* link_name(LinkKind k);

struct Placement {
  std::vector<std::string> rank_node;  // world rank -> node name
  std::vector<std::string> nodes;      // distinct nodes, in the order of their first rank
  LinkKind tp = LinkKind::None, pp = LinkKind::None, dp = LinkKind::None;
  std::vector<int> tp_across;  // the first TP group that spans nodes (empty: none does)
  // Flows on a node's link at once: for each dimension, the most groups
  // that span nodes and have a rank on one node (0: none spans nodes).
  // Every such group sends off that node at the same time (a ring leaves
  // each node it touches), so they share its link.
  int tp_flows = 0, pp_flows = 0, dp_flows = 0;

  // "node1 ranks 0-1, node2 ranks 2-3" (ranges of consecutive ranks).
  std::string nodes_summary() const;
};

// Pure: the links of each dimension from the ranks' nodes.
Placement placement_of(const GridConfig& g, std::vector<std::string> rank_node);

// Collective over `world` (size g.world()): gathers every rank's host name.
Placement gather_placement(const GridConfig& g, Comm& world);

}  // namespace wiola::dist
