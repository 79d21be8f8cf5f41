// Pipeline schedules (docs/model.md §5, docs/distributed.md §4): the ordered
// list of forward/backward micro-batch actions one stage runs in a step
// (1F1B, GPipe, interleaved 1F1B, ZB-H1 with its split backward, ZB-V on
// two chunks per rank placed in a V), and the
// event simulation of a whole pipeline that proves a set of them
// deadlock-free and gives the bubble and the peak live activations. Pure
// logic, no communication: the trainer walks the list, receiving inputs
// before and sending outputs after each action.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "util/named_enum.h"

namespace wiola::dist {

// The pipeline schedules by name (parallel.schedule; util/named_enum.h):
// "1f1b", "gpipe", "zb-h1", "interleaved" (virtual_stages chunks per rank)
// and "zb-v" (two chunks per rank in a V).
enum class Schedule { OneFOneB, GPipe, ZbH1, Interleaved, ZbV };
constexpr std::array<std::string_view, 5> enum_names(Schedule) {
  return {"1f1b", "gpipe", "zb-h1", "interleaved", "zb-v"};
}
// Schedules that run the backward split into B and W actions (ZB-H1, ZB-V).
constexpr bool split_backward(Schedule s) { return s == Schedule::ZbH1 || s == Schedule::ZbV; }
// Schedules with more than one model chunk per rank (interleaved, ZB-V).
constexpr bool chunked(Schedule s) { return s == Schedule::Interleaved || s == Schedule::ZbV; }

// Action kinds. Bwd is the whole backward of a micro-batch (input and weight
// gradients together, what 1F1B and GPipe run); a split backward runs it as
// BwdInput (B: the gradients of the chunk's inputs, which the previous chunk
// waits for) and later BwdWeight (W: the weight gradients, which nothing in
// the pipeline waits for). B then W equals Bwd.
enum class Op { Fwd, Bwd, BwdInput, BwdWeight };
// One action of a stage: op on micro-batch `micro` of this rank's model
// chunk `chunk` (a virtual stage; 0 for the plain schedules). With v chunks
// per rank over p ranks the model is cut into p·v chunks and rank s holds
// the global chunks s, s + p, …, s + (v − 1)p: chunk c of rank s is global
// chunk g = c·p + s, so the hidden state goes from the last rank back to
// the first between chunks.
struct Action {
  Op op;
  int micro;
  int chunk = 0;
  bool operator==(const Action&) const = default;
};

// Where a rank's chunks sit in the model. Interleaved (above): chunk c of
// rank s is global chunk c·p + s, every chunk's pass runs over the ranks
// 0 → p − 1. V (ZB-V): the passes alternate direction, chunk c of rank s is
// global chunk c·p + s for even c and c·p + (p − 1 − s) for odd c; with two
// chunks rank s holds g = s and g = 2p − 1 − s, so the last chunk (the head)
// is back on rank 0 and chunks p − 1 and p meet on rank p − 1 (no transfer
// between them).
enum class ChunkPlacement { Interleaved, V };
int global_chunk(int pp, int stage, int chunk, ChunkPlacement placement);
// The rank that holds global chunk g.
int chunk_rank(int pp, int g, ChunkPlacement placement);

// 1F1B (PipeDream-flush): min(pp − stage − 1, m) warm-up forwards, then
// alternate one forward / one backward, then the remaining backwards. At most
// pp − stage micro-batches' activations are alive on a stage.
std::vector<Action> schedule_1f1b(int pp, int stage, int m);
// GPipe: all m forwards, then all m backwards (in forward order). Up to m
// micro-batches' activations alive.
std::vector<Action> schedule_gpipe(int pp, int stage, int m);
// Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021) with v chunks per
// rank; v = 1 is schedule_1f1b. Needs m % pp == 0 (v > 1): micro-batches go
// through the chunks in groups of pp. The rank's k-th forward is micro-batch
// (k / (pp·v))·pp + k % pp of chunk (k / pp) % v; its k-th backward the same
// micro-batch of chunk v − 1 − (k / pp) % v. Warm-up: min(m·v, (v − 1)·pp +
// 2(pp − stage − 1)) forwards, then one forward / one backward, then the
// rest. The doubled 2(pp − stage − 1) (Megatron-LM's) leaves every backward
// one round of slack for its transfer: with (pp − stage − 1) the balanced
// pipeline is as fast without link delay but pays each hop in the steady
// state with one. Balanced chunks, no delay: the bubble is
// ((p − 1)/v)/(m + (p − 1)/v), v times less fill/drain time than 1F1B's.
// Peak live chunk activations: min(m·v, warm-up + 1), each chunk 1/v of the
// rank's layers.
std::vector<Action> schedule_interleaved(int pp, int stage, int m, int v);
// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B's
// order of forwards and input-gradient backwards (B), with the weight
// gradients (W) deferred: stage s keeps up to s W's pending, runs the oldest
// pending W after each B once more than s are pending, and the rest after its
// last B, where 1F1B's drain leaves it idle. Live activations (from F to W)
// peak at min(pp, m) on every stage, 1F1B's peak (stage 0's). Balanced
// stages, m ≥ pp, T_W ≤ T_B, no link delay: makespan m(T_F + T_B + T_W) +
// (p − 1)(T_F + T_B − T_W) against 1F1B's (m + p − 1)(T_F + T_B + T_W).
//
// The optimizer's global synchronisation (the gradient-norm clip and the
// non-finite skip need every gradient of the step): the optimizer step
// waits for the step's last W on every rank; no post-validation, no
// speculative update. Its cost is the W's the last stages run after their
// last B, at the end of the step: in the simulation the makespan ends with
// the last action, W's included, so the bubble figures contain it.
std::vector<Action> schedule_zb_h1(int pp, int stage, int m);
// ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", the V-shaped
// schedule; the phase structure of DeepSeek's DualPipeV, run one action at
// a time): two chunks per rank in ChunkPlacement::V, every backward split
// (I, then W at once or deferred). With w = min(2(pp − stage − 1), m −
// stage − 1) (2(pp − stage − 1) when m ≥ 2p − 1), w₁ = ⌈w/2⌉, w₂ = w − w₁,
// stage s runs
//   warm-up   w × F0, then s + 1 × (F0 F1)      — 2p chunks live, 1F1B's peak
//             w₁ × (B1 F1)
//   steady    m − w − s − 1 × (B1 F0 B0 F1)
//   cool-down w₂ × (B1 B0 F1), s + 1 × (B1 B0*), w₁ × (W B0*), the deferred W's
// where Fc/Bc are chunk c's forward / backward (B = I W), B0* an input
// gradient whose W is deferred (the oldest deferred W runs first).
// Needs m ≥ pp (the last rank's warm-up runs p micro-batches through both
// its chunks); throws otherwise. For p ≤ m < 2p − 1 rank 0 cannot fill the
// V's round trip with forwards and the pipeline idles more (deadlock-free,
// at most the same memory; below m = 2p − 2 slower than ZB-H1 on the same
// work); the figures below need m ≥ 2p − 1.
// Live chunk activations peak at 2p on every rank (m ≥ 2p − 1; at most 2p
// otherwise): p micro-batches of the rank's layers, 1F1B's peak (its stage
// 0). Balanced chunks, T_F = T_B =
// T_W per chunk, no link delay, m ≥ 2p − 1: makespan 2m(T_F + T_B + T_W) + (p − 1)T_F,
// the least any schedule can have (the last rank waits (p − 1)T_F for its
// first input and then has 2m(T_F + T_B + T_W) of work): no rank idles
// except the first micro-batch's way down the first leg of the V and the
// matching tail on the earlier ranks. That is the paper's "zero bubble":
// with its post-validation the next step's fill overlaps this step's tail;
// here the optimizer waits for every rank's last W (as ZB-H1, above), so
// that fill stays in the step.
std::vector<Action> schedule_zb_v(int pp, int stage, int m);

// Idle fraction of a balanced pipeline: (p − 1)/(m + p − 1).
double bubble_fraction_predicted(int pp, int m);
// The same for interleaved 1F1B with v chunks per rank (no link delay):
// ((p − 1)/v)/(m + (p − 1)/v).
double bubble_fraction_interleaved(int pp, int m, int v);

// Peak number of (micro-batch, chunk) activations alive: each from its
// forward until its Bwd or BwdWeight.
int max_in_flight(const std::vector<Action>& s);
// The actions of s on model chunk `chunk`, in order (a chunk's own peaks:
// max_in_flight and max_pending_weight of them).
std::vector<Action> chunk_actions(const std::vector<Action>& s, int chunk);
// Peak number of (micro-batch, chunk) whose BwdInput ran and BwdWeight not
// yet: the W operands a split backward keeps at once (ZB-H1: stage + 1).
int max_pending_weight(const std::vector<Action>& s);

// Event simulation of a whole pipeline: schedules[s] for every rank s. With
// v chunks per rank (v − 1 = the largest chunk index), global chunk g =
// global_chunk(p, s, c, placement) (interleaved: c·p + s): Fwd(i) of g
// needs Fwd(i) of g − 1 (on rank chunk_rank(p, g − 1)), Bwd or
// BwdInput (i) of g needs Fwd(i) of g on the rank and the input gradient
// (Bwd or BwdInput (i)) of g + 1, BwdWeight(i) of g needs BwdInput(i) of g.
// Each action takes t_fwd / t_bwd (Bwd) / t_bwd − t_w (BwdInput) / t_w
// (BwdWeight); sends are free and non-blocking, and a message between two
// chunks of the same rank (V: chunks p − 1 and p) has no link delay. Throws wiola::Error naming
// the stuck stages on deadlock, and on an action repeated or a backward
// both whole and split.
struct PipelineSim {
  double makespan = 0;         // time of the last action's end (W's included)
  double bubble_fraction = 0;  // 1 − busy/(pp·makespan)
  // The bubble split (docs/distributed.md §4): bubble_fill_drain is the
  // bubble fraction of the same schedules with every stage at the mean
  // stage cost (same total work, same link); bubble_imbalance is the rest,
  // bubble_fraction − bubble_fill_drain. Balanced stages: imbalance 0.
  double bubble_fill_drain = 0, bubble_imbalance = 0;
  std::vector<std::vector<double>> start;  // start[s][k]: action k of stage s
  std::vector<std::vector<double>> end;    // end[s][k]: its end
  std::vector<int> peak_live;              // per rank, as max_in_flight
};
PipelineSim simulate_pipeline(const std::vector<std::vector<Action>>& schedules, double t_fwd, double t_bwd);
// B and W timed apart: Bwd takes t_bwd_input + t_bwd_weight.
PipelineSim simulate_pipeline(const std::vector<std::vector<Action>>& schedules, double t_fwd, double t_bwd_input,
                              double t_bwd_weight, ChunkPlacement placement = ChunkPlacement::Interleaved);
// The same with a forward and a backward cost per global chunk (per stage
// when v = 1; uneven stages: the last one runs the head), the weight-gradient
// part of each backward (bwd_weight; empty: none, B = the whole backward)
// and `link` seconds between a message's send and its arrival on another
// rank (the cost model's pipeline transfers, perf/). Uneven stages are
// simulated twice: as given, and at the mean costs for the bubble split.
struct StageCosts {
  std::vector<double> fwd, bwd;
  double link = 0;
  std::vector<double> bwd_weight = {};  // W's share of bwd; empty: 0
};
PipelineSim simulate_pipeline(const std::vector<std::vector<Action>>& schedules, const StageCosts& cost,
                              ChunkPlacement placement = ChunkPlacement::Interleaved);

// "F0 F1 B0 F2 B1 ...": F, B (Bwd), I (BwdInput), W (BwdWeight), then the
// micro-batch and, for chunk c > 0, ".c" ("F3.1": micro-batch 3, chunk 1).
std::string to_string(const Action& a);
std::string to_string(const std::vector<Action>& s);

}  // namespace wiola::dist
