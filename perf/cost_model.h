// The analytic side of the performance reports and the cluster planner
// (docs/performance.md): for a model and a training layout, what each rank
// holds in memory by class, what it puts on the wire per step by group, and
// the pipeline's shape. Pure functions of the configuration: the trainer's
// report sets them beside what it measured, and the planner (perf/planner.h)
// builds its predictions on them.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dist/optimizer.h"
#include "dist/schedule.h"
#include "kernels/ops.h"
#include "model/config.h"

namespace wiola::perf {

// How layers are split into pipeline stages (parallel.stage_balance):
// "compute" FLOP-balanced with the head on the last stage, "layers" even.
enum class StageBalance { Compute, Layers };
constexpr std::array<std::string_view, 2> enum_names(StageBalance) { return {"compute", "layers"}; }

// A training layout: the process grid and the per-step knobs (the config's
// parallel.* and train.micro_batch / grad_accum / recompute).
struct Layout {
  int tp = 1, pp = 1, dp = 1;
  int micro_batch = 1;    // sequences per micro-batch
  int micro_batches = 1;  // micro-batches per optimizer step per DP replica
  bool zero = true;       // ZeRO-1 (only meaningful with dp > 1)
  bool recompute = false;
  // The pipeline schedule (dist/schedule.h; interleaved: virtual_stages
  // chunks per rank, zb-v: two in a V); the planner simulates all five and
  // the trainer runs them (interleaved and zb-v with MPI between the ranks,
  // not yet on the NCCL plane).
  dist::Schedule schedule = dist::Schedule::OneFOneB;
  StageBalance stage_balance = StageBalance::Compute;
  int virtual_stages = 1;
  // The layer boundaries of the pipeline's p·v chunks (p·v + 1 entries, 0 …
  // L), as the chunk balancer (perf/planner.h balance_chunks) chose them;
  // empty: stage_balance cuts them. Only the chunks of interleaved and
  // zb-v use it (the trainer's stages follow stage_balance).
  std::vector<int> cuts;
  int world() const { return tp * pp * dp; }
  bool zero_active() const { return zero && dp > 1; }
  int global_batch() const { return micro_batch * micro_batches * dp; }
  // "tp2 pp1 dp2, 2x4, zero, recompute"
  std::string name() const;
};

// Layer ranges [first, last) of the pipeline stages (StageBalance).
std::vector<std::pair<int, int>> pipeline_stages(const ModelConfig& c, int pp, StageBalance balance);
// The shard of stage `stage`, TP rank 0.
ModelShard stage_shard(const ModelConfig& c, const Layout& lay, int stage);
// The stage's schedule and the activation slots it keeps (its peak number
// of micro-batches in flight; interleaved: its peak live chunk activations
// over v, rounded up, each chunk holding 1/v of the rank's layers).
std::vector<dist::Action> stage_schedule(const Layout& lay, int stage);
int stage_slots(const Layout& lay, int stage);
// The model chunks per rank of the layout's schedule (interleaved: v; zb-v:
// 2; otherwise 1) and how they sit on the ranks (dist::ChunkPlacement).
int chunks_per_rank(const Layout& lay);
dist::ChunkPlacement chunk_placement(const Layout& lay);
// The layer ranges of the layout's p·v global chunks (lay.cuts when they cut
// p·v chunks, else stage_balance over p·v stages: the head's chunk lighter),
// and those rank `stage` holds, by its chunk index (what the trainer builds,
// train/stage_layers.h; one range for the plain schedules).
std::vector<std::pair<int, int>> chunk_cuts(const ModelConfig& c, const Layout& lay);
LayerRanges rank_chunks(const ModelConfig& c, const Layout& lay, int stage);

// Bytes one rank of `stage` puts on the wire per optimizer step, per group,
// under the ring/direct algorithms the communicators count (dist/comm.h):
// exactly what a run's report measures.
struct Traffic {
  double tp = 0, pp = 0, dp = 0, embed = 0;
  double total() const { return tp + pp + dp + embed; }
};
// padded_params: the flat length DP reduces (params_reduced below). Every
// chunk of the rank counts (its boundaries with chunks on other ranks; the
// tied embedding's sum only where its two ends sit on two ranks).
Traffic rank_traffic(const ModelConfig& c, const Layout& lay, int stage, double padded_params, size_t elem_bytes = 4);
// Parameters of one rank (TP rank 0; every chunk, the embedding once), and
// the length DP reduces for it (ZeRO pads every bucket to a multiple of dp;
// dist/optimizer.h bucket_spans).
size_t rank_params(const ModelConfig& c, const Layout& lay, int stage);
size_t params_reduced(const ModelConfig& c, const Layout& lay, int stage,
                      size_t bucket_bytes = dist::kDefaultBucketBytes);

// Memory of one rank by class, bytes.
struct Memory {
  double params = 0;       // fp32 master parameters + the weight copy GEMMs read
  double grads = 0;        // fp32 gradients
  double optimizer = 0;    // AdamW master shard and moments (ZeRO: 1/dp of them)
  double activations = 0;  // saved activations of every slot + backward scratch
  double total() const { return params + grads + optimizer + activations; }
};
// `prec` gives the storage types (a GPU in bf16 keeps a bf16 weight copy and
// bf16 activations); nothing is allocated.
Memory rank_memory(const ModelConfig& c, const Layout& lay, int stage, const Precision& prec,
                   size_t bucket_bytes = dist::kDefaultBucketBytes);

// FLOPs of one micro-batch on one rank of `stage` (model/flops.h's count,
// split over layers, head and TP): forward, and backward with the rerun
// forward of recomputed layers; stage_flops is their sum. bwd_weight: the
// backward's weight-gradient GEMMs (W of a split backward, one pass of the
// weight GEMMs, model/flops.h layer_weight_grad_flops); bwd − bwd_weight is
// its B (input gradients, attention, the recomputed forward).
struct StageFlops {
  double fwd = 0, bwd = 0, bwd_weight = 0;
};
StageFlops stage_flops_split(const ModelConfig& c, const Layout& lay, int stage);
double stage_flops(const ModelConfig& c, const Layout& lay, int stage);

// The bubble of the layout's own schedule (lay.schedule; interleaved and
// zb-v: its p·v chunks) on its stages, as the simulator (dist::simulate_pipeline)
// gives it with each stage timed by its FLOPs (stage_flops_split: forward,
// backward, W its weight-GEMM share) and no link delay: what the trainer's
// report predicts beside the bubble it measures. The stages' imbalance (the
// head on the last one) is in it and in its split (bubble_fill_drain,
// bubble_imbalance); pp 1: no bubble.
dist::PipelineSim schedule_bubble(const ModelConfig& c, const Layout& lay);
// The balanced formula of the layout's schedule: (p − 1)/(m + p − 1), for
// interleaved ((p − 1)/v)/(m + (p − 1)/v); its name for reports.
double bubble_formula(const Layout& lay);
const char* bubble_formula_name(const Layout& lay);

// One stage's micro-batch of work in the terms of a device profile
// (perf/device_profile.h): GEMM FLOPs, the causal attention's forward FLOPs (our count,
// which the profile's FlashAttention-counted rates time as the same work),
// and memory-bound units (tokens x d x layers).
struct StageKinds {
  double gemm_fwd = 0, gemm_bwd = 0;  // backward: with the recomputed forward
  double gemm_bwd_weight = 0;         // the weight-gradient GEMMs of gemm_bwd (W)
  double attn_fwd = 0;                // one forward of the stage's attention
  bool recompute = false;             // the backward reruns the forward (attention included)
  double units_fwd = 0, units_bwd = 0;
  int dh = 0;
};
StageKinds stage_kinds(const ModelConfig& c, const Layout& lay, int stage);

}  // namespace wiola::perf
