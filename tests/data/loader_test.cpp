// Sample order (docs/model.md §6), DP slicing, exact resume, validation order, errors,
// a bound on open shards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <set>

#include "data/loader.h"
#include "data/manifest.h"
#include "data/shard.h"
#include "data_test_util.h"
#include "tests/util/error_of.h"
#include "util/error.h"

namespace wiola {
namespace {

constexpr uint32_t kVocab = 100000;  // token value = its position in the stream
const std::string kSha(64, 'b');

// Writes shards of the given sizes whose tokens count up across the
// concatenation (token at global position p is p), and a manifest.
// `first`: the first token's value (sources of a blend count from different
// values, so a token tells its source); `sha`: the tokenizer hash recorded.
std::string make_dataset(const test::TempDir& dir, const std::vector<uint64_t>& sizes,
                         const std::string& split = "train", uint64_t first = 0, const std::string& sha = kSha) {
  Manifest m;
  m.vocab_size = kVocab;
  m.eos_id = 2;
  m.tokenizer_sha256 = sha;
  ManifestSplit s;
  uint64_t pos = first;
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<int32_t> tok(sizes[k]);
    std::iota(tok.begin(), tok.end(), int32_t(pos));
    pos += sizes[k];
    ShardMeta meta{kVocab, 2, sha, sizes[k], 1};
    std::string file = split + "-" + std::to_string(k) + ".h5";
    ShardWriteOptions o;
    o.chunk_tokens = 512;
    write_shard(dir / file, tok.data(), tok.size(), meta, o);
    s.shards.push_back(ManifestShard{file, "", sizes[k], 1, ""});  // no content hash: an older manifest
    s.num_tokens += sizes[k];
    s.num_documents += 1;
  }
  m.splits[split] = s;
  write_manifest(dir / "manifest.json", m);
  return dir / "manifest.json";
}

std::vector<int32_t> next(TokenLoader& l) {
  std::vector<int32_t> b(size_t(l.local_batch()) * size_t(l.seq_len() + 1));
  l.next_batch(b.data());
  return b;
}

TEST(SampleOrder, PermutationIsDeterministicAndComplete) {
  auto a = epoch_permutation(1000, 42, 0), b = epoch_permutation(1000, 42, 0);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, epoch_permutation(1000, 42, 1));
  EXPECT_NE(a, epoch_permutation(1000, 43, 0));
  std::vector<uint32_t> s = a;
  std::sort(s.begin(), s.end());
  for (uint32_t i = 0; i < 1000; ++i) EXPECT_EQ(s[i], i);
  EXPECT_EQ(epoch_permutation(1, 5, 5), (std::vector<uint32_t>{0}));
  EXPECT_TRUE(epoch_permutation(0, 5, 5).empty());
}

TEST(Loader, WindowsOfTPlusOneWithStrideTAcrossShards) {
  test::TempDir dir("ld-win");
  // The 17-token shard is shorter than T+1: windows run across it.
  std::string man = make_dataset(dir, {3000, 17, 6983});
  const int T = 16, G = 8;
  TokenLoader l(man, "train", T, G, 0, 1, 0, /*shuffle=*/false, /*prefetch=*/false);
  EXPECT_EQ(l.info().num_tokens, 10000u);
  EXPECT_EQ(l.info().num_samples, (10000u - 1) / 16);
  EXPECT_EQ(l.info().num_documents, 3u);
  for (int step = 0; step < 80; ++step) {  // past one epoch (624 samples = 78 batches)
    std::vector<int32_t> b = next(l);
    for (int j = 0; j < G; ++j) {
      uint64_t sample = (uint64_t(step) * G + uint64_t(j)) % l.info().num_samples;
      for (int t = 0; t <= T; ++t) ASSERT_EQ(b[size_t(j) * (T + 1) + size_t(t)], int32_t(sample * T + uint64_t(t)));
    }
  }
}

