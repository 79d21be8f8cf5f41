// The process grid (docs/model.md §5): world = TP × PP × DP, TP innermost:
//   rank = pp·(DP·TP) + dp·TP + tp.
// Pure arithmetic (grid_coord, grid_rank, group_ranks) is separate from the
// communicators (Grid), so layouts can be checked without MPI.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "dist/comm.h"

namespace wiola::dist {

struct GridConfig {
  int tp = 1, pp = 1, dp = 1;
  int world() const { return tp * pp * dp; }
};

struct GridCoord {
  int tp = 0, pp = 0, dp = 0;
  bool operator==(const GridCoord&) const = default;
};

// The groups a rank belongs to.
//   Tp:    same (pp, dp), ordered by tp
//   Pp:    same (tp, dp), ordered by stage
//   Dp:    same (tp, pp), ordered by dp
//   Embed: first and last stage of the same (tp, dp) (the tied embedding's
//          gradient sum); a middle stage is alone; size 1 when pp == 1
//   Mp:    the model-parallel ranks (all tp, pp) of one dp index, ordered by
//          rank: every distinct parameter lives on exactly one of them (the
//          group over which the gradient norm is summed)
//   World: everyone
enum class GroupKind { Tp, Pp, Dp, Embed, Mp, World };
const char* group_name(GroupKind k);

// Throws wiola::Error if a value is < 1 or tp·pp·dp != world_size.
void validate_grid(const GridConfig& g, int world_size);

GridCoord grid_coord(const GridConfig& g, int rank);
int grid_rank(const GridConfig& g, const GridCoord& c);
// World ranks of `kind`'s group containing `rank`, in group-rank order.
std::vector<int> group_ranks(const GridConfig& g, int rank, GroupKind kind);

// Model-dependent layout checks (docs/model.md §5); throws wiola::Error saying what to
// change: tp·pp·dp = world; TP divides H_kv (and H_kv divides H), d_A, d_B
// and V; PP <= L; micro_batch · micro_batches · dp = global_batch.
void validate_layout(const GridConfig& g, int world_size, int n_layers,
                     int n_kv_heads, int n_heads, int d_a, int d_b, int vocab,
                     int global_batch, int micro_batch, int micro_batches);

// Layers [first, last) of `stage`: contiguous and balanced. With
// L = q·pp + r, stages 0..r−1 get q+1 layers and the rest q (the extra
// layers go to the front: the last stage also carries the LM head and loss).
std::pair<int, int> stage_layers(int n_layers, int pp, int stage);

// Contiguous stages of at least one layer each that minimise the largest
// stage cost: cost(stage) = sum of its layers' costs, plus first_extra on
// stage 0 and last_extra on the last stage (embedding lookup, head + loss).
// Ties go to the split with more layers in front. Returns [first, last) per
// stage. Throws wiola::Error unless 1 <= pp <= layer_cost.size().
std::vector<std::pair<int, int>> balanced_stages(const std::vector<double>& layer_cost,
                                                 double first_extra, double last_extra, int pp);

// The communicators of one rank, in two roles:
//   control plane (world(), tp(), ..., group(k)): host memory, always MPI:
//     scalars (loss, norm partial sums), setup agreement, gathers of host
//     copies (dumps, reports), every bounded wait and timeout diagnostic;
//   data plane (data(k)): backend memory: TP activations and gradients,
//     pipeline messages, DP gradient buckets and parameter shards, the
//     tied-embedding gradient. Made from the control plane by `data_plane`
//     (dist/staged_comm.h: data_plane_for(ops)); empty means the same
//     communicators serve both roles (host-memory backends).
// Construction is collective over `world`.
class Grid {
 public:
  Grid(const GridConfig& cfg, Comm& world, const DataPlaneFactory& data_plane = {});

  const GridConfig& config() const { return cfg_; }
  const GridCoord& coord() const { return coord_; }
  int world_rank() const { return rank_; }
  bool first_stage() const { return coord_.pp == 0; }
  bool last_stage() const { return coord_.pp == cfg_.pp - 1; }

  Comm& world() { return *world_; }
  Comm& tp() { return *tp_; }
  Comm& pp() { return *pp_; }
  Comm& dp() { return *dp_; }
  Comm& embed() { return *embed_; }
  Comm& mp() { return *mp_; }
  Comm& group(GroupKind k);
  // The data-plane communicator of group k (backend buffers).
  Comm& data(GroupKind k);
  // What group k moved on both planes since construction.
  CommTraffic traffic(GroupKind k);

 private:
  GridConfig cfg_;
  GridCoord coord_;
  int rank_ = 0;
  Comm* world_;
  std::unique_ptr<Comm> tp_, pp_, dp_, embed_, mp_;
  std::unique_ptr<Comm> data_[6];  // per GroupKind; null: the control communicator
};

}  // namespace wiola::dist
