// The sharded checkpoint format (ckpt/format.h) and its offline tools
// (ckpt/tools.h), without MPI: slices of TP-mapped entries, a
// checkpoint written the way a tp x pp x dp job writes it read back under
// other layouts, and every kind of damage verify must name.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/format.h"
#include "ckpt/tools.h"
#include "config/run_config.h"
#include "model/config.h"
#include "model/params.h"
#include "tests/util/error_of.h"
#include "util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace wiola {
namespace {

#define EXPECT_CONTAINS(msg, part) \
  EXPECT_NE(std::string(msg).find(part), std::string::npos) << "message: " << (msg)

using test::error_of;

// Problems joined into one string, for EXPECT_CONTAINS.
std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& p : v) s += p + "\n";
  return s;
}

// ---- slices_of -------------------------------------------------------------------

// A local -> global map as TP builds them: [0, global) cut into contiguous
// runs, shuffled, and a prefix of them kept (empty sometimes: identity).
std::vector<int32_t> random_map(std::mt19937& g, int global) {
  if (g() % 4 == 0) return {};
  std::vector<std::vector<int32_t>> runs;
  for (int i = 0; i < global;) {
    const int len = std::min(global - i, 1 + int(g() % 5));
    std::vector<int32_t> r;
    for (int k = 0; k < len; ++k) r.push_back(i + k);
    runs.push_back(r);
    i += len;
  }
  std::shuffle(runs.begin(), runs.end(), g);
  const size_t keep = 1 + g() % runs.size();
  std::vector<int32_t> map;
  for (size_t k = 0; k < keep; ++k) map.insert(map.end(), runs[k].begin(), runs[k].end());
  return map;
}

TEST(CheckpointSlices, CoverEachElementOfTheRangeOnceAndRoundTrip) {
  std::mt19937 g(20240611);
  for (int trial = 0; trial < 400; ++trial) {
    ParamEntry e;
    e.name = "t";
    e.grows = 1 + int64_t(g() % 12);
    e.gcols = g() % 3 == 0 ? 1 : 1 + int64_t(g() % 12);
    e.row_map = random_map(g, int(e.grows));
    e.col_map = e.gcols > 1 ? random_map(g, int(e.gcols)) : std::vector<int32_t>{};
    e.rows = e.row_map.empty() ? e.grows : int64_t(e.row_map.size());
    e.cols = e.col_map.empty() ? e.gcols : int64_t(e.col_map.size());
    const int64_t n = e.rows * e.cols;
    // Any [a, b), the whole entry and empty ranges included.
    int64_t a = int64_t(g() % uint32_t(n + 1)), b = int64_t(g() % uint32_t(n + 1));
    if (trial % 10 == 0) a = 0, b = n;
    if (a > b) std::swap(a, b);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": local " + std::to_string(e.rows) + "x" +
                 std::to_string(e.cols) + " of " + std::to_string(e.grows) + "x" + std::to_string(e.gcols) +
                 ", [" + std::to_string(a) + ", " + std::to_string(b) + ")");
    const auto slices = ckpt::slices_of(e, size_t(a), size_t(b));
    // The local values of [a, b): a function of each element's global index.
    std::vector<float> local(size_t(b - a));
    for (int64_t i = a; i < b; ++i) local[size_t(i - a)] = float(1000 + e.global_index(i / e.cols, i % e.cols));
    std::vector<int> seen(size_t(b - a), 0);
    constexpr int64_t kGuard = 7;
    std::vector<float> back(size_t(b - a + 2 * kGuard), -1.0f);  // scatter target with guard zones
    for (const ckpt::Slice& s : slices) {
      ASSERT_GE(s.nr, 1);
      ASSERT_GE(s.nc, 1);
      for (int64_t i = 0; i < s.nr; ++i)
        for (int64_t j = 0; j < s.nc; ++j) {
          const int64_t lf = (s.lr0 + i) * e.cols + (s.lc0 + j);
          ASSERT_GE(lf, a);
          ASSERT_LT(lf, b);
          ++seen[size_t(lf - a)];
          // Local (lr0+i, lc0+j) is global (r0+i, c0+j).
          EXPECT_EQ(e.global_index(s.lr0 + i, s.lc0 + j), (s.r0 + i) * e.gcols + (s.c0 + j));
        }
      std::vector<float> data(size_t(s.size()));
      ckpt::gather_slice(e, s, local.data(), a, data.data());
      for (int64_t i = 0; i < s.nr; ++i)
        for (int64_t j = 0; j < s.nc; ++j)
          ASSERT_EQ(data[size_t(i * s.nc + j)], float(1000 + (s.r0 + i) * e.gcols + s.c0 + j));
      ckpt::scatter_slice(e, s, data.data(), back.data() + kGuard, a);
    }
    for (int64_t i = 0; i < b - a; ++i) {
      ASSERT_EQ(seen[size_t(i)], 1) << "local element " << a + i;
      ASSERT_EQ(back[size_t(kGuard + i)], local[size_t(i)]);
    }
    for (int64_t i = 0; i < kGuard; ++i) {
      ASSERT_EQ(back[size_t(i)], -1.0f);
      ASSERT_EQ(back[size_t(kGuard + (b - a) + i)], -1.0f);
    }
  }
}

// ---- a checkpoint as a tp x pp x dp job writes it ------------------------------------