TEST(Loader, EpochCoversEverySampleOnceInSeededOrder) {
  test::TempDir dir("ld-epoch");
  std::string man = make_dataset(dir, {4000, 4001});
  const int T = 10, G = 20;
  TokenLoader l(man, "train", T, G, 0, 1, 1234, true, false);
  const uint64_t S = l.info().num_samples;  // 800
  ASSERT_EQ(S, 800u);
  std::vector<uint32_t> perm = epoch_permutation(S, 1234, 0);
  std::vector<int32_t> seen;
  for (uint64_t step = 0; step < S / G; ++step) {
    std::vector<int32_t> b = next(l);
    for (int j = 0; j < G; ++j) seen.push_back(b[size_t(j) * (T + 1)] / T);
  }
  for (uint64_t i = 0; i < S; ++i) EXPECT_EQ(uint64_t(seen[i]), perm[i]);
  EXPECT_EQ((l.state()), (LoaderState{1234, 1, 0, {}}));
}

TEST(Loader, BatchStraddlingAnEpochEndContinuesWithTheNextPermutation) {
  test::TempDir dir("ld-straddle");
  std::string man = make_dataset(dir, {1001});  // T=10 -> 100 samples
  TokenLoader l(man, "train", 10, 30, 0, 1, 9, true, false);
  for (int i = 0; i < 3; ++i) next(l);
  EXPECT_EQ((l.state()), (LoaderState{9, 0, 90, {}}));
  std::vector<int32_t> b = next(l);  // 10 of epoch 0 then 20 of epoch 1
  auto p0 = epoch_permutation(100, 9, 0), p1 = epoch_permutation(100, 9, 1);
  for (int j = 0; j < 30; ++j) {
    uint32_t want = j < 10 ? p0[size_t(90 + j)] : p1[size_t(j - 10)];
    EXPECT_EQ(b[size_t(j) * 11], int32_t(want * 10)) << j;
  }
  EXPECT_EQ((l.state()), (LoaderState{9, 1, 20, {}}));
}

TEST(Loader, DpRanksGetContiguousSlicesOfTheGlobalBatch) {
  test::TempDir dir("ld-dp");
  std::string man = make_dataset(dir, {5000, 3000});
  const int T = 12, G = 12, D = 4;
  TokenLoader g(man, "train", T, G, 0, D, 77, true, false);
  std::vector<std::unique_ptr<TokenLoader>> ranks;
  for (int r = 0; r < D; ++r) ranks.push_back(std::make_unique<TokenLoader>(man, "train", T, G, r, D, 77));
  std::vector<int32_t> global(size_t(G) * (T + 1));
  for (int step = 0; step < 60; ++step) {
    g.peek_global_batch(global.data());
    next(g);
    for (int r = 0; r < D; ++r) {
      std::vector<int32_t> b = next(*ranks[size_t(r)]);
      ASSERT_EQ(b.size(), size_t(G / D) * (T + 1));
      ASSERT_TRUE(std::equal(b.begin(), b.end(), global.begin() + std::ptrdiff_t(r * (G / D) * (T + 1))))
          << "rank " << r << " step " << step;
    }
  }
  EXPECT_THROW(TokenLoader(man, "train", T, 10, 0, 4, 0), Error);  // 10 not a multiple of 4
}

void check_resume(const std::string& man, int skip, bool prefetch) {
  const int T = 8, G = 6;
  TokenLoader a(man, "train", T, G, 1, 2, 5, true, prefetch);
  std::vector<std::vector<int32_t>> ref;
  LoaderState mid;
  for (int i = 0; i < skip + 40; ++i) {
    if (i == skip) mid = a.state();
    ref.push_back(next(a));
  }
  TokenLoader b(man, "train", T, G, 1, 2, 0, true, prefetch);  // seed comes from the state
  next(b);
  b.restore(mid);
  EXPECT_EQ(b.state(), mid);
  for (int i = skip; i < skip + 40; ++i) ASSERT_EQ(next(b), ref[size_t(i)]) << "batch " << i;
  // Restoring an earlier state of the same loader (prefetch queue full) replays it.
  a.restore(mid);
  for (int i = skip; i < skip + 10; ++i) ASSERT_EQ(next(a), ref[size_t(i)]) << "replay " << i;
}

