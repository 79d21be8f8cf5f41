#include "data/loader.h"

#include <algorithm>
#include <condition_variable>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "data/manifest.h"
#include "data/shard.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace wiola {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Xoshiro256ss {
  uint64_t s[4];
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t next() {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
  }
  // Uniform in [0, bound) (Lemire 2019).
  uint64_t below(uint64_t bound) {
    __uint128_t m = __uint128_t(next()) * bound;
    uint64_t lo = uint64_t(m);
    if (lo < bound) {
      uint64_t t = (0 - bound) % bound;
      while (lo < t) {
        m = __uint128_t(next()) * bound;
        lo = uint64_t(m);
      }
    }
    return uint64_t(m >> 64);
  }
};

bool looks_like_hdf5(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char sig[8] = {};
  f.read(sig, 8);
  return f && std::memcmp(sig, "\x89HDF\r\n\x1a\n", 8) == 0;
}

}  // namespace

std::string tokenizer_difference(uint32_t vocab_a, uint32_t eos_a, const std::string& sha_a, uint32_t vocab_b,
                                 uint32_t eos_b, const std::string& sha_b) {
  if (vocab_a == vocab_b && eos_a == eos_b && sha_a == sha_b) return "";
  return detail::concat(" (vocab_size ", vocab_a, " vs ", vocab_b, ", eos_id ", eos_a, " vs ", eos_b,
                        ", tokenizer sha256 ", sha_a.substr(0, 12), "… vs ", sha_b.substr(0, 12), "…)");
}

std::vector<uint32_t> epoch_permutation(uint64_t n, uint64_t seed, uint64_t epoch) {
  WIOLA_CHECK(n < (uint64_t(1) << 32), "epoch_permutation: ", n, " samples is more than 2^32");
  std::vector<uint32_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = uint32_t(i);
  uint64_t x = seed ^ (epoch * 0x9E3779B97F4A7C15ull);
  Xoshiro256ss rng;
  for (uint64_t& w : rng.s) w = splitmix64(x);
  for (uint64_t i = n; i-- > 1;) std::swap(p[i], p[rng.below(i + 1)]);
  return p;
}

uint64_t blend_source_seed(uint64_t seed, size_t k) { return seed ^ (uint64_t(k) * 0xD6E8FEB86659FD93ull); }

size_t blend_pick(const std::vector<double>& p, const std::vector<uint64_t>& drawn) {
  uint64_t n = 0;
  for (uint64_t d : drawn) n += d;
  size_t best = 0;
  double lag = -1e300;
  for (size_t k = 0; k < p.size(); ++k) {
    const double l = double(n + 1) * p[k] - double(drawn[k]);
    if (l > lag) lag = l, best = k;
  }
  return best;
}

size_t data_stage_at(const std::vector<DataStage>& stages, int64_t t) {
  size_t j = 0;
  while (j < stages.size() && stages[j].from <= t) ++j;
  return j;
}

namespace {

// HDF5's cache of decompressed chunks for each open shard of a source: 64 MiB
// shared by the shards open at once, from 1 to 4 MiB each. In a large corpus
// random training samples rarely meet a cached chunk whatever its size (a
// chunk of the default 16384 tokens holds 8 of the millions of samples);
// in-order reads (validation) need one or two; a small corpus (up to 16
// shards) keeps 4 MiB each, as before, and with it shards of ~2 M tokens whole.
size_t chunk_cache_bytes(size_t shards, size_t max_open) {
  const size_t open = std::max<size_t>(1, max_open == 0 ? shards : std::min(shards, max_open));
  return std::clamp<size_t>((size_t(64) << 20) / open, size_t(1) << 20, size_t(4) << 20);
}

// One source's split: its shards as one token stream, and its epoch orders.
// At most max_open of its shards are open at a time (0: all); a read of a
// closed one closes the least recently read and reopens it, checking it
// against the manifest again.
struct Source {
  struct File {
    std::string path;
    uint64_t num_tokens = 0, num_documents = 0;
  };
  std::string name;  // the manifest or shard read (for messages)
  std::vector<File> files;
  size_t chunk_cache = size_t(4) << 20;  // per open shard: chunk_cache_bytes()
  std::vector<uint64_t> starts;          // first token of each shard in the stream
  DatasetInfo info{};
  size_t max_open = 0;

