// This rank's place in a training run, the Trainer's topology part: the
// config and budget, the process grid (control and data planes), the
// pipeline stage (layer range, schedule of actions, boundary link), the
// model shard, the optimizer and the training loader with this rank's batch.
// The other parts of the Trainer (validator, accounting, outputs, checkpoint
// and spike policies, dump recorder) read it; nothing here measures, logs or
// saves.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "data/loader.h"
#include "dist/comm.h"
#include "dist/grid.h"
#include "dist/optimizer.h"
#include "dist/schedule.h"
#include "dist/tp_collectives.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "train/stage_link.h"
#include "train/trainer.h"

namespace wiola {

struct AtmSaving;

struct Pipeline {
  const RunConfig& rc;
  TrainOptions opt;
  Ops<float>& ops;
  dist::Comm& world;
  StepBudget budget;
  int B, T, m;        // micro-batch, sequence length, micro-batches per step
  int64_t GB;         // global batch (sequences)
  dist::GridCoord me;
  std::unique_ptr<TokenLoader> loader;
  std::vector<int32_t> batch;               // this rank's slice of the global batch
  std::unique_ptr<dist::Grid> grid;
  std::string data_plane;  // what carries backend tensors: "nccl", "mpi", "mpi-staged"
  // The model in chunks (dist/schedule.h): p·v global chunks of layers, v
  // per rank (1 for 1f1b, gpipe and zb-h1; parallel.virtual_stages for
  // interleaved; 2 for zb-v), placed by `placement`. chunk_cuts: the layer
  // range of every global chunk; stages: every rank's ranges, by its chunk
  // index; chunk_layers: this rank's.
  int v = 1;
  dist::ChunkPlacement placement = dist::ChunkPlacement::Interleaved;
  std::vector<std::pair<int, int>> chunk_cuts;
  std::vector<LayerRanges> stages;
  LayerRanges chunk_layers;
  bool first = true, last = true;           // holds the model's first chunk / its last (the head)
  bool embed_split = false;                 // the embedding's two ends on two ranks (summed between them)
  std::vector<dist::Action> actions;        // this stage's schedule
  std::vector<int> chunk_slots;             // activation slots each chunk needs
  std::vector<int> chunk_weight_slots;      // W operand sets each chunk needs (split backward)
  int slots = 1;                            // the most any chunk needs (reports)
  std::unique_ptr<dist::CommTpCollectives> tpc;
  // With more than one chunk the parameters live in `store` (model/model.h
  // ParamStore) and every chunk's Model binds in it; `model` is chunk 0,
  // whose params(), grads() and layout() are then the whole rank's (what
  // the optimizer, checkpoints and gathers read), with one chunk the model.
  std::unique_ptr<ParamStore<float>> store;
  Buffer<float> store_params, store_grads;
  DynBuffer<float> store_weights;
  std::vector<std::unique_ptr<Model<float>>> chunks;
  Model<float>* model = nullptr;
  std::unique_ptr<dist::DistAdamW> adam;
  bool zero = false, overlap = false;
  const ParamEntry* embed = nullptr;        // the tied embedding, if this stage holds it
  std::unique_ptr<StageLink> link;

  Pipeline(const RunConfig& r, const TrainOptions& o, Ops<float>& b, dist::Comm& w);
  bool root() const { return world.rank() == 0; }
  size_t mb_tokens() const { return size_t(B) * (T + 1); }
  std::string step_context(int64_t t) const { return "stage " + std::to_string(me.pp) + " step " + std::to_string(t); }
  // Chunk c of this rank: its global index, and the rank of global chunk g.
  int global_chunk(int c) const { return dist::global_chunk(rc.parallel.pp, me.pp, c, placement); }
  int chunk_rank(int g) const { return dist::chunk_rank(rc.parallel.pp, g, placement); }
  int n_global_chunks() const { return rc.parallel.pp * v; }
  // The chunk that runs the head (the last layers; chunk 0 where this rank
  // has none): the loss sum, the logits.
  Model<float>& head();
  // This rank's model memory by class, every chunk (the store counted once).
  Model<float>::Memory memory() const;
  // ATM's statistics of the last training forward, every chunk's layers.
  std::vector<Model<float>::AtmStats> atm_stats() const;

  // The training loader of this DP rank (inside the setup agreement).
  void open_loader(uint64_t data_seed);
  // The communicators (control plane MPI; data plane for the backend's
  // memory), this rank's pipeline stage and its schedule.
  void build_grid_and_schedule();
  void cut_chunks();
  void build_model_and_optimizer();
  void make_store();
  // Sum over the world of the last stage's CE sums (tp rank 0 of each DP
  // replica's last stage contributes): the control plane, host doubles.
  // ATM's figures ride along (`mine`: this rank's; `job`: set to the
  // job-wide sums), so the accounting adds no collective of its own.
  double world_loss(const AtmSaving& mine, AtmSaving& job);
  // A flat backend buffer of this rank as full tensors on rank 0.
  std::vector<float> gather_backend(const float* buf);
  // The flat length DP reduces (ZeRO pads buckets to a multiple of DP).
  size_t padded_params() const;
  // What a manifest records about the run besides its identity.
  nlohmann::json checkpoint_info() const;
};

}  // namespace wiola
