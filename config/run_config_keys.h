// Every key of the run configuration, declared once (docs/config.md): one
// X(...) line per key, in schema order (the order of the effective config and
// of docs/config.md's tables). [model] lines are X(key, field of RunConfig,
// doc): a model key's default is its ModelConfig field's initializer
// (model/config.h). The other sections' lines are X(type, key, default, range,
// doc): run_config.h makes the section structs' fields from them, run_config.cpp
// the schema, the range check of every numeric key (its message names the key
// and the range) and the type column of docs/config.md ("int ≥ 1"). A key
// whose type is an enum (util/named_enum.h) takes exactly its enum's names,
// checked when the config is read; its range and those of bool, string and
// list keys are kAnyValue. Checks between keys (lr_min ≤ lr_max, the grid
// against the model) are run_config.cpp's. [train]'s O(backend_options)
// stands for the train.cuda_* keys, declared in kernels/backend_options.h.
// The doc is the meaning column of docs/config.md (Markdown, one line);
// scripts/config_docs.py writes that file's key tables from it.
// The lists are expanded in run_config.h, whose includes declare the types
// they name (BlendSource, DataStage, StepWindow, dist::Schedule, perf::StageBalance,
// BackendKind).
#pragma once

#include <array>
#include <limits>
#include <string_view>

#include "util/named_enum.h"

namespace wiola {

// A numeric key's values: lo ≤ v (lo < v when lo_open), v < hi when hi_open
// (v ≤ hi otherwise); a side without a bound is infinite.
struct KeyRange {
  double lo = -std::numeric_limits<double>::infinity();
  bool lo_open = false;
  double hi = std::numeric_limits<double>::infinity();
  bool hi_open = false;
};
inline constexpr KeyRange kAnyValue{};
constexpr KeyRange at_least(double lo) { return {lo, false}; }
constexpr KeyRange above(double lo) { return {lo, true}; }
constexpr KeyRange in_co(double lo, double hi) { return {lo, false, hi, true}; }   // [lo, hi)
constexpr KeyRange in_cc(double lo, double hi) { return {lo, false, hi, false}; }  // [lo, hi]

// parallel.data_plane: how backend tensors travel between ranks (train/data_plane.h).
enum class DataPlaneMode { Auto, Nccl, Staged };
constexpr std::array<std::string_view, 3> enum_names(DataPlaneMode) { return {"auto", "nccl", "staged"}; }

// train.lr_schedule: the learning-rate schedule after the warmup (train/lr_schedule.h).
enum class LrScheduleKind { Cosine, Wsd };
constexpr std::array<std::string_view, 2> enum_names(LrScheduleKind) { return {"cosine", "wsd"}; }

// train.decay_shape: the shape of a WSD schedule's decay (train/lr_schedule.h).
enum class DecayShape { Linear, Cosine, OneMinusSqrt };
constexpr std::array<std::string_view, 3> enum_names(DecayShape) { return {"linear", "cosine", "1-sqrt"}; }

}  // namespace wiola

#define WIOLA_MODEL_KEYS(X) \
  X(preset, preset, "one of the [presets](#presets); empty: a custom model, from the defaults below") \
  X(d, model.d, "hidden size d (> 0, divisible by `n_heads`)") \
  X(n_layers, model.L, "layers L (> 0; ATM needs L ≥ 3 to have a layer)") \
  X(n_heads, model.H, "query heads H (divisible by `n_kv_heads`; d/H must be even, SRPE rotates pairs)") \
  X(n_kv_heads, model.Hkv, \
    "KV groups H_kv; query head h uses group h mod H_kv ([model.md §5](model.md#5-parallelism))") \
  X(d_a, model.dA, "DSFF stream A width d_A") \
  X(d_b, model.dB, "DSFF stream B width d_B") \
  X(vocab_size, model.V, "V (≥ 2); must match the tokenizer the data was prepared with") \
  X(seq_len, model.T, "training window T (≥ 2); samples are T+1 tokens ([model.md §6](model.md#6-data))") \
  X(srpe_theta, model.theta0, "SRPE base θ0 (> 1)") \
  X(srpe_spiral_divisor, model.k_s, "SRPE spiral divisor k_s (> 0)") \
  X(srpe_radial_amp, model.a_s, "SRPE radial amplitude a_s") \
  X(srpe_radial_freq, model.f_s, "SRPE radial frequency f_s") \
  X(atm, model.atm, \
    "adaptive token merging in training (layers floor(L/3) ≤ ℓ < floor(2L/3); never in " \
    "eval/generation)") \
  X(atm_tau, model.tau, "ATM merge threshold τ (merge when similarity > τ)") \
  X(lookback, model.Lambda, "cross-layer look-back Λ (> 0)") \
  X(rms_eps, model.eps, "RMSNorm ε (> 0)") \
  X(init_std, model.init_std, \
    "std of the N(0, σ²) init of matrices and embedding (> 0; [model.md " \
    "§3](model.md#3-parameters-names-initialisation))") \
  X(ctx_gate_init, model.phi_init, \
    "initial context-gate logit φ ([model.md §3](model.md#3-parameters-names-initialisation))")

