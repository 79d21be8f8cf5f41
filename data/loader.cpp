#include "data/loader.h"

#include <algorithm>
#include <condition_variable>
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

struct TokenLoader::Impl {
  std::string source;
  std::vector<std::unique_ptr<ShardReader>> shards;
  std::vector<uint64_t> starts;  // first global token of each shard
  DatasetInfo info{};
  int T = 0, G = 0, rank = 0, dp = 1, local = 0;
  bool shuffle = true;
  LoaderState state;

  mutable std::mutex perm_mu;
  mutable std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<const std::vector<uint32_t>>> perms;  // (seed, epoch)

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

  std::shared_ptr<const std::vector<uint32_t>> perm(uint64_t seed, uint64_t epoch) const {
    std::lock_guard<std::mutex> lock(perm_mu);
    auto key = std::make_pair(seed, epoch);
    auto it = perms.find(key);
    if (it != perms.end()) return it->second;
    auto p = std::make_shared<const std::vector<uint32_t>>(epoch_permutation(info.num_samples, seed, epoch));
    while (perms.size() >= 3) perms.erase(perms.begin());  // keep the newest few
    perms[key] = p;
    return p;
  }

  std::vector<uint64_t> take(LoaderState& s, uint64_t count) const {
    const uint64_t S = info.num_samples;
    std::vector<uint64_t> out;
    out.reserve(count);
    std::shared_ptr<const std::vector<uint32_t>> p;
    uint64_t p_epoch = ~0ull;
    for (uint64_t c = 0; c < count; ++c) {
      if (s.samples_consumed >= S) {
        ++s.epoch;
        s.samples_consumed = 0;
      }
      if (shuffle) {
        if (p_epoch != s.epoch) {
          p = perm(s.seed, s.epoch);
          p_epoch = s.epoch;
        }
        out.push_back((*p)[s.samples_consumed]);
      } else {
        out.push_back(s.samples_consumed);
      }
      ++s.samples_consumed;
    }
    if (s.samples_consumed >= S) {
      ++s.epoch;
      s.samples_consumed = 0;
    }
    return out;
  }

  void read_sample(uint64_t idx, int32_t* out) const { read_tokens(idx * uint64_t(T), uint64_t(T) + 1, out); }

  // Stream tokens [start, start + count), across shard boundaries.
  void read_tokens(uint64_t start, uint64_t left, int32_t* out) const {
    size_t k = size_t(std::upper_bound(starts.begin(), starts.end(), start) - starts.begin()) - 1;
    while (left > 0) {
      WIOLA_CHECK(k < shards.size(), source, ": tokens from ", start, " run past the end of the data");
      uint64_t off = start - starts[k];
      uint64_t n = std::min(left, shards[k]->size() - off);
      shards[k]->read(off, n, out);
      out += n;
      left -= n;
      start += n;
      ++k;
    }
  }