// Small enough to check every element, big enough that TP splits heads into
// non-contiguous rows (q_proj, gate_proj) and columns (o_proj).
ModelConfig small_model() {
  ModelConfig c = model_preset("wiola-tiny");
  c.d = 16, c.L = 4, c.H = 4, c.Hkv = 2, c.dA = 8, c.dB = 12, c.V = 24, c.T = 8;
  c.validate();
  return c;
}

// The value every layout must see at global element `gi` of tensor `name`.
float expected(const std::string& kind, const std::string& name, int64_t gi) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : kind + "/" + name) h = (h ^ ch) * 0x100000001b3ULL;
  h ^= uint64_t(gi) * 0x9e3779b97f4a7c15ULL;
  h = (h ^ (h >> 31)) * 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 29;
  return float(int64_t(h >> 40) - (int64_t(1) << 23)) / float(1 << 20);  // exact in float
}

// The values a checkpoint holds: (kind, tensor, global element) -> value.
using Values = std::function<float(const std::string&, const std::string&, int64_t)>;

struct Layout {
  int tp = 1;
  std::vector<std::pair<int, int>> stages;  // layer ranges [l0, l1)
  int dp = 1;                               // ZeRO parts of each (tp, pp) rank's buffer
};

struct WrittenFile {
  std::string path;
  ckpt::FileHeader header;
  std::vector<ckpt::TensorPiece> pieces;
};

constexpr const char* kRun = "run0123456789abc";
constexpr int64_t kStep = 12, kTokens = 12 * 64;

// The pieces of what one rank writes: entries it holds, in [lo, hi) of its
// flat buffer, minus what a lower rank writes (Checkpointer::snapshot).
std::vector<ckpt::TensorPiece> pieces_of(const ParamLayout& lay, bool tp0, bool first, size_t lo, size_t hi,
                                         const Values& value) {
  std::vector<ckpt::TensorPiece> out;
  for (const ParamEntry& e : lay.entries()) {
    if ((e.tp_replicated && !tp0) || (e.name == "model.embed_tokens.weight" && !first)) continue;
    const size_t a = std::max(lo, e.offset), b = std::min(hi, e.offset + e.size());
    if (a >= b) continue;
    // This rank's local values of the entry, from the global ones.
    std::map<std::string, std::vector<float>> local;
    for (const char* kind : ckpt::kKinds) {
      auto& v = local[kind];
      for (int64_t r = 0; r < e.rows; ++r)
        for (int64_t c = 0; c < e.cols; ++c) v.push_back(value(kind, e.name, e.global_index(r, c)));
    }
    const auto slices = ckpt::slices_of(e, a - e.offset, b - e.offset);
    for (const char* kind : ckpt::kKinds) {
      ckpt::TensorPiece p{kind, e.name, e.grows, e.gcols, slices, {}};
      for (const ckpt::Slice& s : slices) {
        const size_t at = p.data.size();
        p.data.resize(at + size_t(s.size()));
        ckpt::gather_slice(e, s, local[kind].data(), 0, p.data.data() + at);
      }
      out.push_back(std::move(p));
    }
  }
  return out;
}

// The effective config text a manifest records for `cfg`.
std::string config_text(const ModelConfig& cfg) {
  RunConfig rc;
  rc.model = cfg;
  rc.model.name = "custom";
  return run_config_to_toml(rc);
}

json record_json(const ckpt::FileRecord& r) {
  return {{"name", r.name}, {"rank", r.header.rank}, {"grid_coord", {r.header.tp, r.header.pp, r.header.dp}},
          {"bytes", r.bytes}, {"xxh3", r.xxh3}, {"slices", r.slices}};
}

void write_manifest(const fs::path& folder, const json& mf) {
  std::ofstream(folder / "manifest.json") << mf.dump(1) << "\n";
}
json read_manifest(const fs::path& folder) {
  std::ifstream in(folder / "manifest.json");
  return json::parse(in);
}