#define WIOLA_TRAIN_KEYS(X, O) \
  X(int, micro_batch, 8, at_least(1), "sequences per rank per micro-step") \
  X(int, grad_accum, 1, at_least(1), "micro-batches per optimizer step") \
  X(int64_t, steps, 0, at_least(0), "T_max, optimizer steps; 0: derived, see below") \
  X(int64_t, tokens, 0, at_least(0), "token budget D used when `steps` = 0; 0: Chinchilla D = 20·N") \
  X(double, lr_max, 3e-4, above(0), "peak LR η_max") \
  X(double, lr_min, 0.0, at_least(0), "final LR η_min (≤ η_max)") \
  X(int64_t, warmup, -1, at_least(-1), \
    "warmup steps T_w; -1: floor((T_max + 10)/20) in integer arithmetic, i.e. 0.05·T_max " \
    "rounded half up ([model.md §4](model.md#4-training))") \
  X(LrScheduleKind, lr_schedule, LrScheduleKind::Cosine, kAnyValue, \
    "after the warmup: `\"cosine\"` to `lr_min` at T_max, or `\"wsd\"` (warmup-stable-decay): " \
    "`lr_max` until the decay's last `decay_steps`, then `decay_shape` down to `lr_min` at T_max; " \
    "a WSD run extends by resuming with more `steps` " \
    "([model.md §4](model.md#wsd))") \
  X(DecayShape, decay_shape, DecayShape::OneMinusSqrt, kAnyValue, \
    "WSD decay shape over its progress p in (0, 1]: `\"linear\"` 1 − p, `\"cosine\"` (1 + cos πp)/2, " \
    "`\"1-sqrt\"` 1 − √p") \
  X(int64_t, decay_steps, 0, at_least(0), "WSD decay length in steps (≤ T_max − T_w); 0: `decay_share` of T_max") \
  X(double, decay_share, 0.2, in_cc(0, 1), \
    "WSD decay length as a share of T_max when `decay_steps` = 0 (rounded to steps, at most T_max − T_w)") \
  X(double, beta1, 0.9, in_co(0, 1), "AdamW β1") \
  X(double, beta2, 0.95, in_co(0, 1), "AdamW β2") \
  X(double, adam_eps, 1e-8, above(0), "AdamW ε") \
  X(double, weight_decay, 0.1, at_least(0), \
    "AdamW decoupled decay on matrices and the embedding, never on γ, δ, φ ([model.md " \
    "§4](model.md#4-training))") \
  X(double, clip, 1.0, kAnyValue, "max global gradient L2 norm, as PyTorch's `clip_grad_norm_`; ≤ 0: no clipping") \
  X(double, z_loss, 0, at_least(0), \
    "z-loss coefficient z: the loss trained on gains z · mean(lse²) over the counted targets (lse = " \
    "log Σ exp(logits), the softmax's log-normaliser; [model.md §4](model.md#4-training)), logged as " \
    "`z_loss` beside `loss` (which stays the cross-entropy); 0: off") \
  X(bool, nonfinite_fatal, false, kAnyValue, \
    "a non-finite gradient norm stops the run instead of skipping the step ([model.md " \
    "§4](model.md#4-training))") \
  X(uint64_t, seed, 1234, kAnyValue, \
    "parameter init seed ([model.md §3](model.md#3-parameters-names-initialisation)); also the " \
    "data order unless `data.seed` is set") \
  X(bool, recompute, false, kAnyValue, \
    "recompute each layer's activations in backward (less memory, ~1 extra forward)") \
  X(int, threads, 0, at_least(0), "OpenMP threads; 0: the runtime default (`OMP_NUM_THREADS`, else all cores)") \
  X(BackendKind, backend, BackendKind::Cpu, kAnyValue, \
    "the op backend, chosen at start-up: `\"cpu\"` (OpenBLAS + OpenMP), or `\"cpu-opaque\"`, a " \
    "debug backend with the same kernels whose memory the host cannot touch outside its ops (any " \
    "host access crashes; fresh memory is NaN; GEMM weights in a refreshed copy). `cpu-opaque` " \
    "gives bit for bit the results of `cpu`, more slowly; use it to check code that must also run " \
    "on a GPU (docs/architecture.md). `\"cpu-bf16\"`: a debug backend with the storage types of " \
    "the GPU's bf16 mode (bf16 activations and weight copies) on the CPU kernels, slow, for " \
    "testing bf16 runs and layouts without a GPU. In builds with `WIOLA_CUDA=ON` also `\"cuda\"` " \
    "(bf16 activations and weights, fp32 master and residual stream) and `\"cuda-fp32\"` (TF32 " \
    "off), see docs/gpu.md; without a usable GPU they fail with the reason") \
  O(backend_options) \
  X(int, log_every, 1, at_least(1), "progress line every N steps") \
  X(int, eval_every, 0, at_least(0), "validation loss every N steps; 0: off") \
  X(int, eval_batches, 4, at_least(1), "global batches per validation") \
  X(std::vector<std::string>, eval_tasks, {}, kAnyValue, \
    "multiple-choice task files (JSONL) scored during training: `acc` and `acc_norm` of each in " \
    "`metrics.jsonl`, TensorBoard and `report.json` ([inference.md](inference.md#downstream-tasks)); " \
    "encoded with the data's tokenizer") \
  X(int, eval_tasks_every, 0, at_least(0), \
    "score `train.eval_tasks` every N steps and at the last step; 0: at the last step only") \
  X(std::string, run_dir, "runs/default", kAnyValue, "output directory: `metrics.jsonl`, `config.toml`, …") \
  X(int64_t, max_steps, 0, at_least(0), \
    "stop after this many steps of the T_max schedule; 0: run all T_max. The LR schedule " \
    "still uses T_max") \
  X(bool, accounting, true, kAnyValue, \
    "per-step time breakdown (compute, exposed communication, bubble, data, optimizer, " \
    "checkpoint) in the log line, `metrics.jsonl` and `report.json` " \
    "([performance.md](performance.md)); on a GPU it synchronises the stream at phase ends. MFU " \
    "is reported either way") \
  X(double, peak_tflops, 0, at_least(0), \
    "MFU denominator per rank in TFLOP/s; 0: the FMA peak of the rank's cores on the CPU (or the " \
    "OpenBLAS sgemm 1024³ rate measured at start where that is higher), the dense BF16 (or TF32) " \
    "datasheet peak of a known GPU " \
    "([performance.md](performance.md#hardware-table))") \
  X(bool, tensorboard, false, kAnyValue, \
    "rank 0 also writes every `metrics.jsonl` number as TensorBoard scalars into " \
    "`RUN_DIR/tensorboard/` ([performance.md](performance.md#tensorboard))") \
  X(std::vector<StepWindow>, trace_steps, {}, kAnyValue, \
    "steps to trace: `[[from, to], ...]`, inclusive, sorted and disjoint. Every rank's schedule " \
    "actions, messages, reductions, optimizer and checkpoint writes on those steps go into one " \
    "Chrome trace, `RUN_DIR/trace.json` (Perfetto, chrome://tracing; " \
    "[performance.md](performance.md#timeline)); on a GPU the same names are NVTX ranges. Empty: off") \
  X(double, straggler_share, 0.2, at_least(0), \
    "warn (log and `report.json`) about a rank whose median own work per step (step time minus " \
    "waiting on other ranks) exceeds its peers' median by more than this share; 0: no " \
    "per-interval check ([performance.md](performance.md#stragglers))") \
  X(double, spike_sigma, 0, at_least(0), \
    "loss-spike policy ([checkpoints.md](checkpoints.md#loss-spikes-rewind-and-skip-the-data)): a " \
    "step whose loss exceeds mean + `spike_sigma` × std of the last `spike_window` steps' losses " \
    "rewinds to the newest checkpoint and skips the data since it; 0: off. Needs " \
    "`checkpoint.dir`") \
  X(int, spike_window, 50, at_least(2), \
    "steps whose losses give that mean and (population) std; detection starts once the " \
    "window is full. Only applied steps with a finite loss enter it") \
  X(int, spike_skipped, 0, at_least(0), \
    "this many consecutive skipped steps (non-finite gradient norm) rewind the same way; 0: " \
    "off. Needs `checkpoint.dir`; not with `nonfinite_fatal`") \
  X(int, spike_max_rewinds, 3, at_least(0), \
    "the run stops with an error at a spike after this many rewinds (counted over resumes)") \
  X(std::vector<StepWindow>, skip_batches, {}, kAnyValue, \
    "data windows to skip: `[[from, to], ...]`, steps, inclusive, sorted and disjoint (1 ≤ from ≤ " \
    "to). The global batch of a step in a window is read and dropped: no forward, backward or " \
    "update (the LR schedule, the step count and the data after the window are as without the " \
    "skip). A rewind adds its window to the list in effect " \
    "([checkpoints.md](checkpoints.md#loss-spikes-rewind-and-skip-the-data))")

