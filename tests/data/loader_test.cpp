// Sample order (docs/model.md §6), DP slicing, exact resume, validation order, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "data/loader.h"
#include "data/manifest.h"
#include "data/shard.h"
#include "data_test_util.h"
#include "util/error.h"

namespace wiola {
namespace {

constexpr uint32_t kVocab = 100000;  // token value = its position in the stream
const std::string kSha(64, 'b');

// Writes shards of the given sizes whose tokens count up across the
// concatenation (token at global position p is p), and a manifest.
std::string make_dataset(const test::TempDir& dir, const std::vector<uint64_t>& sizes,
                         const std::string& split = "train") {
  Manifest m;
  m.vocab_size = kVocab;
  m.eos_id = 2;
  m.tokenizer_sha256 = kSha;
  ManifestSplit s;
  uint64_t pos = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<int32_t> tok(sizes[k]);
    std::iota(tok.begin(), tok.end(), int32_t(pos));
    pos += sizes[k];
    ShardMeta meta{kVocab, 2, kSha, sizes[k], 1};
    std::string file = split + "-" + std::to_string(k) + ".h5";
    ShardWriteOptions o;
    o.chunk_tokens = 512;
    write_shard(dir / file, tok.data(), tok.size(), meta, o);
    s.shards.push_back(ManifestShard{file, "", sizes[k], 1});
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
  EXPECT_EQ((l.state()), (LoaderState{1234, 1, 0}));
}

TEST(Loader, BatchStraddlingAnEpochEndContinuesWithTheNextPermutation) {
  test::TempDir dir("ld-straddle");
  std::string man = make_dataset(dir, {1001});  // T=10 -> 100 samples
  TokenLoader l(man, "train", 10, 30, 0, 1, 9, true, false);
  for (int i = 0; i < 3; ++i) next(l);
  EXPECT_EQ((l.state()), (LoaderState{9, 0, 90}));
  std::vector<int32_t> b = next(l);  // 10 of epoch 0 then 20 of epoch 1
  auto p0 = epoch_permutation(100, 9, 0), p1 = epoch_permutation(100, 9, 1);
  for (int j = 0; j < 30; ++j) {
    uint32_t want = j < 10 ? p0[size_t(90 + j)] : p1[size_t(j - 10)];
    EXPECT_EQ(b[size_t(j) * 11], int32_t(want * 10)) << j;
  }
  EXPECT_EQ((l.state()), (LoaderState{9, 1, 20}));
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
  LoaderState s{5, 0, 400};  // "all of epoch 0 consumed" normalises to epoch 1
  l.restore(s);
  EXPECT_EQ((l.state()), (LoaderState{5, 1, 0}));
  EXPECT_THROW(l.restore(LoaderState{5, 0, 401}), Error);
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

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

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
    test::write_text(dir / "count.json", R"({"format": "wiola-manifest-1", "tokenizer": {"sha256": "", "vocab_size": )" +
                                             count + R"(, "eos_id": 0}, "splits": {}})");
    e = error_of([&] { read_manifest(dir / "count.json"); });
    EXPECT_NE(e.find("count.json: tokenizer.vocab_size is "), std::string::npos) << e;
    EXPECT_NE(e.find(", not an integer from 0 to 4294967295"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace wiola