TEST(Loader, ResumeMidEpochIsExact) {
  test::TempDir dir("ld-resume");
  std::string man = make_dataset(dir, {2000, 1201});  // T=8 -> 400 samples, 66.7 batches of 6
  check_resume(man, 7, true);
  check_resume(man, 7, false);
}

TEST(Loader, ResumeAcrossAnEpochBoundaryIsExact) {
  test::TempDir dir("ld-resume-epoch");
  std::string man = make_dataset(dir, {2000, 1201});
  check_resume(man, 65, true);  // batches 66.. straddle epoch 0 -> 1
  check_resume(man, 66, true);
  TokenLoader l(man, "train", 8, 6, 0, 1, 5);
  LoaderState s{5, 0, 400, {}};  // "all of epoch 0 consumed" normalises to epoch 1
  l.restore(s);
  EXPECT_EQ((l.state()), (LoaderState{5, 1, 0, {}}));
  EXPECT_THROW(l.restore(LoaderState{5, 0, 401, {}}), Error);
}

TEST(Loader, ValidationIsInFixedOrder) {
  test::TempDir dir("ld-val");
  std::string man = make_dataset(dir, {641}, "val");  // T=16 -> 40 samples
  TokenLoader v(man, "val", 16, 8, 0, 1, 999, /*shuffle=*/false);
  for (int pass = 0; pass < 2; ++pass)
    for (int step = 0; step < 5; ++step) {
      std::vector<int32_t> b = next(v);
      for (int j = 0; j < 8; ++j) EXPECT_EQ(b[size_t(j) * 17], (step * 8 + j) * 16);
    }
  EXPECT_THROW(TokenLoader(man, "train", 16, 8, 0, 1, 0), Error);  // no such split
}

using test::error_of;

TEST(Loader, BadSourcesAreClearErrors) {
  test::TempDir dir("ld-bad");
  std::string man = make_dataset(dir, {100});
  std::string e = error_of([&] { TokenLoader l(man, "train", 100, 1, 0, 1, 0); });
  EXPECT_NE(e.find("fewer than T+1 = 101"), std::string::npos) << e;
  e = error_of([&] { TokenLoader l(dir / "train-0.h5", "train", 128, 1, 0, 1, 0); });
  EXPECT_NE(e.find("train-0.h5"), std::string::npos) << e;
  EXPECT_NE(e.find("fewer than T+1"), std::string::npos) << e;
  // A single shard works as a source.
  TokenLoader one(dir / "train-0.h5", "", 9, 1, 0, 1, 0);
  EXPECT_EQ(one.info().num_samples, 11u);
  // A folder without a manifest.
  test::TempDir empty("ld-empty");
  e = error_of([&] { TokenLoader l(empty.path.string(), "train", 8, 1, 0, 1, 0); });
  EXPECT_NE(e.find("no manifest.json"), std::string::npos) << e;
  // The folder with one.
  TokenLoader byfolder(dir.path.string(), "train", 9, 1, 0, 1, 0);
  EXPECT_EQ(byfolder.info().num_tokens, 100u);
  // A shard whose tokenizer hash does not match the manifest.
  std::vector<int32_t> tok(100, 1);
  write_shard(dir / "train-0.h5", tok.data(), tok.size(), ShardMeta{kVocab, 2, std::string(64, 'c'), 100, 1});
  e = error_of([&] { TokenLoader l(man, "train", 9, 1, 0, 1, 0); });
  EXPECT_NE(e.find("does not match the manifest"), std::string::npos) << e;
  // Vocabulary / tokenizer mismatch with the model.
  e = error_of([&] { byfolder.expect(32000); });
  EXPECT_NE(e.find("vocabulary"), std::string::npos) << e;
  e = error_of([&] { byfolder.expect(kVocab, std::string(64, 'd')); });
  EXPECT_NE(e.find("tokenizer sha256"), std::string::npos) << e;
  // Missing shard, missing manifest, manifest that is not JSON.
  std::filesystem::remove(dir / "train-0.h5");
  e = error_of([&] { TokenLoader l(man, "train", 9, 1, 0, 1, 0); });
  EXPECT_NE(e.find("train-0.h5: no such file"), std::string::npos) << e;
  e = error_of([&] { TokenLoader l(dir / "nope.json", "train", 9, 1, 0, 1, 0); });
  EXPECT_NE(e.find("nope.json"), std::string::npos) << e;
  test::write_text(dir / "bad.json", "{ not json");
  e = error_of([&] { TokenLoader l(dir / "bad.json", "train", 9, 1, 0, 1, 0); });
  EXPECT_NE(e.find("bad.json: not a valid manifest"), std::string::npos) << e;
  // Counts that are not integers of their field's range (found by fuzzing:
  // 4.6e19 was an undefined cast, 2^40 wrapped silently).
  for (const std::string count : {"1099511627776", "46116860184273879042", "12.5", "-3"}) {
    test::write_text(dir / "count.json",
                     R"({"format": "wiola-manifest-1", "tokenizer": {"sha256": "", "vocab_size": )" + count +
                         R"(, "eos_id": 0}, "splits": {}})");
    e = error_of([&] { read_manifest(dir / "count.json"); });
    EXPECT_NE(e.find("count.json: tokenizer.vocab_size is "), std::string::npos) << e;
    EXPECT_NE(e.find(", not an integer from 0 to 4294967295"), std::string::npos) << e;
  }
}