#define WIOLA_DATA_KEYS(X) \
  X(std::string, path, "", kAnyValue, \
    "`manifest.json` written by `wiola prep`, the directory holding it, or one `.h5` shard " \
    "(docs/data.md)") \
  X(std::vector<BlendSource>, blend, {}, kAnyValue, \
    "instead of `path`: several sources, each `{ path = \"...\", weight = w }` (w > 0), mixed in " \
    "the shares w / Σw of the samples; `[[data.blend]]` sections work too. All must share one " \
    "tokenizer. Order, validation and resume: " \
    "[data.md](data.md#blends-several-sources-in-fixed-shares). Setting both `path` and `blend` " \
    "is an error") \
  X(std::vector<DataStage>, stages, {}, kAnyValue, \
    "data stages of a blend: `[{ from = step, weights = [w1, w2, ...] }, ...]` (or `[[data.stages]]` " \
    "sections), steps increasing from 2; from its step on, a stage's weights (one per `blend` " \
    "source, ≥ 0, not all 0) replace the blend's, each source keeping its place in its stream. The " \
    "stage is `data_stage` in `metrics.jsonl`; a resume may change only stages after its step " \
    "([data.md](data.md#stages-other-shares-from-a-step-on))") \
  X(bool, shuffle, true, kAnyValue, \
    "visit the windows in a seeded permutation per epoch ([model.md §6](model.md#6-data)); false: " \
    "in order") \
  X(int64_t, seed, -1, at_least(-1), "data order seed; -1: `train.seed`") \
  X(bool, documents, false, kAnyValue, \
    "document masking: each document of a window (it ends with the shards' EOS id) is computed as " \
    "if alone, and EOS targets are masked ([model.md §2](model.md#documents)); false: a window is " \
    "one document. Recorded in checkpoints (a resume may not change it)") \
  X(int, prefetch, 2, at_least(0), "batches the loader thread prepares ahead") \
  X(int, max_open_shards, 64, at_least(0), \
    "shards of each source kept open at once (0: all). Each open shard holds a file " \
    "descriptor, HDF5 state and a chunk cache; samples do not depend on it " \
    "([data.md](data.md#the-loader-at-scale))")

