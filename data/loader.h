// Deterministic, resumable token loader (docs/model.md §6, docs/data.md).
//
// One source: the split's shards are concatenated (in manifest order) into
// one stream of N tokens; sample i is tokens [i*T, i*T + T + 1), i < S =
// floor((N - 1) / T), so windows overlap by one token and may span shards.
// Order: epoch e visits the samples in epoch_permutation(S, seed, e) (or in
// index order when shuffle is off). The stream of epochs is endless; a global
// batch takes the next G samples of it, so a batch that straddles an epoch end
// takes the rest of epoch e and continues with epoch e+1's permutation
// (nothing is dropped). DP rank r gets the contiguous slice [r*G/D, (r+1)*G/D).
// State = (seed, epoch, samples consumed in that epoch), always with
// samples_consumed < S after a batch; restoring it reproduces the stream.
//
// A blend of K sources with weights p_k (normalised to sum 1): each source is
// such a stream of its own (seed blend_source_seed(seed, k)), and sample n of
// the blended stream (n = 0, 1, ...) comes from the source whose count so far
// lags its share most: argmax_k (n+1)*p_k - drawn_k, ties to the lowest k.
// So after any n samples every source has given within one sample of n*p_k,
// whatever the batch size or layout, and a blend of one source is that
// source's plain stream. The state holds each source's cursor and count.
//
// Stages (data.stages): from a step on, other weights p'_k. With stage j
// starting at sample n_j = (from_j - 1) * G and the blend's weights as stage
// 0 (n_0 = 0), source k's target after n + 1 samples is the sum over the
// stages of p_jk times the samples of [0, n + 1) in stage j, and sample n
// comes from argmax_k target_k - drawn_k over the sources with p_jk > 0 in
// its stage (ties to the lowest k). Without stages that is the rule above,
// bit for bit; with them each stage's counts stay within a few samples of
// its shares, each source keeps its cursor across stages, and the state is
// the same (the stage is a function of the samples drawn).
//
// What grows with the corpus: the epoch permutation (4 bytes per sample of
// the split, made once per epoch, the current and the next kept), and one
// small entry per shard. Open shards are bounded: each source keeps at most
// max_open_shards open (an HDF5 file, one file descriptor, a chunk cache of
// 64 MiB / (shards open), 1 to 4 MiB), closing the least recently read to
// open another.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace wiola {

// One source of a blend: a prep output (as TokenLoader's `source`) and its
// share of the training samples (any positive number; normalised over the blend).
struct BlendSource {
  std::string path;
  double weight = 1.0;
  bool operator==(const BlendSource&) const = default;
};

// A stage of a blend (data.stages): from optimizer step `from` (a step is one
// global batch) on, the sources' weights are `weights` (one per source, in
// order, each >= 0, not all 0) instead of the blend's.
struct DataStage {
  int64_t from = 0;
  std::vector<double> weights;
  bool operator==(const DataStage&) const = default;
};

// The stage of step t: 0 for the blend's own weights (before the first
// stage), j + 1 from stages[j].from on.
size_t data_stage_at(const std::vector<DataStage>& stages, int64_t t);

// Where one source of a blend stands.
struct SourceCursor {
  uint64_t epoch = 0;
  uint64_t samples_consumed = 0;  // in the current epoch of this source, < its S
  uint64_t drawn = 0;             // samples this source gave the blend so far (all epochs)
  bool operator==(const SourceCursor&) const = default;
};

// Shards one source keeps open at once unless told otherwise; 0 = all.
inline constexpr size_t kDefaultMaxOpenShards = 64;

struct LoaderState {
  uint64_t seed = 0;
  uint64_t epoch = 0;               // one source: its cursor (0 with a blend)
  uint64_t samples_consumed = 0;    // samples consumed in the current epoch (global)
  std::vector<SourceCursor> blend;  // a blend of several sources: one cursor per source; else empty
  bool operator==(const LoaderState&) const = default;
};

// "" when two tokenizer identities agree, else what differs, as
// " (vocab_size A vs B, eos_id A vs B, tokenizer sha256 a… vs b…)".
std::string tokenizer_difference(uint32_t vocab_a, uint32_t eos_a, const std::string& sha_a, uint32_t vocab_b,
                                 uint32_t eos_b, const std::string& sha_b);