// ---- bounded open shards ----

// Open file descriptors of this process (entries of /proc/self/fd, less the
// one reading it).
int open_fds() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += e.path().filename() != "." ? 1 : 0;
  return n - 1;
}

TEST(OpenShards, AHandleLimitGivesTheSamplesOfAnUnlimitedLoader) {
  test::TempDir dir("ld-lru");
  // 12 shards; the three of 5 tokens make windows (T = 16) that span four shards.
  std::string man = make_dataset(dir, {700, 5, 5, 5, 900, 333, 1200, 64, 811, 999, 47, 1500});
  const int T = 16, G = 8, D = 2;
  const int base = open_fds();
  std::vector<std::vector<int32_t>> ref;
  LoaderState mid;
  {
    TokenLoader all(man, "train", T, G, 1, D, 3, true, false, /*max_open_shards=*/0);
    EXPECT_EQ(all.shard_stats().open, 12u);
    EXPECT_EQ(open_fds() - base, 12);
    for (int i = 0; i < 110; ++i) {  // 410 samples: past two epochs
      if (i == 37) mid = all.state();
      ref.push_back(next(all));
    }
    EXPECT_EQ(all.shard_stats().reopens, 0u);
  }
  EXPECT_EQ(open_fds(), base);
  for (size_t max_open : {size_t(1), size_t(3)}) {
    for (bool prefetch : {false, true}) {
      TokenLoader l(man, "train", T, G, 1, D, 3, true, prefetch, max_open);
      EXPECT_LE(l.shard_stats().open, max_open);
      int most = 0;
      for (int i = 0; i < 110; ++i) {
        ASSERT_EQ(next(l), ref[size_t(i)]) << "max_open " << max_open << " prefetch " << prefetch << " batch " << i;
        most = std::max(most, open_fds() - base);
        ASSERT_LE(l.shard_stats().open, max_open);
      }
      EXPECT_LE(most, int(max_open)) << "descriptors above the start";
      EXPECT_GT(l.shard_stats().reopens, 0u);
      l.restore(mid);  // an exact resume with the limit
      for (int i = 37; i < 50; ++i) ASSERT_EQ(next(l), ref[size_t(i)]) << "resumed batch " << i;
    }
    // Validation order and read_tokens (the tail no sample covers) too.
    TokenLoader v(man, "train", T, G, 0, 1, 0, /*shuffle=*/false, false, max_open);
    std::vector<int32_t> all(6569);
    v.read_tokens(0, all.size(), all.data());
    for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], int32_t(i));
    for (int i = 0; i < 60; ++i) {
      std::vector<int32_t> b = next(v);
      for (int j = 0; j < G; ++j) ASSERT_EQ(b[size_t(j) * (T + 1)], int32_t(((i * G + j) % 410) * T));
    }
  }
  EXPECT_EQ(open_fds(), base);
}

