// prep: documents -> shards + manifest; splits; input kinds; failures leave nothing.
#include <gtest/gtest.h>
#include <xxhash.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "data/manifest.h"
#include "data/parquet_input.h"
#include "data/prep.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "data_test_util.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace wiola {
namespace {

PrepOptions options(const test::TempDir& dir, std::vector<std::string> inputs) {
  PrepOptions o;
  o.inputs = std::move(inputs);
  o.tokenizer_path = test::kWiolaTokenizer;
  o.output_dir = dir / "out";
  o.progress = false;
  o.threads = 2;
  return o;
}

std::vector<std::string> docs8() {
  return {"First document.\nIt has two lines.", "Second: café, 日本語, 👋.", "Third one",
          "Fourth document here", "Fifth", "Sixth — with a dash", "Seventh 12345", "Eighth and last"};
}

// `docs` as a text corpus at `path` (blank-line runs separate documents).
std::string write_corpus(const std::string& path, const std::vector<std::string>& docs) {
  std::string text;
  for (const auto& d : docs) text += d + "\n\n\n";
  test::write_text(path, text);
  return path;
}

// Everything in the output folder (names).
std::vector<std::string> listing(const std::string& d) {
  std::vector<std::string> v;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(d, ec)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

TEST(Prep, TextDocumentsToShardsAndManifest) {
  test::TempDir dir("prep-text");
  PrepOptions o = options(dir, {write_corpus(dir / "corpus.txt", docs8())});
  o.shard_tokens = 20;
  o.val_fraction = 0.25;
  PrepResult r = run_prep(o);
  Tokenizer tok = Tokenizer::load(test::kWiolaTokenizer);
  uint64_t want_train = 0, want_val = 0;
  std::vector<int32_t> train_stream, val_stream;
  for (size_t i = 0; i < 8; ++i) {
    std::vector<int32_t> ids = tok.encode(docs8()[i]);
    ids.push_back(2);
    bool val = i == 3 || i == 7;  // every 4th document
    (val ? want_val : want_train) += ids.size();
    auto& s = val ? val_stream : train_stream;
    s.insert(s.end(), ids.begin(), ids.end());
  }
  Manifest m = read_manifest(dir / "out/manifest.json");
  EXPECT_EQ(m.tokenizer_sha256, tok.sha256());
  EXPECT_EQ(m.vocab_size, 32000u);
  EXPECT_EQ(m.eos_id, 2u);
  EXPECT_EQ(m.splits["train"].num_tokens, want_train);
  EXPECT_EQ(m.splits["train"].num_documents, 6u);
  EXPECT_EQ(m.splits["val"].num_tokens, want_val);
  EXPECT_EQ(m.splits["val"].num_documents, 2u);
  EXPECT_EQ(m.splits["train"].shards.size(), (want_train + 19) / 20);
  uint64_t docs = 0;
  for (auto& s : m.splits["train"].shards) docs += s.num_documents;
  EXPECT_EQ(docs, 6u);
  // Read the streams back through the loader (fixed order, T = 1 -> every token).
  for (auto [split, want] : {std::pair{"train", &train_stream}, std::pair{"val", &val_stream}}) {
    TokenLoader l(dir / "out/manifest.json", split, 1, 1, 0, 1, 0, false, false);
    std::vector<int32_t> got;
    int32_t b[2];
    for (uint64_t i = 0; i < l.info().num_samples; ++i) {
      l.next_batch(b);
      got.push_back(b[0]);
    }
    got.push_back(b[1]);
    EXPECT_EQ(got, *want) << split;
  }
  EXPECT_EQ(tok.decode(val_stream), docs8()[3] + "<eos>" + docs8()[7] + "<eos>");
  // Only shards and the manifest are left; no temporary files.
  for (const auto& f : listing(dir / "out")) EXPECT_TRUE(f == "manifest.json" || f.ends_with(".h5")) << f;
}

// The content hashes (data/manifest.h): the XXH3-64 of each shard's ids and
// of the split's whole stream, the same for any thread count, different for
// the same documents in another order; the loader reports the split's; a
// malformed one in a manifest is an error naming the field.
TEST(Prep, ContentHashesCoverTheTokensInOrder) {
  test::TempDir dir("prep-hash");
  auto hash_of = [](const int32_t* p, size_t n) { return token_hash_hex(XXH3_64bits(p, n * sizeof(int32_t))); };
  Tokenizer tok = Tokenizer::load(test::kWiolaTokenizer);
  std::vector<int32_t> stream;
  for (const auto& d : docs8()) {
    std::vector<int32_t> ids = tok.encode(d);
    stream.insert(stream.end(), ids.begin(), ids.end());
    stream.push_back(2);
  }
  std::vector<std::string> swapped = docs8();
  std::swap(swapped[0], swapped[1]);
  std::vector<std::string> hashes;
  for (const auto& [name, docs, threads] : {std::tuple{"a", docs8(), 2}, std::tuple{"b", docs8(), 1},
                                            std::tuple{"c", swapped, 2}}) {
    PrepOptions o = options(dir, {write_corpus(dir / (std::string(name) + ".txt"), docs)});
    const std::string out = dir / name, manifest = out + "/manifest.json";
    o.output_dir = out;
    o.shard_tokens = 20;
    o.threads = threads;
    run_prep(o);
    const Manifest m = read_manifest(manifest);
    const ManifestSplit& tr = m.splits.at("train");
    hashes.push_back(tr.xxh3);
    EXPECT_EQ(m.splits.at("val").xxh3, hash_of(nullptr, 0)) << name << ": an empty split hashes nothing";
    if (std::string(name) == "c") {
      EXPECT_EQ(tr.num_tokens, stream.size());
      continue;
    }
    ASSERT_EQ(tr.num_tokens, stream.size()) << name;
    EXPECT_EQ(tr.xxh3, hash_of(stream.data(), stream.size())) << name;
    uint64_t at = 0;
    for (const ManifestShard& sh : tr.shards) {
      EXPECT_EQ(sh.xxh3, hash_of(stream.data() + at, sh.num_tokens)) << name << " " << sh.file;
      at += sh.num_tokens;
    }
    TokenLoader l(manifest, "train", 1, 1, 0, 1, 0, false, false);
    EXPECT_EQ(l.info().content_xxh3, tr.xxh3) << name;
  }
  EXPECT_EQ(hashes[0], hashes[1]) << "one thread and two";
  EXPECT_NE(hashes[0], hashes[2]) << "the same documents in another order";

  // A malformed hash: one error naming the manifest and the field.
  std::ifstream in(dir / "a/manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find(hashes[0]);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 16, "not-a-hash");
  test::write_text(dir / "a/manifest.json", text);
  try {
    read_manifest(dir / "a/manifest.json");
    FAIL() << "a malformed xxh3 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json: splits.train.xxh3: expected 16 lowercase hex digits"),
              std::string::npos)
        << e.what();
  }
}

// wiola prep --verify: a sound output passes with every hash compared; shards
// listed in another order fail on the split's hash alone; a shard cut short
// or swapped for another is named; a manifest without hashes passes on counts.
TEST(Prep, VerifyNamesWhatChanged) {
  test::TempDir dir("prep-verify");
  PrepOptions o = options(dir, {write_corpus(dir / "corpus.txt", docs8())});
  o.shard_tokens = 20;
  o.val_fraction = 0.25;
  run_prep(o);
  const std::string out = dir / "out", manifest = out + "/manifest.json";
  const Manifest m = read_manifest(manifest);
  const size_t n_shards = m.splits.at("train").shards.size() + m.splits.at("val").shards.size();
  ASSERT_GE(m.splits.at("train").shards.size(), 3u);

  DataVerifyStats st;
  EXPECT_TRUE(verify_data(out, &st).empty());
  EXPECT_EQ(st.shards, int(n_shards));
  EXPECT_EQ(st.tokens, m.splits.at("train").num_tokens + m.splits.at("val").num_tokens);
  EXPECT_EQ(st.hashes_checked, int(n_shards) + 2);
  EXPECT_EQ(st.hashes_absent, 0);

  auto edited = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    const std::string d = dir / name;
    fs::copy(out, d, fs::copy_options::recursive);
    std::ifstream in(d + "/manifest.json");
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    test::write_text(d + "/manifest.json", j.dump(1));
    return d;
  };
  // The first two train shards listed the other way round (counts kept).
  const std::string swapped = edited("swapped", [](nlohmann::json& j) {
    auto& sh = j["splits"]["train"]["shards"];
    std::swap(sh[0], sh[1]);
  });
  std::vector<std::string> p = verify_data(swapped, &st);
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_NE(p[0].find("manifest.json: split 'train': content hash "), std::string::npos) << p[0];
  // A shard replaced by another of the same split: its hash (and counts if they differ) named.
  const std::string replaced = edited("replaced", [](nlohmann::json&) {});
  fs::copy_file(replaced + "/train-00001.h5", replaced + "/train-00000.h5", fs::copy_options::overwrite_existing);
  p = verify_data(replaced, &st);
  ASSERT_FALSE(p.empty());
  EXPECT_NE(p[0].find("train-00000.h5: "), std::string::npos) << p[0];
  // A shard cut short: not readable, named; the split's hash is not judged.
  const std::string cut = edited("cut", [](nlohmann::json&) {});
  fs::resize_file(cut + "/train-00002.h5", 100);
  p = verify_data(cut, &st);
  ASSERT_EQ(p.size(), 1u) << ::testing::PrintToString(p);
  EXPECT_NE(p[0].find("train-00002.h5"), std::string::npos) << p[0];
  // An older manifest without hashes: sound on its counts.
  const std::string old = edited("old", [](nlohmann::json& j) {
    for (auto& [name, split] : j["splits"].items()) {
      split.erase("xxh3");
      for (auto& sh : split["shards"]) sh.erase("xxh3");
    }
  });
  EXPECT_TRUE(verify_data(old, &st).empty());
  EXPECT_EQ(st.hashes_checked, 0);
  EXPECT_EQ(st.hashes_absent, int(n_shards) + 2);
  // No manifest: one problem, no exception.
  p = verify_data(dir / "nothing", &st);
  ASSERT_EQ(p.size(), 1u);
}