  // This rank's slice of the global batch after `s` (advancing s).
  void produce(LoaderState& s, int32_t* out) const {
    std::vector<uint64_t> idx = take(s, uint64_t(G));
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

TokenLoader::TokenLoader(const std::string& source, const std::string& split, int T, int global_batch,
                         int dp_rank, int dp_size, uint64_t seed, bool shuffle, bool prefetch)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  WIOLA_CHECK(T > 0, "loader: sequence length T must be positive (got ", T, ")");
  WIOLA_CHECK(global_batch > 0, "loader: global batch must be positive (got ", global_batch, ")");
  WIOLA_CHECK(dp_size > 0 && dp_rank >= 0 && dp_rank < dp_size, "loader: bad DP rank ", dp_rank, " of ", dp_size);
  WIOLA_CHECK(global_batch % dp_size == 0, "loader: global batch ", global_batch, " is not a multiple of DP size ",
              dp_size);
  m.T = T;
  m.G = global_batch;
  m.rank = dp_rank;
  m.dp = dp_size;
  m.local = global_batch / dp_size;
  m.shuffle = shuffle;
  m.prefetch = prefetch;
  m.state.seed = seed;
  m.source = source;

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
    m.shards.push_back(std::make_unique<ShardReader>(path));
    const ShardMeta& s = m.shards[0]->meta();
    m.info = DatasetInfo{s.vocab_size, s.eos_id, s.tokenizer_sha256, s.num_tokens, s.num_documents, 0};
  } else {
    Manifest man = read_manifest(path);
    auto it = man.splits.find(split);
    if (it == man.splits.end()) {
      std::string have;
      for (auto& [k, v] : man.splits) have += (have.empty() ? "" : ", ") + k;
      fail(path, ": manifest has no split '", split, "' (it has: ", have.empty() ? "none" : have, ")");
    }
    m.info = DatasetInfo{man.vocab_size, man.eos_id, man.tokenizer_sha256, 0, 0, 0, man.tokenizer_file};
    for (const ManifestShard& e : it->second.shards) {
      auto r = std::make_unique<ShardReader>(e.path);
      const ShardMeta& s = r->meta();
      if (s.vocab_size != man.vocab_size || s.eos_id != man.eos_id || s.tokenizer_sha256 != man.tokenizer_sha256)
        fail(e.path, ": shard does not match the manifest ", path, " (vocab_size ", s.vocab_size, " vs ",
             man.vocab_size, ", eos_id ", s.eos_id, " vs ", man.eos_id, ", tokenizer sha256 ",
             s.tokenizer_sha256.substr(0, 12), "… vs ", man.tokenizer_sha256.substr(0, 12), "…)");
      if (s.num_tokens != e.num_tokens || s.num_documents != e.num_documents)
        fail(e.path, ": shard holds ", s.num_tokens, " tokens / ", s.num_documents, " documents, manifest ", path,
             " says ", e.num_tokens, " / ", e.num_documents);
      m.info.num_documents += s.num_documents;
      m.info.num_tokens += s.num_tokens;
      m.shards.push_back(std::move(r));
    }
    if (m.info.num_tokens != it->second.num_tokens)
      fail(path, ": split '", split, "' says ", it->second.num_tokens, " tokens but its shards hold ",
           m.info.num_tokens);
    m.source = path;
  }
  uint64_t first = 0;
  for (auto& s : m.shards) {
    m.starts.push_back(first);
    first += s->size();
  }
  if (m.info.num_tokens < uint64_t(T) + 1)
    fail(m.source, ": split '", split, "' holds ", m.info.num_tokens, " tokens, fewer than T+1 = ", T + 1,
         " (not one training sample)");
  m.info.num_samples = (m.info.num_tokens - 1) / uint64_t(T);
  WIOLA_CHECK(m.info.num_samples < (uint64_t(1) << 32), m.source, ": more than 2^32 samples");
  m.cursor = m.state;
  m.start_worker();
}

TokenLoader::~TokenLoader() { impl_->stop_worker(); }

const DatasetInfo& TokenLoader::info() const { return impl_->info; }
int TokenLoader::local_batch() const { return impl_->local; }
int TokenLoader::seq_len() const { return impl_->T; }
LoaderState TokenLoader::state() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->state;
}

std::vector<uint64_t> TokenLoader::take_samples(LoaderState& s, uint64_t count) const { return impl_->take(s, count); }

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
  std::vector<uint64_t> idx = m.take(s, uint64_t(m.G));
  for (int j = 0; j < m.G; ++j) m.read_sample(idx[size_t(j)], out + size_t(j) * size_t(m.T + 1));
}

void TokenLoader::restore(const LoaderState& s) {
  Impl& m = *impl_;
  WIOLA_CHECK(s.samples_consumed <= m.info.num_samples, m.source, ": loader state has ", s.samples_consumed,
              " samples consumed but an epoch has only ", m.info.num_samples, " (different data?)");
  LoaderState n = s;
  if (n.samples_consumed == m.info.num_samples) {
    ++n.epoch;
    n.samples_consumed = 0;
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
  impl_->read_tokens(start, count, out);
}

void TokenLoader::expect(uint32_t model_vocab_size, const std::string& tokenizer_sha256) const {
  const Impl& m = *impl_;
  if (m.info.vocab_size != model_vocab_size)
    fail(m.source, ": data was tokenized with a vocabulary of ", m.info.vocab_size,
         " ids but the model's vocabulary has ", model_vocab_size);
  if (!tokenizer_sha256.empty() && tokenizer_sha256 != m.info.tokenizer_sha256)
    fail(m.source, ": made with tokenizer sha256 ", m.info.tokenizer_sha256, ", expected ", tokenizer_sha256);
}

}  // namespace wiola