struct DatasetInfo {
  uint32_t vocab_size;
  uint32_t eos_id;
  std::string tokenizer_sha256;
  uint64_t num_tokens;  // a blend: summed over its sources
  uint64_t num_documents;
  uint64_t num_samples;
  std::string tokenizer_file = "";  // as the manifest records it (empty for a bare shard)
  // The split's content hash (data/manifest.h); empty for a bare shard, a
  // manifest that predates it, and a blend (each source has its own).
  std::string content_xxh3 = "";
};

// The permutation of [0, n) for (seed, epoch): xoshiro256** seeded by four
// splitmix64 outputs from x0 = seed ^ (epoch * 0x9E3779B97F4A7C15), then
// Fisher–Yates from the top: for i = n-1..1, j = uniform[0, i] by Lemire's
// unbiased multiply-shift (rejection on the low word), swap(p[i], p[j]).
std::vector<uint32_t> epoch_permutation(uint64_t n, uint64_t seed, uint64_t epoch);

// Source k's order seed in a blend: seed ^ (k * 0xD6E8FEB86659FD93), so
// source 0 keeps the run's seed.
uint64_t blend_source_seed(uint64_t seed, size_t k);

// The source of sample n of a blend, given the samples drawn from each so
// far (sum = n) and the normalised weights: argmax_k (n+1)*p_k - drawn_k.
size_t blend_pick(const std::vector<double>& p, const std::vector<uint64_t>& drawn);

class TokenLoader {
 public:
  // `source`: a manifest file written by prep (split "train"/"val"), a
  // directory holding manifest.json, or a single .h5 shard (split ignored).
  // global_batch = sequences per optimizer step over all DP ranks; it must be
  // a multiple of dp_size. Throws wiola::Error naming the file on bad input.
  // Every shard is opened and checked against the manifest here; at most
  // max_open_shards per source stay open (0 = all), and samples do not
  // depend on it.
  TokenLoader(const std::string& source, const std::string& split, int T, int global_batch, int dp_rank, int dp_size,
              uint64_t seed, bool shuffle = true, bool prefetch = true, size_t max_open_shards = kDefaultMaxOpenShards);
  // A blend of the same split of several sources (made with one tokenizer);
  // one source with any weight is the constructor above. `stages`: other
  // weights from their steps on (a blend of at least two sources).
  TokenLoader(const std::vector<BlendSource>& sources, const std::string& split, int T, int global_batch, int dp_rank,
              int dp_size, uint64_t seed, bool shuffle = true, bool prefetch = true,
              size_t max_open_shards = kDefaultMaxOpenShards, const std::vector<DataStage>& stages = {});
  ~TokenLoader();
  TokenLoader(const TokenLoader&) = delete;
  TokenLoader& operator=(const TokenLoader&) = delete;

  const DatasetInfo& info() const;  // a blend: its sources' together
  int local_batch() const;          // global_batch / dp_size
  int seq_len() const;              // T

  // Sources: 1 without a blend. Each one's info, and its normalised weight.
  size_t num_sources() const;
  const DatasetInfo& source_info(size_t k) const;
  const std::string& source_name(size_t k) const;  // the manifest or shard it read
  double source_share(size_t k) const;

  // Shards over all sources, how many are open now, and how many times one
  // was opened again after the start (reads of a closed shard).
  struct ShardStats {
    size_t shards = 0, open = 0;
    uint64_t reopens = 0;
  };
  ShardStats shard_stats() const;

  // Fills out[local_batch][T+1] with this rank's slice of the next global
  // batch and advances the state by one global batch.
  void next_batch(int32_t* out);
  // The whole next global batch [global_batch][T+1], in global order; does
  // not advance the state.
  void peek_global_batch(int32_t* out) const;
  LoaderState state() const;           // state before the next next_batch
  void restore(const LoaderState& s);  // exact resume (seed and sources must match)

  // Throws naming the source when the data does not fit the model/tokenizer.
  void expect(uint32_t model_vocab_size, const std::string& tokenizer_sha256 = "") const;

  // Tokens [start, start + count) of the split's stream (any position: the
  // evaluation of a whole split reads the tail no sample covers). One source only.
  void read_tokens(uint64_t start, uint64_t count, int32_t* out) const;

  // The `count` samples after state `s` (advancing s), as (source, sample
  // index in that source) pairs.
  struct Sample {
    uint32_t source;
    uint64_t index;
    bool operator==(const Sample&) const = default;
  };
  std::vector<Sample> take_samples(LoaderState& s, uint64_t count) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wiola