TEST(Prep, JsonlDirectoriesGlobsAndDocPerFile) {
  test::TempDir dir("prep-kinds");
  fs::create_directories(dir / "in/sub");
  test::write_text(dir / "in/a.jsonl", "{\"text\": \"alpha doc\"}\n\n{\"text\": \"beta\\ndoc\", \"id\": 3}\n");
  test::write_text(dir / "in/sub/b.jsonl", "{\"body\": \"x\", \"text\": \"gamma\"}\n");
  PrepOptions o = options(dir, {dir / "in"});
  o.val_fraction = 0;
  run_prep(o);
  Manifest m = read_manifest(dir / "out/manifest.json");
  EXPECT_EQ(m.splits["train"].num_documents, 3u);
  EXPECT_EQ(m.splits["val"].num_documents, 0u);

  test::write_text(dir / "d1.txt", "one file\n\nis one document\n");
  test::write_text(dir / "d2.txt", "another");
  o = options(dir, {dir / "d*.txt"});
  o.reader.doc_per_file = true;
  o.val_fraction = 0;
  run_prep(o);
  m = read_manifest(dir / "out/manifest.json");
  EXPECT_EQ(m.splits["train"].num_documents, 2u);
  Tokenizer tok = Tokenizer::load(test::kWiolaTokenizer);
  EXPECT_EQ(m.splits["train"].num_tokens, tok.encode("one file\n\nis one document").size() + tok.encode("another").size() + 2);

  test::write_text(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"no\"}\n");
  o = options(dir, {dir / "bad.jsonl"});
  try {
    run_prep(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: no string field \"text\""), std::string::npos) << e.what();
  }
}