// Writes `folder` (created) as the job of `lay` would, with ZeRO parts cut
// at odd offsets (so runs start and end inside rows), and its manifest with
// the fields Checkpointer::commit writes.
std::vector<WrittenFile> write_checkpoint(const fs::path& folder, const ModelConfig& cfg, const Layout& lay,
                                          const Values& value = expected) {
  fs::create_directories(folder);
  std::vector<WrittenFile> files;
  json recs = json::array();
  const int pp = int(lay.stages.size());
  for (int d = 0; d < lay.dp; ++d)
    for (int s = 0; s < pp; ++s)
      for (int t = 0; t < lay.tp; ++t) {
        const ModelShard shard{t, lay.tp, lay.stages[size_t(s)].first, lay.stages[size_t(s)].second};
        const ParamLayout pl(cfg, shard);
        const size_t n = pl.total();
        auto cut = [&](int k) { return k == 0 ? size_t(0) : k == lay.dp ? n : (n * size_t(k) / size_t(lay.dp)) | 1; };
        const int rank = (d * pp + s) * lay.tp + t;
        WrittenFile f;
        char name[32];
        std::snprintf(name, sizeof name, "rank-%05d.h5", rank);
        f.path = (folder / name).string();
        f.header = {kRun, kStep, rank, t, s, d};
        f.pieces = pieces_of(pl, t == 0, shard.first_stage(), cut(d), cut(d + 1), value);
        if (f.pieces.empty()) continue;
        recs.push_back(record_json(ckpt::write_rank_file(f.path, f.header, f.pieces)));
        files.push_back(std::move(f));
      }
  json stages = json::array();
  for (const auto& [a, b] : lay.stages) stages.push_back({a, b});
  json tensors = json::object();
  const ParamLayout full(cfg, ModelShard{});
  for (const ParamEntry& e : full.entries()) tensors[e.name] = {{"shape", {e.grows, e.gcols}}};
  const json mf = {{"config", config_text(cfg)},
                   {"layout", {{"tp", lay.tp}, {"pp", pp}, {"dp", lay.dp}, {"zero", lay.dp > 1}, {"stages", stages}}},
                   {"backend", "cpu"},
                   {"precision", {{"activations", "f32"}, {"residual", "f32"}, {"weights", "f32"}}},
                   {"format", ckpt::kFormat},
                   {"run_id", kRun},
                   {"step", kStep},
                   {"tokens", kTokens},
                   {"skipped", 0},
                   {"applied_steps", kStep},
                   {"loader", {{"seed", 1}, {"epoch", 0}, {"samples_consumed", 96}}},
                   {"identity", {{"model", {{"d", cfg.d}}}}},
                   {"files", recs},
                   {"tensors", tensors}};
  write_manifest(folder, mf);
  return files;
}

// Every element of every kind of every entry a reader of `lay` holds, read
// whole and in a random partial range (a ZeRO share), equals the global value.
void expect_reads_back(const fs::path& folder, const ModelConfig& cfg, int tp, const std::vector<std::pair<int, int>>& stages) {
  ckpt::Reader r(folder.string());
  std::mt19937 g(7);
  for (const auto& [l0, l1] : stages)
    for (int t = 0; t < tp; ++t) {
      const ParamLayout pl(cfg, ModelShard{t, tp, l0, l1});
      for (const ParamEntry& e : pl.entries())
        for (const char* kind : ckpt::kKinds) {
          SCOPED_TRACE(std::string(kind) + "/" + e.name + " tp rank " + std::to_string(t) + " of " +
                       std::to_string(tp) + ", layers [" + std::to_string(l0) + ", " + std::to_string(l1) + ")");
          std::vector<float> all(e.size(), std::nanf(""));
          r.read(kind, e, 0, e.size(), all.data());
          for (size_t i = 0; i < e.size(); ++i)
            ASSERT_EQ(all[i], expected(kind, e.name, e.global_index(int64_t(i) / e.cols, int64_t(i) % e.cols)))
                << "local element " << i;
          size_t a = g() % (e.size() + 1), b = g() % (e.size() + 1);
          if (a > b) std::swap(a, b);
          std::vector<float> part(b - a, std::nanf(""));
          r.read(kind, e, a, b, part.data());
          for (size_t i = a; i < b; ++i) ASSERT_EQ(part[i - a], all[i]) << "element " << i << " of [" << a << ", " << b << ")";
        }
    }
}

// A fresh directory per test under the system temp dir, removed at the end.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("wiola-ckpt-test-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // The reference checkpoint of these tests: tp 2 x pp 2 (layers [0, 1)
  // and [1, 4)) x 2 ZeRO parts.
  fs::path reference() {
    const fs::path f = dir_ / "step-00000012";
    if (!fs::exists(f)) files_ = write_checkpoint(f, cfg_, {2, {{0, 1}, {1, 4}}, 2});
    return f;
  }
  // A copy of the reference to damage.
  fs::path copy(const std::string& name) {
    const fs::path to = dir_ / name;
    fs::copy(reference(), to, fs::copy_options::recursive);
    return to;
  }
  ModelConfig cfg_ = small_model();
  fs::path dir_;
  std::vector<WrittenFile> files_;
};

TEST_F(CheckpointTest, ReadsBackUnderEveryOtherLayout) {
  const fs::path f = reference();
  ASSERT_EQ(files_.size(), 8u);  // 2 x 2 x 2 ranks, each with a share
  EXPECT_TRUE(ckpt::Reader(f.string()).verify().empty());
  using S = std::vector<std::pair<int, int>>;
  expect_reads_back(f, cfg_, 1, S{{0, 4}});
  expect_reads_back(f, cfg_, 2, S{{0, 4}});
  expect_reads_back(f, cfg_, 2, S{{0, 1}, {1, 4}});  // the writer's own layout
  expect_reads_back(f, cfg_, 2, S{{0, 2}, {2, 3}, {3, 4}});
  expect_reads_back(f, cfg_, 1, S{{0, 1}, {1, 2}, {2, 3}, {3, 4}});
}

TEST_F(CheckpointTest, SingleWriterReadsBackUnderTensorParallelism) {
  // The other direction: one file of the whole model, read as TP slices, and
  // a layout with 3 ZeRO parts, no pipeline.
  using S = std::vector<std::pair<int, int>>;
  const fs::path one = dir_ / "one", three = dir_ / "three";
  EXPECT_EQ(write_checkpoint(one, cfg_, {1, {{0, 4}}, 1}).size(), 1u);
  EXPECT_EQ(write_checkpoint(three, cfg_, {1, {{0, 4}}, 3}).size(), 3u);
  for (const fs::path& f : {one, three}) {
    expect_reads_back(f, cfg_, 2, S{{0, 2}, {2, 4}});
    expect_reads_back(f, cfg_, 1, S{{0, 4}});
  }
}

