// The cluster planner (docs/performance.md): predicts step time, tokens/s,
// MFU, memory per rank and traffic for a model and a layout on a cluster,
// and searches the layouts (tp, pp, dp, micro-batch, ZeRO, recompute) for
// the fastest that fits.
//
// Its input is a Workload: what each pipeline stage's rank computes, moves
// and holds, built exactly from a Wiola config (perf/cost_model.h: the same
// figures the trainer's report measures) or from a GPT config (the standard
// formulas), so a prediction can stand beside a published Megatron-LM
// figure. Compute time comes from a ComputeModel: datasheet peak x an
// efficiency on GPUs, or timings of single-rank stage work measured on this
// CPU (perf/calibrate.h). Communication is latency + bytes / bandwidth over
// the link each group spans; the pipeline is simulated action by action.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "perf/cost_model.h"
#include "perf/hardware.h"

namespace wiola::perf {

// A dense GPT (Megatron-LM's): 4d MLP with GELU, learned positions, untied
// output layer, flash attention; parameters 12 L d^2 + 2 V d (+ positions).
struct GptConfig {
  std::string name = "gpt";
  int d = 2048, L = 24, H = 16, V = 131072, T = 4096;
  double params() const { return 12.0 * L * double(d) * d + 2.0 * V * double(d) + double(T) * d; }
};

// One rank of one pipeline stage (TP rank 0 stands for its group).
struct StageWork {
  double fwd_flops = 0, bwd_flops = 0;  // per micro-batch, recompute included in bwd
  double bwd_weight_flops = 0;          // the weight-gradient GEMMs of bwd (W of a split backward)
  double tp_bytes = 0;                  // TP wire bytes per micro-batch (fwd + bwd)
  int tp_ops = 0;                       // TP collectives per micro-batch
  double pp_msg_bytes = 0;              // one forward message out of the stage (the backward one is as big)
  double dp_bytes = 0;                  // DP wire bytes per step
  int dp_ops = 0;                       // DP collectives per step (buckets x reduce-scatter + all-gather)
  double embed_bytes = 0;               // tied-embedding sum per step (first and last stage, pp > 1)
  double opt_elems = 0;                 // parameters AdamW updates here
  Traffic traffic;                      // per step, by group
  Memory memory;
  StageKinds kinds;  // the same work by kind, for a device profile (Wiola workloads)
};

struct Workload {
  std::string model;  // name
  double params = 0;  // whole model
  int T = 0;
  double step_flops = 0;  // model FLOPs of one optimizer step (the MFU numerator)
  Layout layout;
  std::vector<StageWork> stages;
  double bubble_analytic = 0;  // (p-1)/(m+p-1); interleaved: ((p-1)/v)/(m+(p-1)/v)
  // Interleaved (layout.virtual_stages = v > 1) and zb-v (v = 2): the p·v
  // model chunks' work, chunk g the stage g of the same layout with p·v
  // stages (or layout.cuts; rank dist::chunk_rank(p, g) holds it: g mod p
  // interleaved, the V for zb-v). The pipeline is simulated chunk by chunk;
  // `stages` (the contiguous split of the layout) gives the rank-level
  // figures: memory, DP, optimizer (zb-v: the V puts the head on rank 0,
  // these figures keep it on the last rank; the fullest rank's figure is
  // about right, not which rank it is).
  std::vector<StageWork> chunks;
  // Per stage, the share of its busy time no other stage is busy: for a
  // compute model whose speed depends on how many ranks run at once
  // (CpuCompute). predict() sets it from a first simulation; empty: not
  // known yet (use the analytic bubble).
  std::vector<double> alone_share;
};

// The exact Wiola workload; prec: storage types (bf16 on a GPU).
Workload wiola_workload(const ModelConfig& c, const Layout& lay, const Precision& prec);
// A GPT workload; bf16 weights and activations, fp32 master and moments
// (Megatron-LM's mixed precision with its distributed optimizer when zero).
Workload gpt_workload(const GptConfig& g, const Layout& lay);

// Where the ranks run: devices per node, the link inside a node and between
// nodes. For the CPU: one node, a calibrated shared-memory "link".
struct Cluster {
  std::string device = "cpu";  // an accelerator key, or "cpu"
  int devices = 1;
  int per_node = 8;
  double memory_bytes = 0;  // per device (0: no limit, the CPU)
  double intra_gbs = 0, inter_gbs = 0, latency_s = 0, inter_latency_s = 0;
  double peak_flops = 0;   // per device, the MFU denominator
  bool hidden_dp = false;  // DP reduce-scatter hidden behind the last backward (NCCL streams)
  // Where each rank runs, by world rank (a measured CPU cluster of several
  // nodes; empty: ranks fill nodes of per_node in rank order): a dimension
  // whose groups span nodes uses the inter-node link (dist/placement.h).
  std::vector<std::string> rank_node;
  double host_copy_gbs = 25;  // device -> host snapshot for async checkpoints (PCIe Gen5 x16 ~ 64 GB/s peak; assumed)
  double ckpt_write_gbs = 1;  // per rank, to the checkpoint file system (assumed)
  static Cluster gpu(const std::string& gpu_key, int devices, const std::string& inter_key = "");
};

// Seconds of compute for one stage's micro-batch on one rank.
class ComputeModel {
 public:
  virtual ~ComputeModel() = default;
  virtual double fwd(const Workload& w, int stage) = 0;
  virtual double bwd(const Workload& w, int stage) = 0;
  // The weight-gradient part (W) of bwd; default: bwd's FLOP share of it.
  virtual double bwd_weight(const Workload& w, int stage);
  virtual double optimizer(double elems) = 0;  // AdamW over elems parameters, one rank
  // True when a rank's speed depends on how many others run at once.
  virtual bool shares_cores() const { return false; }
  virtual std::string describe() const = 0;
};
// FLOPs over peak x efficiency (the GEMMs' share of the dense peak).
std::unique_ptr<ComputeModel> flops_compute_model(double peak_flops, double efficiency, double mem_gbs);

struct Prediction {
  Layout layout;
  bool fits = true;
  std::string why_not;  // when it does not fit or is not a legal layout
  double step_s = 0, tokens_per_s = 0, mfu = 0;
  double pipeline_s = 0;  // the schedule's makespan (compute + TP + pipeline transfers)
  double compute_s = 0;   // the busiest rank's compute per step
  double tp_s = 0, pp_s = 0, dp_exposed_s = 0, embed_s = 0, optimizer_s = 0;
  double bubble_analytic = 0, bubble_sim = 0;
  // bubble_sim split (dist::PipelineSim): the schedule's bubble with every
  // stage at the mean stage cost, and the rest, the stages' imbalance.
  double bubble_fill_drain = 0, bubble_imbalance = 0;
  std::vector<double> stage_fwd_s, stage_bwd_s;  // per micro-batch, TP included (interleaved: per chunk)
  std::vector<double> stage_bwd_weight_s;        // W's part of stage_bwd_s
  // Per rank, the activations alive at the schedule's peak, in micro-batches
  // of the rank's layers (interleaved: live chunk activations / v).
  std::vector<double> peak_live;
  Traffic traffic;  // max over ranks, per group
  Memory memory;    // the fullest rank
  // The schedule choice (predict_schedules; the search, pp > 1, Wiola):
  // every schedule predicted for this layout, and why layout.schedule won.
  struct ScheduleOption {
    std::string name;      // "1f1b", "zb-h1", "interleaved v2", "zb-v", ...
    bool runnable = true;  // pickable: wiola train runs it as predicted (interleaved, zb-v on GPUs:
                           // their pipeline messages through host memory, not predicted)
    bool fits = true;
    double step_s = 0, bubble_sim = 0;
    double activation_bytes = 0;  // the fullest rank's activations
    double pp_bytes = 0;          // pipeline wire bytes per step, the busiest rank
  };
  std::vector<ScheduleOption> schedule_options;
  std::string schedule_why;  // empty: the layout's schedule was given, not chosen
};

Prediction predict(const Workload& w, const Cluster& cl, ComputeModel& cm);

// The chunk-aware stage balancer: for a layout whose schedule runs v > 1
// chunks per rank (interleaved, zb-v; v = 1 works too), the cut of the L
// layers into p·v contiguous chunks (Layout::cuts) that minimises the
// predicted step: the pipeline simulated on each chunk's times (the head on
// the last chunk, the embedding on the first, each on its rank by the
// schedule's placement), so the sum of a rank's chunks and the schedule's
// order count, not just the largest chunk. Local search from the better of
// the even split and the FLOP balance (pipeline_stages), one layer across
// one boundary at a time: never slower than either start. About 2·p·v
// predictions per round.
Layout balance_chunks(const ModelConfig& c, const Layout& lay, const Cluster& cl, ComputeModel& cm,
                      const Precision& prec);

// The schedules the planner chooses among, for a Wiola layout with pp > 1:
// the trainer's 1f1b and zb-h1, and (interleaved = true) the chunked ones:
// interleaved 1F1B with v = 2 and 4 chunks per rank where m % pp == 0 and
// pp·v ≤ L, and zb-v where m ≥ pp and 2·pp ≤ L (their chunks cut by
// balance_chunks when `balance`, else by the layout's stage balancer, so
// pp·v need not divide L). Each is predicted (step time, bubble, memory, the
// pipeline traffic the chunks multiply); the pick is the fastest schedule
// wiola train can run among those that fit (none fits: the fastest runnable
// one). On a CPU cluster (MPI) that is any of them, the chunked ones cut as
// the trainer cuts them (the stage balancer over p·v chunks). On GPUs
// interleaved and zb-v are not picked: the trainer sends their pipeline
// messages through host memory (the NCCL plane's in-order lanes do not
// carry them), which the prediction does not time; they are listed (cut by
// balance_chunks when `balance`) in schedule_options and named in
// schedule_why ("not picked on GPUs: pipeline messages through host
// memory", and "faster, but" when they would be). pp 1: `lay` as given.
Prediction predict_schedules(const ModelConfig& c, const Layout& lay, const Cluster& cl, ComputeModel& cm,
                             const Precision& prec, bool interleaved = true, bool balance = true);

// Every layout the model allows on the cluster for a global batch (tp
// divides n_kv_heads (Wiola), d_a, d_b and V, and stays inside a node; pp <=
// L; micro-batch sizes 1, 2, 4, ...; ZeRO and recompute on and off), ranked
// fastest first, those that do not fit last.
struct SearchSpace {
  int global_batch = 0;  // sequences per optimizer step
  std::vector<int> micro_batch_sizes = {1, 2, 4, 8, 16};
  bool try_recompute = true, try_no_zero = true;
  int max_pp = 0;  // 0: L
  // Wiola, pp > 1: choose each layout's schedule (predict_schedules);
  // false: 1f1b only. try_interleaved: predict the chunked schedules
  // (interleaved, zb-v) too (more stage shapes to time for a CPU compute
  // model).
  bool try_schedules = true, try_interleaved = true;
  // The chunked schedules' chunks cut by balance_chunks: for every layout
  // (slow: a local search each), or (false) only for the best layout's
  // options, the others by the stage balancer. The pick is the same either
  // way (the chunked schedules are never picked).
  bool balance_chunks_everywhere = false;
};
std::vector<Prediction> search_wiola(const ModelConfig& c, const Cluster& cl, ComputeModel& cm, const SearchSpace& sp,
                                     const Precision& prec);
std::vector<Prediction> search_gpt(const GptConfig& g, const Cluster& cl, ComputeModel& cm, const SearchSpace& sp);

// Wall clock and GPU-hours of a run of `tokens` training tokens at the
// prediction's step time, checkpoints every `ckpt_minutes` included.
struct RunEstimate {
  double steps = 0, wall_s = 0, device_hours = 0, checkpoint_s = 0;
  int checkpoints = 0;
};
RunEstimate estimate_run(const Prediction& p, const Workload& w, const Cluster& cl, double tokens, double ckpt_minutes,
                         bool async_ckpt);

}  // namespace wiola::perf