  // The open shards (null while closed), when each was last read, and counts.
  mutable std::mutex io_mu;
  mutable std::vector<std::unique_ptr<ShardReader>> open;
  mutable std::vector<uint64_t> last_use;
  mutable size_t n_open = 0;
  mutable uint64_t tick = 0, reopens = 0;

  mutable std::mutex perm_mu;
  mutable std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<const std::vector<uint32_t>>> perms;  // (seed, epoch)

  Source(const std::string& source, const std::string& split, int T, size_t max_open);

  std::shared_ptr<const std::vector<uint32_t>> perm(uint64_t seed, uint64_t epoch) const {
    std::lock_guard<std::mutex> lock(perm_mu);
    auto key = std::make_pair(seed, epoch);
    auto it = perms.find(key);
    if (it != perms.end()) return it->second;
    auto p = std::make_shared<const std::vector<uint32_t>>(epoch_permutation(info.num_samples, seed, epoch));
    // Keep two: a batch across an epoch end reads epochs e and e + 1. Each
    // is 4 bytes per sample (85 MB at 21 M samples).
    while (perms.size() >= 2) perms.erase(perms.begin());
    perms[key] = p;
    return p;
  }

  // The sample at (epoch, consumed), then the cursor moves on (into the
  // next epoch after the last sample, so a stored cursor is always < S).
  uint64_t advance(uint64_t seed, bool shuffle, uint64_t& epoch, uint64_t& consumed) const {
    const uint64_t idx = shuffle ? uint64_t((*perm(seed, epoch))[consumed]) : consumed;
    if (++consumed == info.num_samples) {
      ++epoch;
      consumed = 0;
    }
    return idx;
  }

  // Throws unless shard k's attributes are the manifest's.
  void check(const ShardReader& r, size_t k) const {
    const ShardMeta& s = r.meta();
    const std::string diff = tokenizer_difference(s.vocab_size, s.eos_id, s.tokenizer_sha256, info.vocab_size,
                                                  info.eos_id, info.tokenizer_sha256);
    if (!diff.empty()) fail(files[k].path, ": shard does not match the manifest ", name, diff);
    if (s.num_tokens != files[k].num_tokens || s.num_documents != files[k].num_documents)
      fail(files[k].path, ": shard holds ", s.num_tokens, " tokens / ", s.num_documents, " documents, manifest ", name,
           " says ", files[k].num_tokens, " / ", files[k].num_documents);
  }

  // Shard k, open (io_mu held).
  const ShardReader& reader(size_t k) const {
    if (!open[k]) {
      if (max_open > 0 && n_open >= max_open) {
        size_t lru = files.size();
        for (size_t j = 0; j < files.size(); ++j)
          if (open[j] && (lru == files.size() || last_use[j] < last_use[lru])) lru = j;
        open[lru].reset();
        --n_open;
      }
      auto r = std::make_unique<ShardReader>(files[k].path, chunk_cache);
      check(*r, k);
      open[k] = std::move(r);
      ++n_open;
      ++reopens;
    }
    last_use[k] = ++tick;
    return *open[k];
  }