TEST_F(CheckpointTest, ReaderRefusesAShapeOfAnotherModel) {
  ckpt::Reader r(reference().string());
  ModelConfig other = cfg_;
  other.V = 48;
  const ParamLayout pl(other, ModelShard{});
  std::vector<float> v(pl.entries()[0].size());
  EXPECT_CONTAINS(error_of([&] { r.read("param", pl.entries()[0], 0, v.size(), v.data()); }),
                  "model.embed_tokens.weight is [24, 16], this model's is [48, 16]");
}

// ---- verify: each damage named by file -----------------------------------------------

TEST_F(CheckpointTest, SoundCheckpointVerifies) {
  ckpt::VerifyStats st;
  EXPECT_EQ(joined(ckpt::verify_deep(reference().string(), &st)), "");
  EXPECT_EQ(st.files, 8);
  EXPECT_EQ(st.tensors, int64_t(ParamLayout(cfg_, ModelShard{}).entries().size()));
  EXPECT_EQ(st.elements, cfg_.param_count());
  EXPECT_GT(st.datasets, 3 * st.tensors);  // split tensors have several slices
}

TEST_F(CheckpointTest, VerifyReportsATruncatedFile) {
  const fs::path f = copy("truncated");
  fs::resize_file(f / "rank-00001.h5", fs::file_size(f / "rank-00001.h5") / 2);
  const auto p = ckpt::Reader(f.string()).verify();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_CONTAINS(p[0], "rank-00001.h5: ");
  EXPECT_CONTAINS(p[0], "truncated");
  EXPECT_CONTAINS(joined(ckpt::verify_deep(f.string())), (f / "rank-00001.h5").string() + ": ");
}

TEST_F(CheckpointTest, VerifyReportsAFlippedByteDownToTheDataset) {
  const fs::path f = copy("flipped");
  const std::string file = (f / "rank-00002.h5").string();
  // The byte at the start of a dataset's data, so the file still opens and
  // only that dataset's own hash can tell which tensor it hit.
  haddr_t at = 0;
  std::string ds_name;
  {
    const hid_t h = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(h, 0);
    ds_name = "/param/" + files_[2].pieces[0].name + "/0";
    const hid_t ds = H5Dopen2(h, ds_name.c_str(), H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    at = H5Dget_offset(ds);
    H5Dclose(ds);
    H5Fclose(h);
  }
  ASSERT_NE(at, HADDR_UNDEF);
  {
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(std::streamoff(at));
    char c = 0;
    io.get(c);
    io.seekp(std::streamoff(at));
    io.put(char(c ^ 0x10));
  }
  const auto p = ckpt::Reader(f.string()).verify();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], "rank-00002.h5: checksum mismatch (corrupt)");
  const std::string deep = joined(ckpt::verify_deep(f.string()));
  EXPECT_CONTAINS(deep, file + ": checksum mismatch");
  EXPECT_CONTAINS(deep, file + ": " + ds_name + ": data does not match its xxh3 attribute");
  // Consolidation refuses it, naming the file, and leaves nothing behind.
  const std::string out = (dir_ / "out.h5").string();
  EXPECT_CONTAINS(error_of([&] { ckpt::consolidate(f.string(), out, false); }), "rank-00002.h5: checksum mismatch");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}

TEST_F(CheckpointTest, VerifyReportsAMissingFile) {
  const fs::path f = copy("missing");
  fs::remove(f / "rank-00005.h5");
  EXPECT_EQ(joined(ckpt::Reader(f.string()).verify()), "rank-00005.h5: missing\n");
  EXPECT_CONTAINS(joined(ckpt::verify_deep(f.string())), (f / "rank-00005.h5").string() + ": missing");
}

TEST_F(CheckpointTest, VerifyReportsAnotherRanksFileUnderThisName) {
  const fs::path f = copy("swapped");
  fs::copy_file(f / "rank-00001.h5", f / "rank-00000.h5", fs::copy_options::overwrite_existing);
  auto p = ckpt::Reader(f.string()).verify();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_CONTAINS(p[0], "rank-00000.h5: ");
  // A manifest whose size and hash are those of the swapped file (a mixed-up
  // commit): the header still tells.
  json mf = read_manifest(f);
  mf["files"][0]["bytes"] = fs::file_size(f / "rank-00000.h5");
  mf["files"][0]["xxh3"] = ckpt::file_xxh3((f / "rank-00000.h5").string());
  write_manifest(f, mf);
  p = ckpt::Reader(f.string()).verify();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], "rank-00000.h5: written by rank 1, the manifest expects rank 0");
  // Its datasets are not the ones the manifest lists for rank 0 either.
  EXPECT_CONTAINS(joined(ckpt::verify_deep(f.string())), (f / "rank-00000.h5").string() + ": /");
}

// A file of the same rank rewritten with another header (as an older step's
// or another run's file would be), the manifest's size and hash updated.
void rewrite_with_header(const fs::path& f, const WrittenFile& w, const ckpt::FileHeader& h, int index) {
  const ckpt::FileRecord rec = ckpt::write_rank_file((f / fs::path(w.path).filename()).string(), h, w.pieces);
  json mf = read_manifest(f);
  mf["files"][size_t(index)]["bytes"] = rec.bytes;
  mf["files"][size_t(index)]["xxh3"] = rec.xxh3;
  write_manifest(f, mf);
}