TEST(Prep, FailuresLeaveNothingTheLoaderWouldAccept) {
  test::TempDir dir("prep-fail");
  test::write_text(dir / "good.txt", "a good document\n\nanother one\n");
  PrepOptions o = options(dir, {dir / "good.txt"});
  o.val_fraction = 0;
  run_prep(o);  // a previous, complete output
  auto before = listing(dir / "out");

  std::string big;
  for (int i = 0; i < 2000; ++i) big += "document number " + std::to_string(i) + "\n\n";
  test::write_text(dir / "a.txt", big);
  test::write_text(dir / "b.txt", "fine line\nbad \xFF byte\n");
  o = options(dir, {dir / "a.txt", dir / "b.txt"});
  o.shard_tokens = 100;  // shards are written before the error
  try {
    run_prep(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("b.txt:2: invalid UTF-8"), std::string::npos) << e.what();
  }
  EXPECT_EQ(listing(dir / "out"), before);  // the old output is untouched, no temporary left
  TokenLoader l(dir / "out", "train", 2, 1, 0, 1, 0);
  EXPECT_EQ(l.info().num_documents, 2u);

  // Empty corpus, missing file, empty directory, unsupported tokenizer.
  test::write_text(dir / "empty.txt", "\n\n   \n");
  o = options(dir, {dir / "empty.txt"});
  o.output_dir = dir / "out2";
  try {
    run_prep(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("empty corpus"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "out2/manifest.json"));
  EXPECT_TRUE(listing(dir / "out2").empty());
  o = options(dir, {dir / "missing.txt"});
  try {
    run_prep(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.txt: no such file"), std::string::npos) << e.what();
  }
  test::write_text(dir / "tok.json", "{\"model\": {\"type\": \"Unigram\"}}");
  o = options(dir, {dir / "good.txt"});
  o.tokenizer_path = dir / "tok.json";
  try {
    run_prep(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tok.json: unsupported tokenizer.json: model.type is \"Unigram\""),
              std::string::npos)
        << e.what();
  }
}

TEST(Prep, BrownCorpusCounts) {
  test::TempDir dir("prep-brown");
  PrepOptions o = options(dir, {test::kBrown});
  PrepResult r = run_prep(o);
  const Manifest& m = r.manifest;
  EXPECT_EQ(m.splits.at("train").num_documents + m.splits.at("val").num_documents, 491u);
  EXPECT_EQ(m.splits.at("val").num_documents, 4u);
  EXPECT_EQ(m.splits.at("train").num_tokens + m.splits.at("val").num_tokens, 1321894u);
  TokenLoader l(r.manifest_path, "train", 2048, 8, 0, 1, 1);
  l.expect(32000, Tokenizer::load(test::kWiolaTokenizer).sha256());
  EXPECT_EQ(l.info().num_samples, (m.splits.at("train").num_tokens - 1) / 2048);
}

// --- Compressed inputs (.gz, .zst) ------------------------------------------

std::string gzip_of(const std::string& data) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, uLong(data.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = uInt(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::string zstd_of(const std::string& data) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  size_t n = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A shard's token ids. (The .h5 files themselves differ in HDF5's object
// modification times when written in different seconds.)
std::vector<int32_t> shard_tokens(const std::string& path) {
  const ShardReader r(path);
  std::vector<int32_t> ids(r.size());
  r.read(0, r.size(), ids.data());
  return ids;
}

// A corpus large enough to take several compressed read buffers: docs8()
// and then documents with varied (poorly compressible) content.
std::vector<std::string> many_docs() {
  std::vector<std::string> d = docs8();
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 6000; ++i) {
    std::string doc = "Document " + std::to_string(i) + ":";
    for (int w = 0; w < 8; ++w) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      doc += " w" + std::to_string(x % 100000);
    }
    if (i % 7 == 0) doc += "\nsecond line, café 日本";
    d.push_back(doc);
  }
  return d;
}

std::string jsonl_of(const std::vector<std::string>& docs) {
  std::string s;
  for (const auto& d : docs) s += nlohmann::json{{"text", d}}.dump() + "\n";
  return s;
}

// The manifest less what names or measures the input files (input_bytes:
// compressed sizes), as JSON text.
std::string manifest_content(const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(file_bytes(path));
  j["prep"].erase("input_bytes");
  return j.dump();
}

// The same documents as plain text and JSONL, and each gzip- and
// zstd-compressed, give shards of identical tokens and the same manifest
// (token and document counts, content hashes; all but input_bytes), whether
// read as a file, from a folder or a glob.
TEST(Prep, CompressedInputsGiveIdenticalShards) {
  test::TempDir dir("prep-compressed");
  const std::vector<std::string> docs = many_docs();
  const std::string text = file_bytes(write_corpus(dir / "plain.txt", docs));
  const std::string jsonl = jsonl_of(docs);
  test::write_text(dir / "plain.jsonl", jsonl);
  fs::create_directories(dir / "in");
  struct Input {
    std::string name, bytes;
  };
  const std::vector<Input> inputs = {
      {"c.txt.gz", gzip_of(text)},       {"c.txt.zst", zstd_of(text)},     {"c.gz", gzip_of(text)},
      {"c.zst", zstd_of(text)},          {"c.jsonl.gz", gzip_of(jsonl)},   {"c.jsonl.zst", zstd_of(jsonl)},
      {"c.ndjson.gz", gzip_of(jsonl)}};
  ASSERT_GT(inputs[1].bytes.size(), size_t(1) << 17);  // several compressed read buffers
  std::vector<std::string> paths = {dir / "plain.jsonl"};
  for (const Input& in : inputs) {
    test::write_text(dir / in.name, in.bytes);
    paths.push_back(dir / in.name);
  }
  test::write_text(dir / "in/only.jsonl.zst", zstd_of(jsonl));
  paths.push_back(dir / "in");          // a folder holding one .jsonl.zst
  paths.push_back(dir / "c.txt.g*");    // a glob matching c.txt.gz

  auto prep = [&](const std::string& input, const std::string& out) {
    PrepOptions o = options(dir, {input});
    o.output_dir = out;
    o.shard_tokens = 50'000;
    o.val_fraction = 0.1;
    return run_prep(o);
  };
  PrepResult want = prep(dir / "plain.txt", dir / "out-plain");
  ASSERT_GE(want.manifest.splits.at("train").shards.size(), 2u);
  ASSERT_EQ(want.manifest.splits.at("train").num_documents + want.manifest.splits.at("val").num_documents,
            docs.size());
  const std::string want_manifest = manifest_content(want.manifest_path);
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string out = dir / ("out-" + std::to_string(i));
    PrepResult got = prep(paths[i], out);
    SCOPED_TRACE(paths[i]);
    for (const char* split : {"train", "val"}) {
      const ManifestSplit& w = want.manifest.splits.at(split);
      const ManifestSplit& g = got.manifest.splits.at(split);
      EXPECT_EQ(g.xxh3, w.xxh3) << split;
      EXPECT_EQ(g.num_tokens, w.num_tokens) << split;
      EXPECT_EQ(g.num_documents, w.num_documents) << split;
      ASSERT_EQ(g.shards.size(), w.shards.size()) << split;
      for (size_t s = 0; s < w.shards.size(); ++s) {
        EXPECT_EQ(g.shards[s].xxh3, w.shards[s].xxh3);
        EXPECT_TRUE(shard_tokens(g.shards[s].path) == shard_tokens(w.shards[s].path)) << g.shards[s].path;
      }
    }
    EXPECT_EQ(manifest_content(got.manifest_path), want_manifest);
    EXPECT_EQ(got.input_bytes, fs::is_directory(paths[i]) ? fs::file_size(dir / "in/only.jsonl.zst")
                               : paths[i].find('*') != std::string::npos ? fs::file_size(dir / "c.txt.gz")
                                                                         : fs::file_size(paths[i]));
  }
  // The bytes reported consumed are the compressed file's size.
  for (const char* name : {"c.txt.gz", "c.jsonl.zst"}) {
    uint64_t consumed = 0, n = 0;
    read_documents(dir / name, {}, [&](std::string&&) { ++n; }, [&](uint64_t b) { consumed += b; });
    EXPECT_EQ(n, docs.size()) << name;
    EXPECT_EQ(consumed, fs::file_size(dir / name)) << name;
  }
}