  // Stream tokens [start, start + count), across shard boundaries.
  void read_tokens(uint64_t start, uint64_t left, int32_t* out) const {
    size_t k = size_t(std::upper_bound(starts.begin(), starts.end(), start) - starts.begin()) - 1;
    std::lock_guard<std::mutex> lock(io_mu);
    while (left > 0) {
      WIOLA_CHECK(k < files.size(), name, ": tokens from ", start, " run past the end of the data");
      uint64_t off = start - starts[k];
      uint64_t n = std::min(left, files[k].num_tokens - off);
      reader(k).read(off, n, out);
      out += n;
      left -= n;
      start += n;
      ++k;
    }
  }
};

Source::Source(const std::string& source, const std::string& split, int T, size_t max_open_shards)
    : name(source), max_open(max_open_shards) {
  std::error_code ec;
  std::string path = source;
  if (fs::is_directory(path, ec)) {
    path = (fs::path(source) / kManifestName).string();
    if (!fs::exists(path, ec))
      fail(source, ": no ", kManifestName, " in this folder (not a prep output, or prep did not finish)");
  } else if (!fs::exists(path, ec)) {
    fail(source, ": no such file or directory");
  }
  if (looks_like_hdf5(path)) {
    open.push_back(std::make_unique<ShardReader>(path));
    const ShardMeta& s = open[0]->meta();
    files.push_back({path, s.num_tokens, s.num_documents});
    info = DatasetInfo{s.vocab_size, s.eos_id, s.tokenizer_sha256, s.num_tokens, s.num_documents, 0};
    n_open = 1;
  } else {
    Manifest man = read_manifest(path);
    auto it = man.splits.find(split);
    if (it == man.splits.end()) {
      std::string have;
      for (auto& [k, v] : man.splits) have += (have.empty() ? "" : ", ") + k;
      fail(path, ": manifest has no split '", split, "' (it has: ", have.empty() ? "none" : have, ")");
    }
    name = path;
    info = DatasetInfo{man.vocab_size, man.eos_id, man.tokenizer_sha256, 0, 0, 0, man.tokenizer_file, it->second.xxh3};
    // Every shard is opened and checked now (a bad one fails the start, not
    // a step hours later); the first max_open stay open.
    chunk_cache = chunk_cache_bytes(it->second.shards.size(), max_open);
    for (const ManifestShard& e : it->second.shards) {
      files.push_back({e.path, e.num_tokens, e.num_documents});
      auto r = std::make_unique<ShardReader>(e.path, chunk_cache);
      check(*r, files.size() - 1);
      info.num_documents += e.num_documents;
      info.num_tokens += e.num_tokens;
      if (max_open == 0 || n_open < max_open) {
        open.push_back(std::move(r));
        ++n_open;
      } else {
        open.emplace_back();
      }
    }
    if (info.num_tokens != it->second.num_tokens)
      fail(path, ": split '", split, "' says ", it->second.num_tokens, " tokens but its shards hold ", info.num_tokens);
  }
  last_use.assign(files.size(), 0);
  uint64_t first = 0;
  for (const File& f : files) {
    starts.push_back(first);
    first += f.num_tokens;
  }
  if (info.num_tokens < uint64_t(T) + 1)
    fail(name, ": split '", split, "' holds ", info.num_tokens, " tokens, fewer than T+1 = ", T + 1,
         " (not one training sample)");
  info.num_samples = (info.num_tokens - 1) / uint64_t(T);
  WIOLA_CHECK(info.num_samples < (uint64_t(1) << 32), name, ": more than 2^32 samples");
}

// A blend's stage (data.stages; stage 0: the blend's own weights from
// sample 0): where it starts, its normalised weights, and each source's
// target at its start.
struct BlendStage {
  uint64_t start = 0;
  std::vector<double> p, base;
};

// The stages of `stages` after the blend's `share` (stage 0), each checked.
std::vector<BlendStage> blend_stages(const std::vector<double>& share, const std::vector<DataStage>& stages,
                                     uint64_t G) {
  std::vector<BlendStage> out{{0, share, std::vector<double>(share.size(), 0.0)}};
  for (size_t j = 0; j < stages.size(); ++j) {
    const DataStage& d = stages[j];
    WIOLA_CHECK(share.size() >= 2, "loader: data stages need a blend of at least two sources");
    WIOLA_CHECK(d.weights.size() == share.size(), "loader: stage ", j + 1, " has ", d.weights.size(), " weights for ",
                share.size(), " sources");
    WIOLA_CHECK(d.from >= 2 && (j == 0 || d.from > stages[j - 1].from), "loader: stage ", j + 1, " from step ", d.from,
                ": stages start at step 2 or later, in increasing order");
    double total = 0;
    for (double w : d.weights) {
      WIOLA_CHECK(std::isfinite(w) && w >= 0, "loader: stage ", j + 1, " has weight ", w,
                  "; weights must be finite and >= 0");
      total += w;
    }
    WIOLA_CHECK(total > 0 && std::isfinite(total), "loader: stage ", j + 1, "'s weights must not all be 0");
    const BlendStage& prev = out.back();
    BlendStage st{uint64_t(d.from - 1) * G, {}, {}};
    for (size_t k = 0; k < share.size(); ++k) {
      st.p.push_back(d.weights[k] / total);
      st.base.push_back(prev.base[k] + prev.p[k] * double(st.start - prev.start));
    }
    out.push_back(std::move(st));
  }
  return out;
}

// The source of sample n in stage `st` (staged blends; docs above).
size_t staged_pick(const BlendStage& st, uint64_t n, const std::vector<uint64_t>& drawn) {
  size_t best = 0;
  double lag = -1e300;
  for (size_t k = 0; k < st.p.size(); ++k) {
    if (st.p[k] == 0) continue;
    const double l = st.base[k] + st.p[k] * double(n + 1 - st.start) - double(drawn[k]);
    if (l > lag) lag = l, best = k;
  }
  return best;
}

}  // namespace