TEST_F(CheckpointTest, VerifyReportsAFileOfAnotherStepOrRun) {
  const fs::path f = copy("other-step");
  ckpt::FileHeader h = files_[3].header;
  h.step = 11;
  rewrite_with_header(f, files_[3], h, 3);
  EXPECT_EQ(joined(ckpt::Reader(f.string()).verify()),
            "rank-00003.h5: written at step 11, this checkpoint is step 12\n");

  const fs::path g = copy("other-run");
  h = files_[4].header;
  h.run_id = "ffffffffffffffff";
  rewrite_with_header(g, files_[4], h, 4);
  EXPECT_EQ(joined(ckpt::Reader(g.string()).verify()),
            std::string("rank-00004.h5: belongs to run ffffffffffffffff, this checkpoint is run ") + kRun + "\n");
  EXPECT_CONTAINS(joined(ckpt::verify_deep(g.string())), (g / "rank-00004.h5").string() + ": belongs to run");
}

// The manifest's own consistency: the Reader refuses it naming the file, and
// verify's coverage map says where.
TEST_F(CheckpointTest, ManifestWithASliceOutsideTheTensor) {
  const fs::path f = copy("outside");
  json mf = read_manifest(f);
  json& s = mf["files"][1]["slices"]["exp_avg"];
  const std::string name = s.begin().key();
  s[name][0][0] = s[name][0][0].get<int64_t>() + 1000;
  write_manifest(f, mf);
  EXPECT_CONTAINS(error_of([&] { ckpt::Reader r(f.string()); }),
                  "file rank-00001.h5: slice 0 of exp_avg/" + name + " lies outside the tensor");
  const std::string deep = joined(ckpt::verify_deep(f.string()));
  EXPECT_CONTAINS(deep, "rank-00001.h5/exp_avg/" + name + "/0: slice [");
  EXPECT_CONTAINS(deep, "exp_avg/" + name + ": ");  // and the hole it leaves
  EXPECT_CONTAINS(deep, "elements in no slice");
}

TEST_F(CheckpointTest, ManifestWithATensorNotCovered) {
  const fs::path f = copy("hole");
  json mf = read_manifest(f);
  // One slice less: a hole.
  json& arr = mf["files"][0]["slices"]["param"]["model.layers.0.self_attn.q_proj.weight"];
  ASSERT_GE(arr.size(), 1u);
  const json gone = arr.back();
  arr.erase(arr.size() - 1);
  write_manifest(f, mf);
  const std::string err = error_of([&] { ckpt::Reader r(f.string()); });
  EXPECT_CONTAINS(err, (f / "manifest.json").string());
  EXPECT_CONTAINS(err, "param/model.layers.0.self_attn.q_proj.weight: slices hold");
  const std::string deep = joined(ckpt::verify_deep(f.string()));
  EXPECT_CONTAINS(deep, (f / "manifest.json").string() + ": param/model.layers.0.self_attn.q_proj.weight: " +
                            std::to_string(gone[2].get<int64_t>() * gone[3].get<int64_t>()) + " of 256 elements in no slice (the first at [" +
                            std::to_string(gone[0].get<int64_t>()) + ", " + std::to_string(gone[1].get<int64_t>()) + "])");
  // And a tensor no file holds at all (the hole above mended).
  arr.push_back(gone);
  for (auto& file : mf["files"])
    if (file["slices"].contains("exp_avg_sq")) file["slices"]["exp_avg_sq"].erase("model.norm.offset");
  write_manifest(f, mf);
  EXPECT_CONTAINS(error_of([&] { ckpt::Reader r(f.string()); }), "exp_avg_sq/model.norm.offset: in no file");
  EXPECT_CONTAINS(joined(ckpt::verify_deep(f.string())), "exp_avg_sq/model.norm.offset: in no file");
}

// Manifests a fuzzer made (tests/fuzz): a mistyped "kinds", a file name that
// leaves the folder, sizes whose products overflow. Each is refused naming
// the manifest; verify lists the problem instead of throwing.
TEST_F(CheckpointTest, ManifestFieldsOutOfBounds) {
  const fs::path f = copy("bounds");
  const json good = read_manifest(f);
  auto refused = [&](const std::function<void(json&)>& edit, const std::string& needle) {
    json mf = good;
    edit(mf);
    write_manifest(f, mf);
    const std::string err = error_of([&] { ckpt::Reader r(f.string()); });
    EXPECT_CONTAINS(err, (f / "manifest.json").string());
    EXPECT_CONTAINS(err, needle);
    EXPECT_CONTAINS(joined(ckpt::verify_deep(f.string())), needle);
  };
  refused([](json& mf) { mf["kinds"] = json::array({1, 2}); }, "\"kinds\" is [1,2], expected distinct entries");
  refused([](json& mf) { mf["kinds"] = json::array({"param", "param", "param"}); }, "\"kinds\" is");
  refused([](json& mf) { mf["files"][0]["name"] = ".."; }, "file name '..' is not a plain name");
  refused([](json& mf) { mf["tensors"]["model.norm.weight"]["shape"] = json::array({int64_t(1) << 62, int64_t(1) << 62}); },
          "tensor model.norm.weight: bad shape");
  refused(
      [](json& mf) {
        for (auto& rec : mf["files"])
          if (rec["slices"]["param"].contains("model.norm.weight"))
            rec["slices"]["param"]["model.norm.weight"][0][0] = int64_t(1) << 62;
      },
      "lies outside the tensor");
  refused([](json& mf) { mf["tensors"] = json::object(); }, "lists no tensors");
}

