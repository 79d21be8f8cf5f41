// Loader benchmarks (docs/data.md, "Measurements").
//
//   wiola_loader_speed SOURCE [T=2048] [GLOBAL_BATCH=8] [BATCHES=200]
//     samples/s of TokenLoader::next_batch with prefetch on and off, on a
//     prep output (manifest) or shard.
//   wiola_loader_speed --generate DIR [--tokens 2050000000] [--shards 205] [--seed 1]
//                      [--tokenizer data/wiola360m/tokenizer.json]
//     writes a synthetic "train" split of random tokens (ids ~ 1/rank over
//     the wiola-360m vocabulary, an <eos> every ~1024 tokens) as shards of
//     the prep format and a manifest with the content hashes, as prep would
//     (data/shard.h write_shard, data/manifest.h). Nothing is tokenized.
//   wiola_loader_speed --scale SOURCE [--T 2048] [--global-batch 32] [--dp 1] [--rank 0]
//                      [--batches 1000000] [--seconds 60] [--prefetch 1] [--max-open N]
//     one loader as a training rank uses it: open time, RSS and open file
//     descriptors after the open, the first batch (the epoch permutation),
//     then tokens/s of this rank's slices for --batches or --seconds,
//     whichever ends first, the most descriptors seen, the peak RSS, and how
//     much of the shards was in the page cache before and after (mincore).
//     One configuration per process, so the peak RSS is its own.
//   wiola_loader_speed --perm S
//     time and memory of one epoch permutation of S samples.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "data/loader.h"
#include "data/manifest.h"
#include "data/sha256.h"
#include "data/shard.h"
#include "util/error.h"
#include "util/files.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Open file descriptors of this process (entries of /proc/self/fd, less the
// one reading it).
int open_fds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;
}

// Current resident set, MiB (VmRSS).
double rss_mib() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  double kb = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "VmRSS:", 6) == 0) kb = std::atof(line + 6);
  std::fclose(f);
  return kb / 1024;
}

// Bytes of `path` in the page cache (mincore over a mapping), and its size.
std::pair<uint64_t, uint64_t> cached_bytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return {0, 0};
  struct stat st {};
  fstat(fd, &st);
  const uint64_t size = uint64_t(st.st_size);
  uint64_t resident = 0;
  if (size > 0) {
    void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      const long page = sysconf(_SC_PAGESIZE);
      std::vector<unsigned char> v((size + uint64_t(page) - 1) / uint64_t(page));
      if (mincore(p, size, v.data()) == 0)
        for (unsigned char c : v) resident += (c & 1) ? uint64_t(page) : 0;
      munmap(p, size);
    }
  }
  ::close(fd);
  return {std::min(resident, size), size};
}

std::vector<std::string> shard_files(const std::string& source) {
  std::string man = source;
  if (std::filesystem::is_directory(source)) man = (std::filesystem::path(source) / wiola::kManifestName).string();
  if (man.size() > 3 && man.substr(man.size() - 3) == ".h5") return {man};
  std::vector<std::string> out;
  for (auto& [name, split] : wiola::read_manifest(man).splits)
    for (auto& s : split.shards) out.push_back(s.path);
  return out;
}

double cached_percent(const std::vector<std::string>& files, double* gib = nullptr) {
  uint64_t r = 0, n = 0;
  for (const auto& f : files) {
    auto [a, b] = cached_bytes(f);
    r += a;
    n += b;
  }
  if (gib) *gib = double(n) / double(1ull << 30);
  return n ? 100.0 * double(r) / double(n) : 0;
}