#define WIOLA_PARALLEL_KEYS(X) \
  X(int, tp, 1, at_least(1), \
    "tensor-parallel ranks; must divide `model.n_kv_heads`, `model.d_a`, `model.d_b` and " \
    "`model.vocab_size`") \
  X(int, pp, 1, at_least(1), "pipeline stages (≤ `model.n_layers`)") \
  X(int, dp, 1, at_least(1), "data-parallel replicas; part of the global batch") \
  X(bool, zero, true, kAnyValue, "ZeRO-1: shard fp32 master weights and AdamW state over DP") \
  X(dist::Schedule, schedule, dist::Schedule::OneFOneB, kAnyValue, \
    "pipeline schedule: `\"1f1b\"` (PipeDream-flush), `\"gpipe\"`, `\"zb-h1\"` (1F1B with the " \
    "weight gradients deferred), `\"interleaved\"` (1F1B over `parallel.virtual_stages` " \
    "non-contiguous layer chunks per rank; micro-batches a multiple of `parallel.pp`) or " \
    "`\"zb-v\"` (two chunks per rank in a V, split backward; at least `parallel.pp` " \
    "micro-batches); docs/distributed.md §4. Micro-batches per step are `train.grad_accum`") \
  X(std::vector<int>, layer_cuts, {}, kAnyValue, \
    "the layer boundaries of the pipeline's chunks: `pp` × chunks per rank + 1 increasing " \
    "numbers from 0 to `model.n_layers` (chunks per rank: 1, `virtual_stages` for " \
    "`\"interleaved\"`, 2 for `\"zb-v\"`): the running sums of the layers per chunk that `wiola " \
    "plan` prints for the chunk balancer's cut, or any other; empty: `stage_balance` cuts them") \
  X(int, virtual_stages, 2, at_least(1), \
    "model chunks per rank of the `\"interleaved\"` schedule (the model is cut into " \
    "`pp` × this many chunks, each with at least one layer); other schedules ignore it") \
  X(bool, overlap, true, kAnyValue, \
    "start the DP gradient reduction bucket by bucket during the step's last backward pass " \
    "(results are bit-identical either way)") \
  X(perf::StageBalance, stage_balance, perf::StageBalance::Compute, kAnyValue, \
    "how layers are split into pipeline stages: `\"compute\"` minimises the largest stage's FLOPs " \
    "per token (a layer ≈ 6·its parameters + 6·T·d, the head ≈ 6·V·d, so the last stage gets " \
    "fewer layers); `\"layers\"`: equal layer counts, extra layers in front") \
  X(DataPlaneMode, data_plane, DataPlaneMode::Auto, kAnyValue, \
    "how backend tensors travel between ranks: `\"nccl\"` (GPU backends: NCCL, one GPU per rank), " \
    "`\"staged\"` (MPI, through host memory where the backend's memory is not host memory), " \
    "`\"auto\"`: NCCL for a GPU backend with more than one rank when `libnccl.so.2` loads and no " \
    "two ranks share a GPU, otherwise MPI. See [gpu.md](gpu.md#several-gpus)") \
  X(double, comm_timeout_s, 300, above(0), \
    "seconds a communication may wait for other ranks before the job is aborted with every " \
    "rank's state and the operation at issue ([distributed.md](distributed.md))")