struct TokenLoader::Impl {
  std::vector<std::unique_ptr<Source>> sources;
  std::vector<double> share;       // normalised weights (a blend)
  std::vector<BlendStage> stages;  // data.stages after stage 0 (the blend's share); empty: none
  DatasetInfo info{};              // the sources' together
  std::string name;                // for messages: the source, or "the blend of ..."
  int T = 0, G = 0, rank = 0, dp = 1, local = 0;
  bool shuffle = true;
  LoaderState state;

  bool prefetch = true;
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  struct Item {
    LoaderState before, after;
    std::vector<int32_t> data;
    std::exception_ptr err;
  };
  std::deque<Item> queue;
  LoaderState cursor;
  uint64_t generation = 0;
  bool stop = false, failed = false;
  static constexpr size_t kDepth = 4;

  bool blended() const { return sources.size() > 1; }

  std::vector<Sample> take(LoaderState& s, uint64_t count) const {
    std::vector<Sample> out;
    out.reserve(count);
    if (!blended()) {
      for (uint64_t c = 0; c < count; ++c)
        out.push_back({0, sources[0]->advance(s.seed, shuffle, s.epoch, s.samples_consumed)});
      return out;
    }
    std::vector<uint64_t> drawn(sources.size());
    uint64_t n = 0;
    for (size_t k = 0; k < sources.size(); ++k) n += drawn[k] = s.blend[k].drawn;
    size_t j = 0;
    for (uint64_t c = 0; c < count; ++c, ++n) {
      while (j + 1 < stages.size() && stages[j + 1].start <= n) ++j;
      const size_t k = stages.empty() ? blend_pick(share, drawn) : staged_pick(stages[j], n, drawn);
      SourceCursor& q = s.blend[k];
      out.push_back(
          {uint32_t(k), sources[k]->advance(blend_source_seed(s.seed, k), shuffle, q.epoch, q.samples_consumed)});
      q.drawn = ++drawn[k];
    }
    return out;
  }

  void read_sample(const Sample& x, int32_t* out) const {
    sources[x.source]->read_tokens(x.index * uint64_t(T), uint64_t(T) + 1, out);
  }

  // This rank's slice of the global batch after `s` (advancing s).
  void produce(LoaderState& s, int32_t* out) const {
    std::vector<Sample> idx = take(s, uint64_t(G));
    for (int j = 0; j < local; ++j) read_sample(idx[size_t(rank * local + j)], out + size_t(j) * size_t(T + 1));
  }

  void run_worker() {
    std::unique_lock<std::mutex> lk(mu);
    while (true) {
      cv.wait(lk, [&] { return stop || (!failed && queue.size() < kDepth); });
      if (stop) return;
      Item it;
      it.before = cursor;
      uint64_t gen = generation;
      lk.unlock();
      LoaderState s = it.before;
      try {
        it.data.resize(size_t(local) * size_t(T + 1));
        produce(s, it.data.data());
      } catch (...) {
        it.err = std::current_exception();
      }
      it.after = s;
      lk.lock();
      if (gen != generation) continue;  // restore() happened meanwhile
      if (it.err) failed = true;
      cursor = s;
      queue.push_back(std::move(it));
      cv.notify_all();
    }
  }