TEST(OpenShards, AShardChangedAfterTheStartFailsItsReopen) {
  test::TempDir dir("ld-lru-bad");
  std::string man = make_dataset(dir, {500, 500, 500});
  TokenLoader l(man, "train", 10, 4, 0, 1, 0, /*shuffle=*/false, false, /*max_open_shards=*/1);
  std::vector<int32_t> tok(499, 7);
  write_shard(dir / "train-1.h5", tok.data(), tok.size(), ShardMeta{kVocab, 2, kSha, 499, 1});
  std::vector<int32_t> out(600);
  std::string e = error_of([&] { l.read_tokens(400, 600, out.data()); });
  EXPECT_NE(e.find("train-1.h5: shard holds 499 tokens / 1 documents, manifest " + man + " says 500 / 1"),
            std::string::npos)
      << e;
}

// ---- blends of several sources (docs/data.md) ----

TEST(Blend, EverySourceStaysWithinOneSampleOfItsShare) {
  for (const std::vector<double>& w :
       std::vector<std::vector<double>>{{0.5, 0.3, 0.2}, {1, 1, 1}, {1000, 1, 0.001}, {0.7, 0.3}, {3, 5, 7, 11, 13}}) {
    double sum = 0;
    for (double x : w) sum += x;
    std::vector<double> p;
    for (double x : w) p.push_back(x / sum);
    std::vector<uint64_t> drawn(w.size());
    for (uint64_t n = 1; n <= 20000; ++n) {
      ++drawn[blend_pick(p, drawn)];
      for (size_t k = 0; k < w.size(); ++k)
        ASSERT_LT(std::abs(double(drawn[k]) - double(n) * p[k]), 1.0 + 1e-9) << "source " << k << " after " << n;
    }
  }
  // Ties go to the lowest source: equal shares take turns in order.
  std::vector<uint64_t> d(3);
  std::vector<size_t> order;
  for (int n = 0; n < 6; ++n) {
    order.push_back(blend_pick({1.0 / 3, 1.0 / 3, 1.0 / 3}, d));
    ++d[order.back()];
  }
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(blend_source_seed(77, 0), 77u);
  EXPECT_NE(blend_source_seed(77, 1), blend_source_seed(77, 2));
}

TEST(Blend, ABlendOfOneSourceIsThatSourcesStream) {
  test::TempDir dir("bl-one");
  std::string man = make_dataset(dir, {3000, 1201});
  TokenLoader plain(man, "train", 8, 6, 0, 1, 5, true, false);
  TokenLoader blend(std::vector<BlendSource>{{man, 0.25}}, "train", 8, 6, 0, 1, 5, true, false);
  EXPECT_EQ(blend.num_sources(), 1u);
  for (int i = 0; i < 120; ++i) ASSERT_EQ(next(blend), next(plain)) << "batch " << i;  // past an epoch
  EXPECT_EQ(blend.state(), plain.state());
  EXPECT_TRUE(blend.state().blend.empty());
}

// Three sources whose tokens count from 0, 30000 and 60000, so a token
// tells its source; T = 8 gives them 100, 400 and 624 samples.
struct ThreeSources {
  test::TempDir a{"bl-a"}, b{"bl-b"}, c{"bl-c"};
  std::vector<BlendSource> blend{{make_dataset(a, {801}, "train", 0), 2},
                                 {make_dataset(b, {2000, 1201}, "train", 30000), 5},
                                 {make_dataset(c, {5000}, "train", 60000), 3}};
  static constexpr int T = 8;
  static size_t source_of(int32_t token) { return token >= 60000 ? 2 : token >= 30000 ? 1 : 0; }
  static constexpr int32_t kFirst[3] = {0, 30000, 60000};
};