#define WIOLA_CHECKPOINT_KEYS(X) \
  X(std::string, dir, "", kAnyValue, \
    "checkpoint directory (shared by all ranks); empty: no checkpoints, and SIGUSR1/SIGTERM end " \
    "the run as usual") \
  X(int, every, 0, at_least(0), "steps between checkpoints; 0: only at the end. The last step always saves") \
  X(double, minutes, 0, at_least(0), \
    "also save when this many minutes passed since the last save (rank 0's clock; 0: off)") \
  X(bool, resume, true, kAnyValue, \
    "resume from the newest sound checkpoint in `dir` (damaged ones are skipped with a warning)") \
  X(int, keep, 2, at_least(1), "newest checkpoints kept; older ones are deleted after each save") \
  X(int, keep_every, 0, at_least(0), "also keep for good every checkpoint whose step is a multiple of this (0: none)") \
  X(bool, async, true, kAnyValue, "write in a background thread while training goes on (false: the step loop waits)") \
  X(double, max_failed_minutes, 60, at_least(0), \
    "a save that fails (disk full, not writable) is a warning and training goes on, saving again " \
    "at the next checkpoint; when saves have failed for this many minutes (from the first failure " \
    "since the last saved checkpoint; 0: at the first failure) the run stops with the error, " \
    "exit status 1. A failed final save always ends the run that way " \
    "([checkpoints.md](checkpoints.md#when-a-save-fails))") \
  X(std::string, init_from, "", kAnyValue, \
    "weights-only start: parameters from this checkpoint (a step folder or a checkpoint " \
    "directory), new optimizer state, data from the start. Ignored when `dir` holds a checkpoint " \
    "to resume")