// --- options: --name value pairs after the mode's positional argument ---
std::map<std::string, std::string> options(int argc, char** argv, int first) {
  std::map<std::string, std::string> o;
  for (int i = first; i < argc; i += 2) {
    WIOLA_CHECK(std::strncmp(argv[i], "--", 2) == 0 && i + 1 < argc, "expected --option VALUE, got '", argv[i], "'");
    o[argv[i] + 2] = argv[i + 1];
  }
  return o;
}
double num(const std::map<std::string, std::string>& o, const std::string& k, double def) {
  auto it = o.find(k);
  return it == o.end() ? def : std::atof(it->second.c_str());
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int generate(const std::string& dir, const std::map<std::string, std::string>& o) {
  const uint64_t total = uint64_t(num(o, "tokens", 2.05e9));
  const uint64_t nshards = uint64_t(num(o, "shards", 205));
  const uint64_t seed = uint64_t(num(o, "seed", 1));
  WIOLA_CHECK(nshards > 0 && total >= nshards, "--tokens must be at least --shards");
  // Only its identity is recorded (the manifest's tokenizer file and SHA-256).
  auto it = o.find("tokenizer");
  const std::string tok_file =
      std::filesystem::absolute(it != o.end() ? it->second : std::string("data/wiola360m/tokenizer.json")).string();
  const uint32_t V = 32000, eos = 2;
  std::filesystem::create_directories(dir);
  wiola::Manifest m;
  m.vocab_size = V;
  m.eos_id = eos;
  m.tokenizer_file = tok_file;
  m.tokenizer_sha256 = wiola::sha256_file(tok_file);
  m.extra_json = "{\"generator\": \"wiola_loader_speed --generate\", \"seed\": " + std::to_string(seed) + "}";
  wiola::ManifestSplit split;
  wiola::TokenHash split_hash;
  // Shard k's tokens: ids 4.. with P(id) ~ 1/(id - 3) (a Zipf-like spread,
  // so deflate sees text-like redundancy), <eos> with probability 1/1024.
  struct Made {
    std::vector<int32_t> tok;
    uint64_t docs = 0;
    std::string hash;
  };
  auto make = [&](uint64_t k) {
    Made r;
    const uint64_t n = total / nshards + (k < total % nshards ? 1 : 0);
    r.tok.resize(n);
    uint64_t x = seed * 0x2545F4914F6CDD1Dull + k;
    const double lnv = std::log(double(V - 4));
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t b = splitmix64(x);
      if ((b & 1023) == 0) {
        r.tok[i] = int32_t(eos);
        ++r.docs;
      } else {
        const double u = double(b >> 11) * 0x1.0p-53;
        r.tok[i] = int32_t(std::min<uint64_t>(V - 1, 3 + uint64_t(std::exp(u * lnv))));
      }
    }
    wiola::TokenHash h;
    h.add(r.tok.data(), n);
    r.hash = h.hex();
    return r;
  };
  const auto t0 = Clock::now();
  std::future<Made> next = std::async(std::launch::async, make, 0);
  for (uint64_t k = 0; k < nshards; ++k) {
    Made cur = next.get();
    if (k + 1 < nshards) next = std::async(std::launch::async, make, k + 1);  // overlaps the write
    char name[32];
    std::snprintf(name, sizeof name, "train-%05llu.h5", (unsigned long long)k);
    const uint64_t n = cur.tok.size();
    wiola::write_shard((std::filesystem::path(dir) / name).string(), cur.tok.data(), n,
                       wiola::ShardMeta{V, eos, m.tokenizer_sha256, n, cur.docs});
    split_hash.add(cur.tok.data(), n);
    split.shards.push_back(wiola::ManifestShard{name, "", n, cur.docs, cur.hash});
    split.num_tokens += n;
    split.num_documents += cur.docs;
    if ((k + 1) % 20 == 0 || k + 1 == nshards)
      std::fprintf(stderr, "%llu/%llu shards, %.2f G tokens, %.0f s\n", (unsigned long long)(k + 1),
                   (unsigned long long)nshards, double(split.num_tokens) / 1e9, since(t0));
  }
  split.xxh3 = split_hash.hex();
  m.splits["train"] = split;
  wiola::write_manifest((std::filesystem::path(dir) / wiola::kManifestName).string(), m);
  std::printf("generated %s: %llu tokens, %llu documents, %llu shards in %.1f s\n", dir.c_str(),
              (unsigned long long)split.num_tokens, (unsigned long long)split.num_documents,
              (unsigned long long)nshards, since(t0));
  return 0;
}

