// This rank's model: its v chunks (train/stage_layers.h), each a Model on
// its layer range. With more than one chunk the parameters live in `store`
// (model/model.h ParamStore) and every chunk's Model binds in it; `model`
// is chunk 0, whose params(), grads() and layout() are then the whole
// rank's (what the optimizer, checkpoints and gathers read), with one chunk
// the model.
#pragma once

#include <memory>
#include <vector>

#include "model/model.h"

namespace wiola {

struct RunSettings;
struct StageLayers;
struct StageSchedule;

struct RankModel {
  std::unique_ptr<ParamStore<float>> store;
  Buffer<float> store_params, store_grads;
  DynBuffer<float> store_weights;
  std::vector<std::unique_ptr<Model<float>>> chunks;
  Model<float>* model = nullptr;
  const ParamEntry* embed = nullptr;  // the tied embedding, if this stage holds it

  // The chunks, sized for the schedule's slots, initialised (train.seed).
  void build(const RunSettings& run, const StageLayers& layers, const StageSchedule& schedule, TpCollectives* tpc);
  // The chunk that runs the head (the last layers; chunk 0 where this rank
  // has none): the loss sum, the logits.
  Model<float>& head();
  // This rank's model memory by class, every chunk (the store counted once).
  Model<float>::Memory memory() const;
  // ATM's statistics of the last training forward, every chunk's layers.
  std::vector<Model<float>::AtmStats> atm_stats() const;

 private:
  void make_store(const RunSettings& run, const LayerRanges& layers);
};

}  // namespace wiola