  void start_worker() {
    if (prefetch) worker = std::thread([this] { run_worker(); });
  }
  void stop_worker() {
    if (!worker.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
};

TokenLoader::TokenLoader(const std::string& source, const std::string& split, int T, int global_batch, int dp_rank,
                         int dp_size, uint64_t seed, bool shuffle, bool prefetch, size_t max_open_shards)
    : TokenLoader(std::vector<BlendSource>{{source, 1.0}}, split, T, global_batch, dp_rank, dp_size, seed, shuffle,
                  prefetch, max_open_shards) {}

TokenLoader::TokenLoader(const std::vector<BlendSource>& blend, const std::string& split, int T, int global_batch,
                         int dp_rank, int dp_size, uint64_t seed, bool shuffle, bool prefetch, size_t max_open_shards,
                         const std::vector<DataStage>& stages)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  WIOLA_CHECK(T > 0, "loader: sequence length T must be positive (got ", T, ")");
  WIOLA_CHECK(global_batch > 0, "loader: global batch must be positive (got ", global_batch, ")");
  WIOLA_CHECK(dp_size > 0 && dp_rank >= 0 && dp_rank < dp_size, "loader: bad DP rank ", dp_rank, " of ", dp_size);
  WIOLA_CHECK(global_batch % dp_size == 0, "loader: global batch ", global_batch, " is not a multiple of DP size ",
              dp_size);
  WIOLA_CHECK(!blend.empty(), "loader: no data source");
  m.T = T;
  m.G = global_batch;
  m.rank = dp_rank;
  m.dp = dp_size;
  m.local = global_batch / dp_size;
  m.shuffle = shuffle;
  m.prefetch = prefetch;
  m.state.seed = seed;

  double total = 0;
  for (size_t k = 0; k < blend.size(); ++k) {
    const BlendSource& b = blend[k];
    WIOLA_CHECK(std::isfinite(b.weight) && b.weight > 0, "loader: source ", k + 1, " (", b.path, ") has weight ",
                b.weight, "; weights must be positive");
    total += b.weight;
    m.sources.push_back(std::make_unique<Source>(b.path, split, T, max_open_shards));
  }
  WIOLA_CHECK(std::isfinite(total), "loader: the blend's weights add up to more than a double holds");
  for (const BlendSource& b : blend) m.share.push_back(b.weight / total);
  if (!stages.empty()) m.stages = blend_stages(m.share, stages, uint64_t(global_batch));
  m.info = m.sources[0]->info;
  m.name = m.sources[0]->name;
  if (m.blended()) {
    m.name = "the blend of " + std::to_string(blend.size()) + " sources";
    m.state.blend.resize(blend.size());
    m.info.num_tokens = m.info.num_documents = m.info.num_samples = 0;
    m.info.content_xxh3.clear();
    const Source& first = *m.sources[0];
    for (const auto& s : m.sources) {
      const DatasetInfo& d = s->info;
      const std::string diff = tokenizer_difference(d.vocab_size, d.eos_id, d.tokenizer_sha256, first.info.vocab_size,
                                                    first.info.eos_id, first.info.tokenizer_sha256);
      if (!diff.empty())
        fail(s->name, ": made with another tokenizer than ", first.name, diff, "; a blend needs one tokenizer");
      m.info.num_tokens += d.num_tokens;
      m.info.num_documents += d.num_documents;
      m.info.num_samples += d.num_samples;
      if (m.info.tokenizer_file.empty()) m.info.tokenizer_file = d.tokenizer_file;
    }
  }
  m.cursor = m.state;
  m.start_worker();
}

TokenLoader::~TokenLoader() { impl_->stop_worker(); }

const DatasetInfo& TokenLoader::info() const { return impl_->info; }
int TokenLoader::local_batch() const { return impl_->local; }
int TokenLoader::seq_len() const { return impl_->T; }
size_t TokenLoader::num_sources() const { return impl_->sources.size(); }
const DatasetInfo& TokenLoader::source_info(size_t k) const { return impl_->sources.at(k)->info; }
const std::string& TokenLoader::source_name(size_t k) const { return impl_->sources.at(k)->name; }
double TokenLoader::source_share(size_t k) const { return impl_->share.at(k); }

TokenLoader::ShardStats TokenLoader::shard_stats() const {
  ShardStats st;
  for (const auto& s : impl_->sources) {
    std::lock_guard<std::mutex> lock(s->io_mu);
    st.shards += s->files.size();
    st.open += s->n_open;
    st.reopens += s->reopens;
  }
  return st;
}
LoaderState TokenLoader::state() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->state;
}