TEST_F(CheckpointTest, ManifestWithAnOverlapHidingAHoleOfTheSameSize) {
  // model.norm.weight [16, 1] is one slice of one file; split into [0, 8)
  // and [4, 12): 16 elements in all, as many as the tensor has, yet [4, 8)
  // twice and [12, 16) never (a bare element count passes this).
  const fs::path f = copy("overlap");
  json mf = read_manifest(f);
  std::string file;
  for (auto& rec : mf["files"])
    if (rec["slices"]["param"].contains("model.norm.weight")) {
      rec["slices"]["param"]["model.norm.weight"] = json::array({{0, 0, 8, 1}, {4, 0, 8, 1}});
      file = rec["name"];
    }
  ASSERT_FALSE(file.empty());
  write_manifest(f, mf);
  EXPECT_CONTAINS(error_of([&] { ckpt::Reader r(f.string()); }),
                  "param/model.norm.weight: slice " + file + "/param/model.norm.weight/0 overlaps " + file +
                      "/param/model.norm.weight/1");
  const std::string deep = joined(ckpt::verify_deep(f.string()));
  EXPECT_CONTAINS(deep, "param/model.norm.weight: 4 of 16 elements in no slice (the first at [12, 0])");
  EXPECT_CONTAINS(deep, "param/model.norm.weight: 4 elements in more than one slice (the first at [4, 0], in " + file +
                            "/param/model.norm.weight/0 and " + file + "/param/model.norm.weight/1)");
}

TEST_F(CheckpointTest, VerifyReportsADatasetTheManifestDoesNotList) {
  // A dataset added to a file whose manifest record is otherwise right
  // (size and hash updated): only the listing comparison can tell.
  const fs::path f = copy("stray");
  const std::string file = (f / "rank-00001.h5").string();
  const std::string stray = "/param/" + files_[1].pieces[0].name + "/99";
  {
    const hid_t h = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(h, 0);
    const hsize_t dims[2] = {1, 1};
    const hid_t sp = H5Screate_simple(2, dims, nullptr);
    const hid_t ds = H5Dcreate2(h, stray.c_str(), H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    const float one = 1;
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, &one);
    H5Dclose(ds);
    H5Sclose(sp);
    H5Fclose(h);
  }
  json mf = read_manifest(f);
  mf["files"][1]["bytes"] = fs::file_size(file);
  mf["files"][1]["xxh3"] = ckpt::file_xxh3(file);
  write_manifest(f, mf);
  EXPECT_TRUE(ckpt::Reader(f.string()).verify().empty());
  EXPECT_EQ(joined(ckpt::verify_deep(f.string())), file + ": " + stray + ": in the file but not in the manifest\n");
}

// ---- consolidate -------------------------------------------------------------------

// A dataset of an HDF5 file as floats, with its dimensions.
std::vector<float> read_dataset(hid_t f, const std::string& name, std::vector<hsize_t>& dims) {
  const hid_t ds = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  if (ds < 0) return {};
  const hid_t sp = H5Dget_space(ds);
  dims.assign(size_t(H5Sget_simple_extent_ndims(sp)), 0);
  H5Sget_simple_extent_dims(sp, dims.data(), nullptr);
  std::vector<float> v(size_t(H5Sget_simple_extent_npoints(sp)));
  H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Sclose(sp);
  H5Dclose(ds);
  return v;
}

TEST_F(CheckpointTest, ModelConfigComesFromTheRecordedConfig) {
  const ModelConfig c = ckpt::model_config(ckpt::Reader(reference().string()));
  EXPECT_EQ(c.d, cfg_.d);
  EXPECT_EQ(c.L, cfg_.L);
  EXPECT_EQ(c.H, cfg_.H);
  EXPECT_EQ(c.Hkv, cfg_.Hkv);
  EXPECT_EQ(c.dA, cfg_.dA);
  EXPECT_EQ(c.dB, cfg_.dB);
  EXPECT_EQ(c.V, cfg_.V);
  EXPECT_EQ(c.param_count(), cfg_.param_count());
}