int scale(const std::string& source, const std::map<std::string, std::string>& o) {
  const int T = int(num(o, "T", 2048)), G = int(num(o, "global-batch", 32));
  const int dp = int(num(o, "dp", 1)), rank = int(num(o, "rank", 0));
  const uint64_t max_batches = uint64_t(num(o, "batches", 1e6));
  const double max_s = num(o, "seconds", 60);
  const bool prefetch = num(o, "prefetch", 1) != 0;
  const std::vector<std::string> files = shard_files(source);
  double gib = 0;
  const double cached0 = cached_percent(files, &gib);
  const int fds0 = open_fds();
  const double rss0 = rss_mib();

  auto t0 = Clock::now();
  const size_t max_open = size_t(num(o, "max-open", double(wiola::kDefaultMaxOpenShards)));
  wiola::TokenLoader l(source, "train", T, G, rank, dp, 1, true, prefetch, max_open);
  const double t_open = since(t0);
  const int fds_open = open_fds() - fds0;
  const double rss_open = rss_mib();

  std::vector<int32_t> buf(size_t(l.local_batch()) * size_t(T + 1));
  t0 = Clock::now();
  l.next_batch(buf.data());  // the epoch permutation, the first reads
  const double t_first = since(t0);
  int fds_max = open_fds() - fds0;
  uint64_t batches = 0;
  t0 = Clock::now();
  while (batches < max_batches && since(t0) < max_s) {
    l.next_batch(buf.data());
    ++batches;
    fds_max = std::max(fds_max, open_fds() - fds0);
  }
  const double s = since(t0);
  const double tok_s = double(batches) * double(l.local_batch()) * double(T) / s;
  const wiola::LoaderState st = l.state();
  const wiola::TokenLoader::ShardStats io = l.shard_stats();
  std::printf(
      "scale: %zu shards, %.2f G tokens (%.2f GiB), S=%llu samples; T=%d G=%d dp=%d rank=%d prefetch=%d "
      "max_open=%zu\n"
      "  page cache before: %.1f%% of the shards\n"
      "  open: %.3f s, RSS %.1f MiB (%.1f before), +%d fds\n"
      "  first batch: %.3f s (epoch permutation + reads)\n"
      "  %llu batches in %.1f s: %.0f samples/s, %.0f tokens/s for this rank (%.2f ms per batch); "
      "cursor epoch %llu sample %llu\n"
      "  fds (above the start) at most %d; shards open now %zu, reopened %llu times (%.2f per batch)\n"
      "  RSS now %.1f MiB, peak %.1f MiB; page cache after: %.1f%%\n",
      files.size(), double(l.info().num_tokens) / 1e9, gib, (unsigned long long)l.info().num_samples, T, G, dp,
      rank, int(prefetch), max_open, cached0, t_open, rss_open, rss0, fds_open, t_first,
      (unsigned long long)batches, s, double(batches) * l.local_batch() / s, tok_s, s / double(batches) * 1e3,
      (unsigned long long)st.epoch, (unsigned long long)st.samples_consumed, fds_max, io.open,
      (unsigned long long)io.reopens, double(io.reopens) / double(batches + 1), rss_mib(),
      wiola::peak_rss_mib(), cached_percent(files));
  return 0;
}

int perm(uint64_t S) {
  const double rss0 = rss_mib();
  auto t0 = Clock::now();
  std::vector<uint32_t> p = wiola::epoch_permutation(S, 1, 0);
  const double t = since(t0);
  std::printf("epoch_permutation(%llu): %.3f s, %.1f MiB (%zu bytes per sample); RSS %.1f -> %.1f MiB, p[0]=%u\n",
              (unsigned long long)S, t, double(p.size() * sizeof(p[0])) / (1 << 20), sizeof(p[0]), rss0, rss_mib(),
              p[0]);
  return 0;
}

int classic(int argc, char** argv) {
  int T = argc > 2 ? std::atoi(argv[2]) : 2048;
  int G = argc > 3 ? std::atoi(argv[3]) : 8;
  int batches = argc > 4 ? std::atoi(argv[4]) : 200;
  for (bool prefetch : {false, true}) {
    wiola::TokenLoader l(argv[1], "train", T, G, 0, 1, 1, true, prefetch);
    std::vector<int32_t> buf(size_t(G) * size_t(T + 1));
    l.next_batch(buf.data());  // warm-up: permutation, first chunks
    auto t0 = Clock::now();
    for (int b = 0; b < batches; ++b) l.next_batch(buf.data());
    double s = since(t0);
    std::printf("prefetch=%d T=%d G=%d: %.0f samples/s (%.1f M tokens/s), %llu samples/epoch\n", int(prefetch), T, G,
                batches * G / s, batches * G * double(T) / s / 1e6, (unsigned long long)l.info().num_samples);
  }
  // With a simulated 20 ms training step, how long does next_batch wait?
  wiola::TokenLoader l(argv[1], "train", T, G, 0, 1, 2, true, true);
  std::vector<int32_t> buf(size_t(G) * size_t(T + 1));
  double waited = 0;
  for (int b = 0; b < 50; ++b) {
    auto t0 = Clock::now();
    l.next_batch(buf.data());
    waited += since(t0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("with a 20 ms step: next_batch waited %.3f ms per step on average\n", waited / 50 * 1e3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s SOURCE [T] [GLOBAL_BATCH] [BATCHES]\n"
                 "       %s --generate DIR [--tokens N] [--shards K] [--seed S] [--tokenizer FILE]\n"
                 "       %s --scale SOURCE [--T 2048] [--global-batch 32] [--dp 1] [--rank 0] [--batches N]\n"
                 "                         [--seconds 60] [--prefetch 1] [--max-open N]\n"
                 "       %s --perm S\n",
                 argv[0], argv[0], argv[0], argv[0]);
    return 2;
  }
  try {
    const std::string mode = argv[1];
    if (mode == "--generate" && argc >= 3) return generate(argv[2], options(argc, argv, 3));
    if (mode == "--scale" && argc >= 3) return scale(argv[2], options(argc, argv, 3));
    if (mode == "--perm" && argc >= 3) return perm(std::strtoull(argv[2], nullptr, 10));
    return classic(argc, argv);
  } catch (const wiola::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