std::vector<TokenLoader::Sample> TokenLoader::take_samples(LoaderState& s, uint64_t count) const {
  WIOLA_CHECK(s.blend.size() == (impl_->blended() ? impl_->sources.size() : 0), impl_->name,
              ": take_samples from a state of ", s.blend.size(), " blend sources");
  return impl_->take(s, count);
}

void TokenLoader::next_batch(int32_t* out) {
  Impl& m = *impl_;
  const size_t n = size_t(m.local) * size_t(m.T + 1);
  if (!m.prefetch) {
    LoaderState s = m.state;
    m.produce(s, out);
    m.state = s;
    return;
  }
  std::unique_lock<std::mutex> lk(m.mu);
  m.cv.wait(lk, [&] { return !m.queue.empty(); });
  Impl::Item it = std::move(m.queue.front());
  if (it.err) std::rethrow_exception(it.err);  // stays queued: the loader is stuck until restore()
  m.queue.pop_front();
  m.state = it.after;
  lk.unlock();
  m.cv.notify_all();
  std::memcpy(out, it.data.data(), n * sizeof(int32_t));
}

void TokenLoader::peek_global_batch(int32_t* out) const {
  const Impl& m = *impl_;
  LoaderState s = state();
  std::vector<Sample> idx = m.take(s, uint64_t(m.G));
  for (int j = 0; j < m.G; ++j) m.read_sample(idx[size_t(j)], out + size_t(j) * size_t(m.T + 1));
}

namespace {
// A cursor read from a checkpoint at the end of an epoch moves into the next.
void check_cursor(const std::string& name, uint64_t S, uint64_t& epoch, uint64_t& consumed) {
  WIOLA_CHECK(consumed <= S, name, ": loader state has ", consumed, " samples consumed but an epoch has only ", S,
              " (different data?)");
  if (consumed == S) {
    ++epoch;
    consumed = 0;
  }
}
}  // namespace

void TokenLoader::restore(const LoaderState& s) {
  Impl& m = *impl_;
  LoaderState n = s;
  if (!m.blended()) {
    WIOLA_CHECK(s.blend.empty(), m.name, ": the loader state is of a blend of ", s.blend.size(),
                " sources, this run reads one");
    check_cursor(m.name, m.info.num_samples, n.epoch, n.samples_consumed);
  } else {
    WIOLA_CHECK(s.blend.size() == m.sources.size(), m.name, ": the loader state is of ",
                s.blend.empty() ? std::string("one source") : "a blend of " + std::to_string(s.blend.size()),
                ", this run blends ", m.sources.size());
    WIOLA_CHECK(s.epoch == 0 && s.samples_consumed == 0, m.name, ": a blend's loader state has epoch ", s.epoch,
                " and samples_consumed ", s.samples_consumed, " (both must be 0)");
    for (size_t k = 0; k < m.sources.size(); ++k)
      check_cursor(m.sources[k]->name, m.sources[k]->info.num_samples, n.blend[k].epoch, n.blend[k].samples_consumed);
  }
  {
    std::lock_guard<std::mutex> lk(m.mu);
    ++m.generation;
    m.queue.clear();
    m.failed = false;
    m.state = n;
    m.cursor = n;
  }
  m.cv.notify_all();
}

void TokenLoader::read_tokens(uint64_t start, uint64_t count, int32_t* out) const {
  WIOLA_CHECK(!impl_->blended(), impl_->name, ": read_tokens reads one source, not a blend");
  impl_->sources[0]->read_tokens(start, count, out);
}

void TokenLoader::expect(uint32_t model_vocab_size, const std::string& tokenizer_sha256) const {
  const Impl& m = *impl_;
  if (m.info.vocab_size != model_vocab_size)
    fail(m.sources[0]->name, ": data was tokenized with a vocabulary of ", m.info.vocab_size,
         " ids but the model's vocabulary has ", model_vocab_size);
  if (!tokenizer_sha256.empty() && tokenizer_sha256 != m.info.tokenizer_sha256)
    fail(m.sources[0]->name, ": made with tokenizer sha256 ", m.info.tokenizer_sha256, ", expected ", tokenizer_sha256);
}

}  // namespace wiola