TEST_F(CheckpointTest, ConsolidateWritesEveryTensorWhole) {
  const std::string out = (dir_ / "model.h5").string();
  for (const bool with_opt : {false, true}) {
    const auto st = ckpt::consolidate(reference().string(), out, with_opt);
    EXPECT_EQ(st.step, kStep);
    EXPECT_EQ(st.elements, cfg_.param_count());
    EXPECT_FALSE(fs::exists(out + ".tmp"));
    const hid_t f = H5Fopen(out.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const ParamLayout full(cfg_, ModelShard{});
    for (const ParamEntry& e : full.entries())
      for (const char* kind : ckpt::kKinds) {
        std::vector<hsize_t> dims;
        const std::vector<float> v = read_dataset(f, std::string("/") + kind + "/" + e.name, dims);
        if (!with_opt && std::string(kind) != "param") {
          EXPECT_TRUE(v.empty()) << kind << "/" << e.name << " written without --with-optimizer";
          continue;
        }
        ASSERT_EQ(v.size(), e.size()) << kind << "/" << e.name;
        const std::vector<hsize_t> want =
            e.is_matrix() ? std::vector<hsize_t>{hsize_t(e.grows), hsize_t(e.gcols)} : std::vector<hsize_t>{hsize_t(e.grows)};
        EXPECT_EQ(dims, want) << kind << "/" << e.name;
        for (size_t i = 0; i < v.size(); ++i)
          ASSERT_EQ(v[i], expected(kind, e.name, int64_t(i))) << kind << "/" << e.name << " element " << i;
      }
    int64_t step = 0;
    const hid_t a = H5Aopen(f, "step", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT64, &step);
    H5Aclose(a);
    EXPECT_EQ(step, kStep);
    EXPECT_GT(H5Aexists(f, "config"), 0);
    EXPECT_GT(H5Aexists(f, "tokens"), 0);
    H5Fclose(f);
  }
}

TEST_F(CheckpointTest, ConsolidateNamesBadInput) {
  const std::string out = (dir_ / "x.h5").string();
  fs::create_directories(dir_ / "empty");
  EXPECT_CONTAINS(error_of([&] { ckpt::consolidate((dir_ / "empty").string(), out, false); }),
                  "checkpoint '" + (dir_ / "empty").string() + "': no manifest.json");
  EXPECT_CONTAINS(error_of([&] { ckpt::consolidate(reference().string(), (dir_ / "no" / "x.h5").string(), false); }),
                  (dir_ / "no" / "x.h5.tmp").string() + ": cannot create");
  EXPECT_FALSE(fs::exists(out));
}

// ---- diff ---------------------------------------------------------------------------

TEST_F(CheckpointTest, DiffOfTheSameValuesUnderAnotherLayoutIsBitIdentical) {
  const fs::path other = dir_ / "one-process";
  write_checkpoint(other, cfg_, {1, {{0, 4}}, 1});
  for (const bool with_opt : {false, true}) {
    const ckpt::DiffResult r = ckpt::diff(reference().string(), other.string(), with_opt);
    EXPECT_EQ(r.elements, cfg_.param_count());
    EXPECT_EQ(r.differing, 0);
    EXPECT_EQ(r.model_rel, 0.0);
    const size_t n = ParamLayout(cfg_, ModelShard{}).entries().size();
    ASSERT_EQ(r.tensors.size(), with_opt ? 3 * n : n);
    for (const auto& d : r.tensors) EXPECT_EQ(d.differing, 0) << d.kind << "/" << d.name;
    EXPECT_TRUE(r.model_keys_differ.empty());
  }
}

TEST_F(CheckpointTest, DiffCountsAndMeasuresEachDifference) {
  const std::string moved = "model.layers.1.mlp.fusion.weight", broken = "model.layers.2.self_attn.o_proj.weight";
  const fs::path other = dir_ / "perturbed";
  // Another layout (3 ZeRO parts), one parameter moved by exactly 0.5, one
  // first moment NaN.
  write_checkpoint(other, cfg_, {1, {{0, 2}, {2, 4}}, 3}, [&](const std::string& kind, const std::string& name, int64_t gi) {
    const float v = expected(kind, name, gi);
    if (kind == "param" && name == moved && gi == 5) return v + 0.5f;
    if (kind == "exp_avg" && name == broken && gi == 0) return std::nanf("");
    return v;
  });
  const ParamLayout full(cfg_, ModelShard{});
  auto norm_of = [&](const std::string& name) {
    double sq = 0;
    for (int64_t i = 0; i < int64_t(full.find(name).size()); ++i) sq += double(expected("param", name, i)) * expected("param", name, i);
    return std::sqrt(sq);
  };
  double model_sq = 0;
  for (const ParamEntry& e : full.entries()) model_sq += norm_of(e.name) * norm_of(e.name);

  const ckpt::DiffResult r = ckpt::diff(reference().string(), other.string(), true);
  EXPECT_EQ(r.differing, 1);
  EXPECT_DOUBLE_EQ(r.model_rel, 0.5 / std::sqrt(model_sq));
  int seen = 0;
  for (const auto& d : r.tensors) {
    SCOPED_TRACE(d.kind + "/" + d.name);
    if (d.kind == "param" && d.name == moved) {
      ++seen;
      EXPECT_EQ(d.differing, 1);
      EXPECT_EQ(d.max_abs, 0.5);
      EXPECT_DOUBLE_EQ(d.rel, 0.5 / norm_of(moved));
    } else if (d.kind == "exp_avg" && d.name == broken) {
      ++seen;
      EXPECT_EQ(d.differing, 1);
      EXPECT_TRUE(std::isinf(d.rel));
      EXPECT_TRUE(std::isinf(d.max_abs));
    } else {
      EXPECT_EQ(d.differing, 0);
      EXPECT_EQ(d.rel, 0.0);
    }
  }
  EXPECT_EQ(seen, 2);
  // Without the moments the NaN is not looked at.
  const ckpt::DiffResult p = ckpt::diff(reference().string(), other.string(), false);
  EXPECT_EQ(p.tensors.size(), full.entries().size());
  EXPECT_EQ(p.differing, 1);
}

TEST_F(CheckpointTest, DiffRefusesAnotherModelAndADamagedCheckpoint) {
  ModelConfig wider = cfg_;
  wider.V = 32;
  const fs::path other = dir_ / "other-model";
  write_checkpoint(other, wider, {1, {{0, 4}}, 1});
  EXPECT_CONTAINS(error_of([&] { ckpt::diff(reference().string(), other.string(), false); }),
                  "model.embed_tokens.weight is [24, 16] in '" + reference().string() + "' and [32, 16] in '" +
                      other.string() + "': not the same model");
  // One layer more: every tensor of the reference is there with its shape, and more.
  ModelConfig deeper = cfg_;
  deeper.L = 5;
  const fs::path more = dir_ / "deeper-model";
  write_checkpoint(more, deeper, {1, {{0, 5}}, 1});
  EXPECT_CONTAINS(error_of([&] { ckpt::diff(reference().string(), more.string(), false); }),
                  "'" + reference().string() + "' holds " + std::to_string(ParamLayout(cfg_, ModelShard{}).entries().size()) +
                      " tensors, '" + more.string() + "' " +
                      std::to_string(ParamLayout(deeper, ModelShard{}).entries().size()) + ": not the same model");
  const fs::path bad = copy("damaged");
  fs::resize_file(bad / "rank-00005.h5", fs::file_size(bad / "rank-00005.h5") - 7);
  EXPECT_CONTAINS(error_of([&] { ckpt::diff(reference().string(), bad.string(), false); }),
                  "checkpoint '" + bad.string() + "' is damaged: ");
}

// A rank file the disk refuses: the error names the file and the reason,
// no temporary file is left, and HDF5 holds no file open (HDF5 builds it in
// memory; with HDF5 1.10 a failed write inside HDF5 left a half-closed file
// that crashed the process at exit).
TEST_F(CheckpointTest, RankFileOnAFullDiskFailsCleanly) {
  reference();
  const WrittenFile& w = files_.at(0);
  const fs::path full = dir_ / "full", missing = dir_ / "missing";
  fs::create_directories(full);
  fs::create_symlink("/dev/full", full / "rank-00000.h5.tmp");  // every write: ENOSPC
  EXPECT_CONTAINS(error_of([&] { ckpt::write_rank_file((full / "rank-00000.h5").string(), w.header, w.pieces); }),
                  (full / "rank-00000.h5.tmp").string() + ": write failed: " + std::strerror(ENOSPC));
  EXPECT_CONTAINS(error_of([&] { ckpt::write_rank_file((missing / "rank-00000.h5").string(), w.header, w.pieces); }),
                  (missing / "rank-00000.h5.tmp").string() + ": cannot create: ");
  EXPECT_TRUE(fs::is_empty(full)) << "the temporary file was left";
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0) << "HDF5 objects left open";
}