TEST(Blend, SharesHoldAndEachSourceRunsItsOwnEpochs) {
  ThreeSources s;
  const int T = ThreeSources::T, G = 10;
  TokenLoader l(s.blend, "train", T, G, 0, 1, 42, true, false);
  ASSERT_EQ(l.num_sources(), 3u);
  EXPECT_EQ(l.info().num_samples, 100u + 400u + 624u);
  EXPECT_DOUBLE_EQ(l.source_share(1), 0.5);
  std::vector<std::vector<uint64_t>> seen(3);  // each source's sample indices, in order
  const uint64_t S[3] = {100, 400, 624};
  for (int step = 0; step < 150; ++step) {  // 1500 samples: source 0 (share 0.2) wraps into its 3rd epoch
    std::vector<int32_t> b = next(l);
    for (int j = 0; j < G; ++j) {
      const int32_t first = b[size_t(j) * (T + 1)];
      const size_t k = ThreeSources::source_of(first);
      ASSERT_EQ((first - ThreeSources::kFirst[k]) % T, 0);
      for (int t = 0; t <= T; ++t) ASSERT_EQ(b[size_t(j) * (T + 1) + size_t(t)], first + t);  // one window
      seen[k].push_back(uint64_t(first - ThreeSources::kFirst[k]) / T);
    }
    const uint64_t n = uint64_t(step + 1) * G;
    const LoaderState st = l.state();
    EXPECT_EQ(st.blend[0].drawn + st.blend[1].drawn + st.blend[2].drawn, n);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_LT(std::abs(double(st.blend[k].drawn) - double(n) * l.source_share(k)), 1.0 + 1e-9);
      EXPECT_EQ(st.blend[k].drawn, seen[k].size());
      EXPECT_EQ(st.blend[k].epoch * S[k] + st.blend[k].samples_consumed, st.blend[k].drawn);
    }
  }
  // Each source's samples follow its own seeded permutations, epoch after epoch.
  for (size_t k = 0; k < 3; ++k) {
    for (size_t i = 0; i < seen[k].size(); ++i) {
      const auto p = epoch_permutation(S[k], blend_source_seed(42, k), i / S[k]);
      ASSERT_EQ(seen[k][i], p[i % S[k]]) << "source " << k << " sample " << i;
    }
  }
  EXPECT_EQ(l.state().blend[0].epoch, 3u);  // 300 of source 0's samples
}

TEST(Blend, DpRanksGetSlicesAndResumeIsExact) {
  ThreeSources s;
  const int T = ThreeSources::T, G = 12, D = 3;
  TokenLoader g(s.blend, "train", T, G, 0, D, 9, true, false);
  std::vector<std::unique_ptr<TokenLoader>> ranks;
  for (int r = 0; r < D; ++r) ranks.push_back(std::make_unique<TokenLoader>(s.blend, "train", T, G, r, D, 9));
  std::vector<int32_t> global(size_t(G) * (T + 1));
  std::vector<std::vector<int32_t>> rank1;
  LoaderState mid;
  for (int step = 0; step < 60; ++step) {
    if (step == 23) mid = ranks[1]->state();
    g.peek_global_batch(global.data());
    next(g);
    for (int r = 0; r < D; ++r) {
      std::vector<int32_t> b = next(*ranks[size_t(r)]);
      ASSERT_TRUE(std::equal(b.begin(), b.end(), global.begin() + std::ptrdiff_t(r * (G / D) * (T + 1))))
          << "rank " << r << " step " << step;
      if (r == 1) rank1.push_back(b);
    }
  }
  // A new loader (another seed: the state carries it) resumed at step 23,
  // with and without prefetch, and the same loader rewound.
  for (bool prefetch : {true, false}) {
    TokenLoader b(s.blend, "train", T, G, 1, D, 0, true, prefetch);
    next(b);
    b.restore(mid);
    EXPECT_EQ(b.state(), mid);
    for (int step = 23; step < 60; ++step) ASSERT_EQ(next(b), rank1[size_t(step)]) << "step " << step;
  }
  ranks[1]->restore(mid);
  for (int step = 23; step < 30; ++step) ASSERT_EQ(next(*ranks[1]), rank1[size_t(step)]) << "replay " << step;
}