// Concatenated gzip members (`cat a.gz b.gz`) and zstd frames read as the
// concatenation of their contents.
TEST(Prep, MultiMemberGzipAndMultiFrameZstd) {
  test::TempDir dir("prep-multi");
  const std::vector<std::string> all = docs8();
  const std::vector<std::string> a(all.begin(), all.begin() + 5), b(all.begin() + 5, all.end());
  const std::string ta = file_bytes(write_corpus(dir / "a.txt", a));
  const std::string tb = file_bytes(write_corpus(dir / "b.txt", b));
  test::write_text(dir / "ab.txt.gz", gzip_of(ta) + gzip_of(tb));
  test::write_text(dir / "ab.txt.zst", zstd_of(ta) + zstd_of(tb));
  test::write_text(dir / "ab.jsonl.gz", gzip_of(jsonl_of(a)) + gzip_of("") + gzip_of(jsonl_of(b)));
  for (const char* name : {"ab.txt.gz", "ab.txt.zst", "ab.jsonl.gz"}) {
    std::vector<std::string> got;
    read_documents(dir / name, {}, [&](std::string&& d) { got.push_back(d); }, [](uint64_t) {});
    EXPECT_EQ(got, docs8()) << name;
  }
  PrepOptions o = options(dir, {dir / "ab.txt.gz"});
  o.val_fraction = 0;
  PrepResult r = run_prep(o);
  EXPECT_EQ(r.manifest.splits.at("train").num_documents, 8u);
}