// `wiola ckpt consolidate` onto a disk that refuses every write (/dev/full
// as its temporary file): one error naming the file and the reason, nothing left at the output or the temporary name, and no HDF5
// object left open (HDF5 1.10 left a half-closed file after a failed write
// that crashed the process at exit). A real full tmpfs at every stage:
// ctest ckpt_consolidate_disk_full.
TEST_F(CheckpointTest, ConsolidateOnAFullDiskFailsCleanly) {
  const fs::path full = dir_ / "consolidate-full";
  fs::create_directories(full);
  fs::create_symlink("/dev/full", full / "out.h5.tmp");
  const std::string msg = error_of([&] { ckpt::consolidate(reference().string(), (full / "out.h5").string(), true); });
  // HDF5 writes the file's first bytes when it creates it.
  EXPECT_CONTAINS(msg, (full / "out.h5.tmp").string() + ": cannot create: " + std::strerror(ENOSPC));
  EXPECT_TRUE(fs::is_empty(full)) << "left behind: " << fs::directory_iterator(full)->path();
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0) << "HDF5 objects left open";
}

TEST(CheckpointList, SkipsForeignAndIncompleteFolders) {
  std::random_device rd;
  const fs::path d = fs::temp_directory_path() / ("wiola-ckpt-list-" + std::to_string(rd()));
  for (const char* n : {"step-00000002", "step-00000010", "step-00000007", ".tmp-step-00000011",
                        "step-123456789012345678901234", "step-x"}) {
    fs::create_directories(d / n);
    std::ofstream(d / n / "manifest.json") << "{}";
  }
  fs::create_directories(d / "step-00000020");  // no manifest: incomplete
  const auto all = ckpt::list_checkpoints(d.string());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(fs::path(all[0]).filename(), "step-00000010");
  EXPECT_EQ(fs::path(all[2]).filename(), "step-00000002");
  EXPECT_EQ(fs::path(ckpt::resolve_checkpoint(d.string())).filename(), "step-00000010");
  std::ofstream(d / "latest") << "step-00000007\n";
  EXPECT_EQ(fs::path(ckpt::resolve_checkpoint(d.string())).filename(), "step-00000007");
  EXPECT_CONTAINS(error_of([&] { ckpt::resolve_checkpoint((d / "nothing").string()); }), "no such directory");
  fs::remove_all(d);
}

}  // namespace
}  // namespace wiola