TEST(Blend, BadBlendsAreClearErrors) {
  ThreeSources s;
  const int T = ThreeSources::T;
  TokenLoader l(s.blend, "train", T, 4, 0, 1, 1, true, false);
  TokenLoader one(s.blend[0].path, "train", T, 4, 0, 1, 1, true, false);
  // A state of one source into a blend, of a blend into one source, of another blend.
  std::string e = error_of([&] { l.restore(one.state()); });
  EXPECT_NE(e.find("the loader state is of one source, this run blends 3"), std::string::npos) << e;
  e = error_of([&] { one.restore(l.state()); });
  EXPECT_NE(e.find("the loader state is of a blend of 3 sources, this run reads one"), std::string::npos) << e;
  LoaderState two = l.state();
  two.blend.pop_back();
  e = error_of([&] { l.restore(two); });
  EXPECT_NE(e.find("the loader state is of a blend of 2, this run blends 3"), std::string::npos) << e;
  LoaderState past = l.state();
  past.blend[0].samples_consumed = 101;
  e = error_of([&] { l.restore(past); });
  EXPECT_NE(e.find("101 samples consumed but an epoch has only 100"), std::string::npos) << e;
  EXPECT_NE(e.find(s.blend[0].path), std::string::npos) << e;
  // Weights must be positive and finite.
  for (double w : {0.0, -1.0, std::nan("")}) {
    auto bad = s.blend;
    bad[2].weight = w;
    e = error_of([&] { TokenLoader x(bad, "train", T, 4, 0, 1, 1); });
    EXPECT_NE(e.find("source 3"), std::string::npos) << e;
    EXPECT_NE(e.find("weights must be positive"), std::string::npos) << e;
  }
  // Another tokenizer in one source.
  test::TempDir d("bl-tok");
  auto other = s.blend;
  other[1].path = make_dataset(d, {1000}, "train", 30000, std::string(64, 'e'));
  e = error_of([&] { TokenLoader x(other, "train", T, 4, 0, 1, 1); });
  EXPECT_NE(e.find("made with another tokenizer than " + s.blend[0].path), std::string::npos) << e;
  EXPECT_NE(e.find("a blend needs one tokenizer"), std::string::npos) << e;
  e = error_of([&] { l.read_tokens(0, 4, nullptr); });
  EXPECT_NE(e.find("not a blend"), std::string::npos) << e;
}

// ---- data stages: other shares from a step on (docs/data.md) ----

// Stage 0 (the blend's 2:5:3) for steps 1..700, then 1:0:3 (an anneal
// without source 1) for 701..1400, then 0:1:1: 11200 samples each at G = 16.
const std::vector<DataStage> kStages = {{701, {1, 0, 3}}, {1401, {0, 1, 1}}};
constexpr int kStageG = 16;
constexpr uint64_t kStageSamples = 700 * kStageG;