// A corrupt .gz (bytes flipped mid-stream) and a truncated .zst or .gz each
// fail with one error naming the file and how far it got, and leave no
// output (and an earlier complete output untouched).
TEST(Prep, CorruptOrTruncatedCompressedInputFails) {
  test::TempDir dir("prep-corrupt");
  const std::string text = file_bytes(write_corpus(dir / "plain.txt", many_docs()));
  PrepOptions o = options(dir, {dir / "plain.txt"});
  run_prep(o);  // a previous, complete output
  const auto before = listing(dir / "out");
  const std::string before_manifest = file_bytes(dir / "out/manifest.json");

  std::string gz = gzip_of(text);
  for (size_t i = gz.size() / 2; i < gz.size() / 2 + 16; ++i) gz[i] = char(~gz[i]);
  test::write_text(dir / "flipped.txt.gz", gz);
  std::string zst = zstd_of(text);
  test::write_text(dir / "cut.txt.zst", zst.substr(0, zst.size() * 2 / 3));
  std::string gz2 = gzip_of(text);
  test::write_text(dir / "cut.jsonl.gz", gzip_of(jsonl_of(many_docs())).substr(0, gz2.size() / 2));
  test::write_text(dir / "empty.txt.gz", "");
  test::write_text(dir / "notgzip.gz", text.substr(0, 1000));
  for (const auto& [name, what] : {std::pair{"flipped.txt.gz", "corrupt gzip data"},
                                   std::pair{"cut.txt.zst", "truncated zstd data"},
                                   std::pair{"cut.jsonl.gz", "truncated gzip data"},
                                   std::pair{"empty.txt.gz", "not gzip data"},
                                   std::pair{"notgzip.gz", "corrupt gzip data"}}) {
    o = options(dir, {dir / "plain.txt", dir / name});
    o.shard_tokens = 1000;  // shards are written before the error
    try {
      run_prep(o);
      ADD_FAILURE() << name << ": no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(dir / name), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      EXPECT_NE(msg.find("at compressed byte "), std::string::npos) << msg;
      EXPECT_NE(msg.find(" uncompressed bytes"), std::string::npos) << msg;
    }
    EXPECT_EQ(listing(dir / "out"), before) << name;
    EXPECT_EQ(file_bytes(dir / "out/manifest.json"), before_manifest) << name;
  }
  // The line reached is named: the error comes after the first lines were read.
  try {
    read_documents(dir / "cut.txt.zst", {}, [](std::string&&) {}, [](uint64_t) {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find(dir / "cut.txt.zst:1:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir / "cut.txt.zst:"), std::string::npos) << e.what();
  }
}

// --- Thread count, --dedup, --skip-bad, Parquet -------------------------------

// Every file of a prep output folder (names and bytes), hidden ones included.
std::map<std::string, std::string> output_files(const std::string& d) {
  std::map<std::string, std::string> files;
  for (const std::string& f : listing(d)) files[f] = file_bytes(d + "/" + f);
  return files;
}

// 1, 2 and 4 tokenizer threads, and batches of one to hundreds of
// documents, give the same bytes: every shard and the manifest.
TEST(Prep, OutputIndependentOfThreadCount) {
  test::TempDir dir("prep-threads");
  const std::string corpus = write_corpus(dir / "c.txt", many_docs());
  std::vector<std::map<std::string, std::string>> outs;
  for (const auto& [threads, batch_bytes] : {std::pair{1, 0}, std::pair{2, 3'000}, std::pair{4, 30'000}}) {
    PrepOptions o = options(dir, {corpus});
    o.output_dir = dir / ("out-" + std::to_string(threads));
    o.threads = threads;
    o.batch_bytes = uint64_t(batch_bytes);
    o.shard_tokens = 20'000;
    o.val_fraction = 0.1;
    run_prep(o);
    outs.push_back(output_files(o.output_dir));
  }
  ASSERT_GE(outs[0].size(), 6u);
  EXPECT_TRUE(outs[1] == outs[0]) << "2 threads";
  EXPECT_TRUE(outs[2] == outs[0]) << "4 threads";
}

// The manifest's "prep" record.
nlohmann::json prep_record(const std::string& out) {
  return nlohmann::json::parse(file_bytes(out + "/manifest.json"))["prep"];
}

// --dedup keeps each text's first occurrence: the corpus with repeats gives
// the shards of the corpus without them (the same val/train split, since
// documents are numbered after dedup), and the count in the manifest.
TEST(Prep, DedupDropsExactRepeats) {
  test::TempDir dir("prep-dedup");
  const std::vector<std::string> unique = many_docs();
  std::vector<std::string> repeated;
  for (size_t i = 0; i < unique.size(); ++i) {
    repeated.push_back(unique[i]);
    if (i % 5 == 4) repeated.push_back(unique[i / 2]);  // an earlier document again
  }
  repeated.push_back(unique[0]);
  const uint64_t repeats = repeated.size() - unique.size();
  auto prep = [&](const std::vector<std::string>& docs, const std::string& name, bool dedup) {
    PrepOptions o = options(dir, {write_corpus(dir / (name + ".txt"), docs)});
    o.output_dir = dir / name;
    o.shard_tokens = 30'000;
    o.val_fraction = 0.1;
    o.dedup = dedup;
    o.batch_bytes = 30'000;  // several batches
    return run_prep(o);
  };
  const PrepResult want = prep(unique, "unique", false);
  const PrepResult got = prep(repeated, "dedup", true);
  EXPECT_EQ(got.duplicates, repeats);
  EXPECT_EQ(got.documents, unique.size());
  for (const char* split : {"train", "val"}) {
    EXPECT_EQ(got.manifest.splits.at(split).xxh3, want.manifest.splits.at(split).xxh3) << split;
    EXPECT_EQ(got.manifest.splits.at(split).num_documents, want.manifest.splits.at(split).num_documents) << split;
  }
  for (const ManifestShard& sh : got.manifest.splits.at("train").shards)
    EXPECT_EQ(file_bytes(sh.path), file_bytes(dir / ("unique/" + sh.file))) << sh.file;
  const nlohmann::json rec = prep_record(dir / "dedup");
  EXPECT_EQ(rec["duplicates_removed"], repeats);
  EXPECT_EQ(rec["num_documents"], unique.size());
  EXPECT_FALSE(prep_record(dir / "unique").contains("duplicates_removed")) << "only with --dedup";
  // Without --dedup every repeat is a document.
  EXPECT_EQ(prep(repeated, "kept", false).documents, repeated.size());
}

// Malformed input: one error naming the file and line (row); with
// --skip-bad a counted skip, and the shards of the good documents alone.
TEST(Prep, SkipBadCountsWhatItSkips) {
  test::TempDir dir("prep-skipbad");
  const std::vector<std::string> good = docs8();
  std::string jsonl = jsonl_of({good[0], good[1]}) + "{\"text\": \"unterminated\n" + jsonl_of({good[2]}) +
                      "{\"txt\": \"no field\"}\n" + jsonl_of({good[3]});
  test::write_text(dir / "a.jsonl", jsonl);
  test::write_text(dir / "b.txt", good[4] + "\n\nbad \xFF line\nin a document\n\n" + good[5] + "\n");
  test::write_text(dir / "c.jsonl.gz", gzip_of(jsonl_of({good[6], good[7]})).substr(0, 20));  // truncated
  write_corpus(dir / "good.txt", good);
  PrepOptions o = options(dir, {dir / "a.jsonl", dir / "b.txt", dir / "c.jsonl.gz"});
  o.val_fraction = 0.25;
  for (const auto& [input, where] : {std::pair{"a.jsonl", "a.jsonl:3: not valid JSON"},
                                     std::pair{"b.txt", "b.txt:3: invalid UTF-8"},
                                     std::pair{"c.jsonl.gz", "c.jsonl.gz:1: truncated gzip data"}}) {
    o.inputs = {dir / input};
    try {
      run_prep(o);
      ADD_FAILURE() << input << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
    }
  }
  o.inputs = {dir / "a.jsonl", dir / "b.txt", dir / "c.jsonl.gz", dir / "d.jsonl"};
  test::write_text(dir / "d.jsonl", jsonl_of({good[6], good[7]}));
  o.reader.skip_bad = true;
  const PrepResult got = run_prep(o);
  EXPECT_EQ(got.bad_skipped, 4u);  // two JSONL lines, one text document, the rest of the .gz
  EXPECT_EQ(prep_record(o.output_dir)["bad_skipped"], 4);
  PrepOptions clean = options(dir, {dir / "good.txt"});
  clean.output_dir = dir / "clean";
  clean.val_fraction = 0.25;
  const PrepResult want = run_prep(clean);
  for (const char* split : {"train", "val"})
    EXPECT_EQ(got.manifest.splits.at(split).xxh3, want.manifest.splits.at(split).xxh3) << split;
}

// Writes `docs` as a Parquet file (column "text", row groups of `group`
// rows) with pyarrow; false when pyarrow is missing.
bool write_parquet(const std::string& path, const std::vector<std::string>& docs, int group,
                   const std::string& scratch) {
  test::write_text(scratch + "/docs.jsonl", jsonl_of(docs));
  test::write_text(scratch + "/to_parquet.py",
                   "import json, sys\nimport pyarrow as pa, pyarrow.parquet as pq\n"
                   "docs = [json.loads(l)['text'] for l in open(sys.argv[1], encoding='utf-8')]\n"
                   "pq.write_table(pa.table({'id': list(range(len(docs))), 'text': docs}), sys.argv[2],"
                   " row_group_size=int(sys.argv[3]))\n");
  return test::sh(std::string(WIOLA_PYTHON) + " " + scratch + "/to_parquet.py " + scratch + "/docs.jsonl " + path +
                  " " + std::to_string(group) + " 2>/dev/null") == 0;
}

// A Parquet file's text column gives the shards of the same documents as
// JSONL; without WIOLA_PARQUET, one error saying how to enable it.
TEST(Prep, ParquetGivesTheShardsOfTheSameJsonl) {
  test::TempDir dir("prep-parquet");
  const std::vector<std::string> docs = many_docs();
  if (!parquet_supported()) {
    test::write_text(dir / "x.parquet", "PAR1");
    try {
      run_prep(options(dir, {dir / "x.parquet"}));
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("x.parquet: this wiola was built without Parquet input"), std::string::npos)
          << e.what();
    }
    GTEST_SKIP() << "built without WIOLA_PARQUET";
  }
  if (!write_parquet(dir / "docs.parquet", docs, 1000, dir.path.string())) GTEST_SKIP() << "no pyarrow for " WIOLA_PYTHON;
  test::write_text(dir / "docs.jsonl", jsonl_of(docs));
  std::vector<PrepResult> r;
  for (const char* input : {"docs.jsonl", "docs.parquet"}) {
    PrepOptions o = options(dir, {dir / input});
    o.output_dir = dir / (std::string("out-") + input);
    o.shard_tokens = 50'000;
    o.val_fraction = 0.1;
    r.push_back(run_prep(o));
  }
  ASSERT_GE(r[0].manifest.splits.at("train").shards.size(), 2u);
  for (const char* split : {"train", "val"}) {
    const auto &want = r[0].manifest.splits.at(split), &got = r[1].manifest.splits.at(split);
    EXPECT_EQ(got.xxh3, want.xxh3) << split;
    ASSERT_EQ(got.shards.size(), want.shards.size()) << split;
    for (size_t s = 0; s < want.shards.size(); ++s)
      EXPECT_EQ(file_bytes(got.shards[s].path), file_bytes(want.shards[s].path)) << got.shards[s].file;
  }
  PrepOptions o = options(dir, {dir / "docs.parquet"});
  o.reader.text_field = "body";
  try {
    run_prep(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("docs.parquet: no column \"body\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace wiola