TEST(Stages, EachStageHoldsItsSharesAndEverySourceItsOwnStream) {
  ThreeSources s;
  TokenLoader l(s.blend, "train", ThreeSources::T, kStageG, 0, 1, 42, true, false, kDefaultMaxOpenShards, kStages);
  TokenLoader plain(s.blend, "train", ThreeSources::T, kStageG, 0, 1, 42, true, false);
  LoaderState st = l.state(), ps = plain.state();
  const auto all = l.take_samples(st, 3 * kStageSamples);
  // Before its first stage a staged blend is the plain blend, sample for sample.
  EXPECT_EQ(std::vector<TokenLoader::Sample>(all.begin(), all.begin() + kStageSamples),
            plain.take_samples(ps, kStageSamples));
  const std::vector<std::vector<double>> shares = {{0.2, 0.5, 0.3}, {0.25, 0, 0.75}, {0, 0.5, 0.5}};
  std::vector<std::vector<uint64_t>> seen(3);
  for (size_t j = 0; j < 3; ++j) {
    uint64_t count[3] = {};
    for (uint64_t n = j * kStageSamples; n < (j + 1) * kStageSamples; ++n) {
      ++count[all[n].source];
      seen[all[n].source].push_back(all[n].index);
    }
    for (size_t k = 0; k < 3; ++k) {
      const double measured = double(count[k]) / double(kStageSamples);
      if (shares[j][k] == 0) EXPECT_LE(count[k], 1u) << "stage " << j << " source " << k;
      else EXPECT_LE(std::abs(measured - shares[j][k]), 0.01 * shares[j][k]) << "stage " << j << " source " << k;
    }
  }
  // Each source went on through its own permutations across the stages.
  const uint64_t S[3] = {100, 400, 624};
  for (size_t k = 0; k < 3; ++k)
    for (size_t i = 0; i < seen[k].size(); ++i)
      ASSERT_EQ(seen[k][i], epoch_permutation(S[k], blend_source_seed(42, k), i / S[k])[i % S[k]])
          << "source " << k << " sample " << i;
  EXPECT_EQ(st.blend[0].drawn + st.blend[1].drawn + st.blend[2].drawn, 3 * kStageSamples);
  EXPECT_EQ(data_stage_at(kStages, 700), 0u);
  EXPECT_EQ(data_stage_at(kStages, 701), 1u);
  EXPECT_EQ(data_stage_at(kStages, 5000), 2u);
}

// A loader resumed (another DP layout, prefetch on) inside either stage or at
// a stage's first step continues the stream of the uninterrupted one.
TEST(Stages, ResumeAnywhereContinuesTheStream) {
  ThreeSources s;
  const int T = ThreeSources::T;
  const std::vector<DataStage> stages = {{6, {1, 0, 3}}, {11, {0, 1, 1}}};
  TokenLoader whole(s.blend, "train", T, kStageG, 0, 1, 7, true, false, kDefaultMaxOpenShards, stages);
  std::vector<std::vector<int32_t>> batches;
  std::vector<LoaderState> states;
  for (int step = 1; step <= 16; ++step) {
    states.push_back(whole.state());
    batches.push_back(next(whole));
  }
  for (int from : {3, 6, 8, 11, 14}) {  // resume before step `from`
    TokenLoader r(s.blend, "train", T, kStageG, 1, 2, 0, true, true, kDefaultMaxOpenShards, stages);
    r.restore(states[size_t(from - 1)]);
    for (int step = from; step <= 16; ++step) {
      const auto& g = batches[size_t(step - 1)];
      ASSERT_EQ(next(r), std::vector<int32_t>(g.begin() + (kStageG / 2) * (T + 1), g.end()))
          << "resumed before step " << from << ", step " << step;
    }
  }
}

TEST(Stages, BadStagesAreClearErrors) {
  ThreeSources s;
  const int T = ThreeSources::T;
  auto err = [&](const std::vector<BlendSource>& blend, const std::vector<DataStage>& st) {
    return error_of([&] { TokenLoader x(blend, "train", T, 4, 0, 1, 1, true, false, kDefaultMaxOpenShards, st); });
  };
  EXPECT_NE(err(s.blend, {{5, {1, 2}}}).find("stage 1 has 2 weights for 3 sources"), std::string::npos);
  EXPECT_NE(err(s.blend, {{5, {1, 1, 1}}, {5, {1, 1, 1}}}).find("in increasing order"), std::string::npos);
  EXPECT_NE(err(s.blend, {{5, {0, 0, 0}}}).find("must not all be 0"), std::string::npos);
  EXPECT_NE(err(s.blend, {{5, {1, -1, 0}}}).find("weights must be finite and >= 0"), std::string::npos);
  EXPECT_NE(err({s.blend[0]}, {{5, {1}}}).find("need a blend of at least two sources"), std::string::npos);
}

}  // namespace
}  // namespace wiola
