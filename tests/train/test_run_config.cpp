// Run configuration: TOML loading, presets, --set overrides, error messages,
// validation, the canonical TOML round trip and the shipped configs/*.toml.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "kernels/backend.h"
#include "tests/util/error_of.h"
#include "train/data_plane.h"
#include "util/error.h"

namespace fs = std::filesystem;

namespace wiola {
namespace {

// A fresh directory under the system temp dir, removed at the end.
class RunConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("wiola-run-config-" + std::to_string(rd()) + "-" + std::to_string(rd()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  fs::path dir_;
};

using test::error_of;

std::string load_error(const std::string& path, const std::vector<std::string>& ov = {}) {
  return error_of([&] { load_run_config(path, ov); });
}

#define EXPECT_CONTAINS(msg, part) EXPECT_NE(std::string(msg).find(part), std::string::npos) << "message: " << (msg)

TEST_F(RunConfigTest, EmptyPathGivesDefaults) {
  const RunConfig rc = load_run_config("", {});
  const RunConfig def;
  EXPECT_EQ(rc.source, "");
  EXPECT_EQ(rc.preset, "");
  EXPECT_EQ(rc.model.name, "custom");
  EXPECT_EQ(rc.model.d, def.model.d);
  EXPECT_EQ(rc.model.L, def.model.L);
  EXPECT_EQ(rc.train.micro_batch, 8);
  EXPECT_EQ(rc.train.grad_accum, 1);
  EXPECT_EQ(rc.train.steps, 0);
  EXPECT_EQ(rc.train.warmup, -1);
  EXPECT_DOUBLE_EQ(rc.train.lr_max, 3e-4);
  EXPECT_DOUBLE_EQ(rc.train.beta2, 0.95);
  EXPECT_EQ(rc.train.seed, 1234u);
  EXPECT_EQ(rc.train.run_dir, "runs/default");
  EXPECT_TRUE(rc.data.shuffle);
  EXPECT_EQ(rc.data.seed, -1);
  EXPECT_EQ(rc.parallel.schedule, dist::Schedule::OneFOneB);
  EXPECT_TRUE(rc.parallel.zero);
  EXPECT_EQ(rc.checkpoint.keep, 2);
  EXPECT_EQ(rc.global_batch(), 8);
}

TEST_F(RunConfigTest, EmptyFileGivesDefaults) {
  const std::string p = write("empty.toml", "# nothing\n");
  const RunConfig rc = load_run_config(p, {});
  EXPECT_EQ(rc.source, p);
  EXPECT_EQ(rc.model.d, ModelConfig{}.d);
  EXPECT_EQ(rc.train.micro_batch, 8);
}

TEST_F(RunConfigTest, PresetThenFieldOverride) {
  const std::string p = write("a.toml", R"(
[model]
seq_len = 256        # applied on top of the preset, wherever it is written
preset = "wiola-360m"
atm = false
atm_tau = 0.5
ctx_gate_init = -2   # an integer is fine for a float key

[train]
micro_batch = 4
grad_accum = 3
lr_max = 6e-4
seed = 99
run_dir = "runs/x"

[parallel]
dp = 2
schedule = "gpipe"
)");
  const RunConfig rc = load_run_config(p, {});
  EXPECT_EQ(rc.preset, "wiola-360m");
  EXPECT_EQ(rc.model.name, "wiola-360m");
  EXPECT_EQ(rc.model.d, 1024);
  EXPECT_EQ(rc.model.L, 16);
  EXPECT_EQ(rc.model.H, 16);
  EXPECT_EQ(rc.model.Hkv, 4);
  EXPECT_EQ(rc.model.dB, 4096);
  EXPECT_EQ(rc.model.T, 256);
  EXPECT_FALSE(rc.model.atm);
  EXPECT_DOUBLE_EQ(rc.model.tau, 0.5);
  EXPECT_DOUBLE_EQ(rc.model.phi_init, -2.0);
  EXPECT_EQ(rc.model.param_count(), 318048272);  // T does not change N (docs/model.md §1)
  EXPECT_EQ(rc.train.micro_batch, 4);
  EXPECT_EQ(rc.train.grad_accum, 3);
  EXPECT_DOUBLE_EQ(rc.train.lr_max, 6e-4);
  EXPECT_EQ(rc.train.seed, 99u);
  EXPECT_EQ(rc.train.run_dir, "runs/x");
  EXPECT_EQ(rc.parallel.schedule, dist::Schedule::GPipe);
  EXPECT_EQ(rc.global_batch(), 4 * 3 * 2);
}

TEST_F(RunConfigTest, SetOverridesBeatFile) {
  const std::string p = write("a.toml", R"(
[model]
preset = "wiola-tiny"
seq_len = 64
d_b = 128
[train]
steps = 10
run_dir = "runs/file"
[data]
path = "from/file"
)");
  const RunConfig rc = load_run_config(
      p, {"train.steps=20", "train.lr_max = 1e-3", "data.path=runs/shards/manifest.json", "train.run_dir=2024",
          "data.shuffle=false", "parallel.schedule=gpipe", "train.recompute=true"});
  EXPECT_EQ(rc.train.steps, 20);
  EXPECT_DOUBLE_EQ(rc.train.lr_max, 1e-3);
  EXPECT_EQ(rc.data.path, "runs/shards/manifest.json");  // bare string
  EXPECT_EQ(rc.train.run_dir, "2024");                   // text kept for a string key
  EXPECT_FALSE(rc.data.shuffle);
  EXPECT_EQ(rc.parallel.schedule, dist::Schedule::GPipe);
  EXPECT_TRUE(rc.train.recompute);
  EXPECT_EQ(rc.model.T, 64);
  // A later --set wins over an earlier one.
  EXPECT_EQ(load_run_config(p, {"train.steps=1", "train.steps=2"}).train.steps, 2);
  // Quoted TOML strings work too.
  EXPECT_EQ(load_run_config(p, {"data.path=\"a b\""}).data.path, "a b");
}

TEST_F(RunConfigTest, PresetOverrideReappliesExplicitModelKeys) {
  const std::string p = write("a.toml", "[model]\npreset = \"wiola-tiny\"\nseq_len = 64\n");
  const RunConfig rc = load_run_config(p, {"model.preset=wiola-small", "model.n_layers=3"});
  EXPECT_EQ(rc.preset, "wiola-small");
  EXPECT_EQ(rc.model.d, 128);    // from the new preset
  EXPECT_EQ(rc.model.V, 32000);  // from the new preset
  EXPECT_EQ(rc.model.T, 64);     // file key re-applied on top
  EXPECT_EQ(rc.model.L, 3);      // override on top
  // Overrides alone, no file.
  const RunConfig r2 = load_run_config("", {"model.preset=\"wiola-bench\""});
  EXPECT_EQ(r2.model.d, 256);
  EXPECT_EQ(r2.model.name, "wiola-bench");
}

TEST_F(RunConfigTest, UnknownPreset) {
  const std::string p = write("a.toml", "[model]\npreset = \"wiola-9b\"\n");
  const std::string m = load_error(p);
  EXPECT_CONTAINS(m, p);
  EXPECT_CONTAINS(m, "model.preset");
  EXPECT_CONTAINS(m, "wiola-9b");
}

TEST_F(RunConfigTest, UnknownKeyNamesKeyAndFile) {
  const std::string p = write("a.toml", "[train]\nsteps = 5\nmicro_bach = 4\n");
  const std::string m = load_error(p);
  EXPECT_CONTAINS(m, p + ":3:1:");
  EXPECT_CONTAINS(m, "train.micro_bach");
  EXPECT_CONTAINS(m, "did you mean 'train.micro_batch'");
  // A key of another section is suggested there.
  const std::string m2 = load_error(write("b.toml", "[train]\npath = \"x\"\n"));
  EXPECT_CONTAINS(m2, "train.path");
  EXPECT_CONTAINS(m2, "data.path");
  // Keys outside any section.
  EXPECT_CONTAINS(load_error(write("c.toml", "steps = 3\n")), "train.steps");
  // In an override.
  const std::string m3 = load_error("", {"train.stepz=3"});
  EXPECT_CONTAINS(m3, "<--set>");
  EXPECT_CONTAINS(m3, "train.stepz");
  EXPECT_CONTAINS(m3, "train.steps");
  // Nested tables are not keys either.
  EXPECT_CONTAINS(load_error(write("d.toml", "[train.extra]\nx = 1\n")), "train.extra");
}

TEST_F(RunConfigTest, UnknownSection) {
  const std::string p = write("a.toml", "[model]\nd = 64\n\n[trian]\nsteps = 5\n");
  const std::string m = load_error(p);
  EXPECT_CONTAINS(m, p);
  EXPECT_CONTAINS(m, "[trian]");
  EXPECT_CONTAINS(m, "did you mean [train]");
  const std::string m2 = load_error("", {"optim.lr=1"});
  EXPECT_CONTAINS(m2, "<--set>");
  EXPECT_CONTAINS(m2, "[optim]");
  EXPECT_CONTAINS(load_error(write("b.toml", "train = 3\n")), "must be a table");
}

TEST_F(RunConfigTest, WrongTypes) {
  auto err = [&](const std::string& body) { return load_error(write("t.toml", body)); };
  std::string m = err("[train]\nmicro_batch = \"eight\"\n");
  EXPECT_CONTAINS(m, "train.micro_batch");
  EXPECT_CONTAINS(m, "expected an integer");
  EXPECT_CONTAINS(m, "string");
  EXPECT_CONTAINS(m, "t.toml:2");
  m = err("[train]\nsteps = 2.5\n");  // float for an integer key
  EXPECT_CONTAINS(m, "train.steps");
  EXPECT_CONTAINS(m, "float");
  m = err("[train]\nmicro_batch = 3000000000\n");  // beyond int
  EXPECT_CONTAINS(m, "train.micro_batch");
  EXPECT_CONTAINS(m, "out of range");
  m = err("[train]\nlr_max = \"fast\"\n");
  EXPECT_CONTAINS(m, "train.lr_max");
  EXPECT_CONTAINS(m, "expected a number");
  m = err("[train]\nlr_max = nan\n");
  EXPECT_CONTAINS(m, "finite");
  m = err("[model]\natm = 1\n");
  EXPECT_CONTAINS(m, "model.atm");
  EXPECT_CONTAINS(m, "boolean");
  m = err("[data]\npath = 3\n");
  EXPECT_CONTAINS(m, "data.path");
  EXPECT_CONTAINS(m, "expected a string");
  m = err("[train]\nseed = -1\n");
  EXPECT_CONTAINS(m, "train.seed");
  EXPECT_CONTAINS(m, "non-negative");
  m = err("[parallel]\ntp = [1, 2]\n");
  EXPECT_CONTAINS(m, "parallel.tp");
  EXPECT_CONTAINS(m, "array");
  m = err("[train]\neval_tasks = \"a.jsonl\"\n");  // a list of files, not one
  EXPECT_CONTAINS(m, "train.eval_tasks");
  EXPECT_CONTAINS(m, "expected an array of strings");
  m = err("[train]\neval_tasks = [\"a.jsonl\", 2]\n");
  EXPECT_CONTAINS(m, "element 2 of 2: expected a string");
  // Integers are fine for floats.
  EXPECT_DOUBLE_EQ(load_run_config(write("ok.toml", "[train]\nclip = 2\n"), {}).train.clip, 2.0);
  // In an override.
  m = load_error("", {"train.micro_batch=abc"});
  EXPECT_CONTAINS(m, "<--set>");
  EXPECT_CONTAINS(m, "train.micro_batch");
  EXPECT_CONTAINS(m, "expected an integer");
}

// parallel.data_plane: three names; "nccl" needs a CUDA backend, and a
// CPU backend says so when the trainer chooses (train/data_plane.cpp).
TEST_F(RunConfigTest, DataPlane) {
  EXPECT_EQ(load_run_config("", {}).parallel.data_plane, DataPlaneMode::Auto);
  EXPECT_EQ(load_run_config("", {"parallel.data_plane=staged"}).parallel.data_plane, DataPlaneMode::Staged);
  const std::string m = load_error("", {"parallel.data_plane=gloo"});
  EXPECT_CONTAINS(m, "parallel.data_plane");
  EXPECT_CONTAINS(m, "\"gloo\"");
  auto cpu = make_backend<float>("cpu");
  EXPECT_EQ(choose_data_plane(*cpu, DataPlaneMode::Auto, 4).name, "mpi");
  EXPECT_EQ(choose_data_plane(*cpu, DataPlaneMode::Staged, 4).name, "mpi");
  auto opaque = make_backend<float>("cpu-opaque");
  EXPECT_EQ(choose_data_plane(*opaque, DataPlaneMode::Auto, 4).name, "mpi-staged");
  EXPECT_CONTAINS(error_of([&] { choose_data_plane(*cpu, DataPlaneMode::Nccl, 2); }), "parallel.data_plane = \"nccl\"");
  // Not a CUDA backend: a shared GPU changes nothing (the emulator's
  // emu.layout_shared_* tests cover the CUDA backend's choice).
  EXPECT_EQ(choose_data_plane(*opaque, DataPlaneMode::Auto, 4, "ranks 0 and 1 share GPU h/0000:00:00").name,
            "mpi-staged");
}

TEST_F(RunConfigTest, HeadsNotDivisibleByKvHeads) {
  const std::string p = write("a.toml", "[model]\nd = 96\nn_heads = 6\nn_kv_heads = 4\n");
  const std::string m = load_error(p);
  EXPECT_CONTAINS(m, p);
  EXPECT_CONTAINS(m, "model.n_heads");
  EXPECT_CONTAINS(m, "model.n_kv_heads");
}

TEST_F(RunConfigTest, OddHeadDim) {
  // d / n_heads = 60 / 4 = 15.
  const std::string m = load_error(write("a.toml", "[model]\nd = 60\n"));
  EXPECT_CONTAINS(m, "head dim");
  EXPECT_CONTAINS(m, "15");
}

TEST_F(RunConfigTest, SequenceTooShort) {
  const std::string m = load_error("", {"model.seq_len=1"});
  EXPECT_CONTAINS(m, "model.seq_len");
  EXPECT_CONTAINS(m, "<--set>");
}

TEST_F(RunConfigTest, ValidationOfTrainParallelCheckpoint) {
  struct Case {
    std::string set, key;
  };
  const std::vector<Case> cases = {
      {"train.micro_batch=0", "train.micro_batch"},
      {"train.grad_accum=0", "train.grad_accum"},
      {"train.lr_max=0", "train.lr_max"},
      {"train.lr_min=1", "train.lr_min"},
      {"train.lr_min=-1e-5", "train.lr_min"},
      {"train.beta1=1", "train.beta1"},
      {"train.beta2=-0.1", "train.beta2"},
      {"train.adam_eps=0", "train.adam_eps"},
      {"train.weight_decay=-1", "train.weight_decay"},
      {"train.steps=-1", "train.steps"},
      {"train.tokens=-5", "train.tokens"},
      {"train.warmup=-2", "train.warmup"},
      {"train.log_every=0", "train.log_every"},
      {"train.eval_every=-1", "train.eval_every"},
      {"train.eval_batches=0", "train.eval_batches"},
      {"train.threads=-1", "train.threads"},
      {"train.straggler_share=-0.1", "train.straggler_share"},
      {"train.z_loss=-1e-4", "train.z_loss"},
      {"train.z_loss=1e-4", ""},
      {"train.trace_steps=[[3, 2]]", "train.trace_steps: window 1 [3, 2] must have 1 <= from <= to"},
      {"train.trace_steps=[[2, 4], [4, 5]]", "train.trace_steps: window 2 [4, 5] must start after window 1"},
      {"train.trace_steps=[[2, 3], [5, 5]]", ""},
      {"train.seed=9223372036854775807", ""},  // INT64_MAX is fine
      {"data.prefetch=-1", "data.prefetch"},
      {"data.max_open_shards=-1", "data.max_open_shards"},
      {"data.seed=-2", "data.seed"},
      {"parallel.tp=0", "parallel.tp"},
      {"parallel.pp=0", "parallel.pp"},
      {"parallel.dp=0", "parallel.dp"},
      {"parallel.pp=7", "model.n_layers"},
      {"parallel.tp=3", "model.n_kv_heads"},
      {"parallel.schedule=zb", "parallel.schedule"},
      {"checkpoint.keep=0", "checkpoint.keep"},
      {"checkpoint.every=-1", "checkpoint.every"},
  };
  for (const auto& c : cases) {
    if (c.key.empty()) {
      EXPECT_NO_THROW(load_run_config("", {c.set})) << c.set;
      continue;
    }
    const std::string m = load_error("", {c.set});
    EXPECT_CONTAINS(m, c.key) << " for " << c.set;
  }
  // Messages name the keys with values; the file is named too.
  const std::string p = write("tp.toml", "[model]\nn_kv_heads = 4\nn_heads = 4\n[parallel]\ntp = 3\n");
  const std::string m = load_error(p);
  EXPECT_CONTAINS(m, p);
  EXPECT_CONTAINS(m, "parallel.tp (3) must divide model.n_kv_heads (4)");
  // tp divides the widths and the vocabulary too.
  EXPECT_CONTAINS(load_error("", {"parallel.tp=2", "model.d_a=65"}), "model.d_a");
  EXPECT_CONTAINS(load_error("", {"parallel.tp=2", "model.d_b=257"}), "model.d_b");
  EXPECT_CONTAINS(load_error("", {"parallel.tp=2", "model.vocab_size=513"}), "model.vocab_size");
  EXPECT_NO_THROW(load_run_config("", {"parallel.tp=2", "parallel.pp=6", "parallel.dp=3"}));
  // validate_run_config on a hand-built config names its source.
  RunConfig rc;
  rc.source = "hand.toml";
  rc.train.seed = uint64_t(1) << 63;
  const std::string m2 = error_of([&] { validate_run_config(rc); });
  EXPECT_CONTAINS(m2, "hand.toml");
  EXPECT_CONTAINS(m2, "train.seed");
  // data.documents (docs/model.md §2 "Documents"): every backend computes it.
  EXPECT_TRUE(load_run_config("", {"data.documents=true"}).data.documents);
  EXPECT_FALSE(load_run_config("", {}).data.documents);
  const auto names = backend_names();
  if (std::find(names.begin(), names.end(), "cuda") != names.end()) {
    EXPECT_TRUE(load_run_config("", {"train.backend=cuda", "data.documents=true"}).data.documents);
  }
}

// The CUDA backend's options (kernels/backend_options.h) are enums: read by
// their names, a name they do not have refused naming the key and every
// value; the heads a block checked against the model's KV groups.
TEST_F(RunConfigTest, BackendOptionValuesAreChecked) {
  const RunConfig rc = load_run_config(
      "", {"train.cuda_attention=fa2", "train.cuda_attention_bwd=v2", "train.cuda_gemm=auto",
           "train.cuda_attention_tile=128x64", "train.cuda_attention_bwd_tile=64x128", "train.cuda_graphs=layers"});
  const BackendOptions& o = rc.train.backend_options;
  EXPECT_EQ(o.attention, AttentionFwd::Fa2);
  EXPECT_EQ(o.attention_bwd, AttentionBwd::V2);
  EXPECT_EQ(o.gemm, GemmMode::Auto);
  EXPECT_EQ(o.attention_tile, AttentionTile::T128x64);
  EXPECT_EQ(o.attention_bwd_tile, AttentionTile::T64x128);
  EXPECT_EQ(o.attention_heads_per_block, HeadsPerBlock::One);
  EXPECT_EQ(o.cuda_graphs, CudaGraphs::Layers);
  EXPECT_EQ(backend_option_fields(o).at("attention_tile"), "128x64");
  EXPECT_CONTAINS(
      load_error("", {"train.cuda_attention_tile=96x64"}),
      "train.cuda_attention_tile: must be \"64x64\", \"64x128\", \"128x64\" or \"128x128\" (got \"96x64\")");
  EXPECT_CONTAINS(load_error("", {"train.cuda_gemm=fastest"}),
                  "train.cuda_gemm: must be \"cublas\", \"cublaslt\" or \"auto\" (got \"fastest\")");
  EXPECT_CONTAINS(load_error("", {"train.cuda_attention_heads_per_block=3"}), "train.cuda_attention_heads_per_block");
  EXPECT_CONTAINS(
      load_error("", {"train.cuda_attention_heads_per_block=4", "model.n_heads=16", "model.n_kv_heads=8"}),
      "must be 1 or divide the query heads of a KV group, model.n_heads / model.n_kv_heads = 16 / 8 (got 4)");
}

TEST_F(RunConfigTest, MalformedOverrides) {
  for (const std::string ov : {"train.steps", "steps=3", ".steps=3", "train.=3", "=3"}) {
    const std::string m = load_error("", {ov});
    EXPECT_CONTAINS(m, "<--set>");
    EXPECT_CONTAINS(m, "section.key=value");
  }
}

// A bare --set value goes into the run's config.toml and every checkpoint:
// bytes that are not UTF-8 would make those unreadable (found by fuzzing).
TEST_F(RunConfigTest, OverrideThatIsNotUtf8) {
  const std::string m = load_error("", {"checkpoint.dir=ck\x84pt"});
  EXPECT_CONTAINS(m, "<--set>");
  EXPECT_CONTAINS(m, "checkpoint.dir is not valid UTF-8 (byte 3)");
}

TEST_F(RunConfigTest, MissingFile) {
  const std::string p = (dir_ / "nope.toml").string();
  const std::string m = load_error(p);
  EXPECT_CONTAINS(m, "cannot read config file '" + p + "'");
  EXPECT_CONTAINS(load_error(dir_.string()), "cannot read config file");
}

TEST_F(RunConfigTest, SyntaxErrorHasLineAndColumn) {
  const std::string p = write("bad.toml", "[train]\nsteps = 5\nlr_max = = 3\n");
  const std::string m = load_error(p);
  EXPECT_CONTAINS(m, p + ":3:");
  EXPECT_CONTAINS(m, "syntax error");
  // Duplicate keys are TOML errors too.
  EXPECT_CONTAINS(load_error(write("dup.toml", "[train]\nsteps = 1\nsteps = 2\n")), ":3:");
}

void expect_same(const RunConfig& a, const RunConfig& b) {
  EXPECT_EQ(a.preset, b.preset);
  const ModelConfig &m = a.model, &n = b.model;
  EXPECT_EQ(m.name, n.name);
  EXPECT_EQ(m.d, n.d);
  EXPECT_EQ(m.L, n.L);
  EXPECT_EQ(m.H, n.H);
  EXPECT_EQ(m.Hkv, n.Hkv);
  EXPECT_EQ(m.dA, n.dA);
  EXPECT_EQ(m.dB, n.dB);
  EXPECT_EQ(m.V, n.V);
  EXPECT_EQ(m.T, n.T);
  EXPECT_EQ(m.theta0, n.theta0);
  EXPECT_EQ(m.k_s, n.k_s);
  EXPECT_EQ(m.a_s, n.a_s);
  EXPECT_EQ(m.f_s, n.f_s);
  EXPECT_EQ(m.tau, n.tau);
  EXPECT_EQ(m.atm, n.atm);
  EXPECT_EQ(m.Lambda, n.Lambda);
  EXPECT_EQ(m.eps, n.eps);
  EXPECT_EQ(m.init_std, n.init_std);
  EXPECT_EQ(m.phi_init, n.phi_init);
  const TrainSection &t = a.train, &u = b.train;
  EXPECT_EQ(t.micro_batch, u.micro_batch);
  EXPECT_EQ(t.grad_accum, u.grad_accum);
  EXPECT_EQ(t.steps, u.steps);
  EXPECT_EQ(t.tokens, u.tokens);
  EXPECT_EQ(t.lr_max, u.lr_max);  // exact, not approximately
  EXPECT_EQ(t.lr_min, u.lr_min);
  EXPECT_EQ(t.warmup, u.warmup);
  EXPECT_EQ(t.beta1, u.beta1);
  EXPECT_EQ(t.beta2, u.beta2);
  EXPECT_EQ(t.adam_eps, u.adam_eps);
  EXPECT_EQ(t.weight_decay, u.weight_decay);
  EXPECT_EQ(t.clip, u.clip);
  EXPECT_EQ(t.nonfinite_fatal, u.nonfinite_fatal);
  EXPECT_EQ(t.seed, u.seed);
  EXPECT_EQ(t.recompute, u.recompute);
  EXPECT_EQ(t.threads, u.threads);
  EXPECT_EQ(t.log_every, u.log_every);
  EXPECT_EQ(t.eval_every, u.eval_every);
  EXPECT_EQ(t.eval_batches, u.eval_batches);
  EXPECT_EQ(t.run_dir, u.run_dir);
  EXPECT_EQ(t.max_steps, u.max_steps);
  EXPECT_EQ(t.tensorboard, u.tensorboard);
  EXPECT_EQ(t.straggler_share, u.straggler_share);
  EXPECT_EQ(a.data.path, b.data.path);
  EXPECT_EQ(a.data.shuffle, b.data.shuffle);
  EXPECT_EQ(a.data.seed, b.data.seed);
  EXPECT_EQ(a.data.prefetch, b.data.prefetch);
  EXPECT_EQ(a.data.max_open_shards, b.data.max_open_shards);
  EXPECT_EQ(a.parallel.tp, b.parallel.tp);
  EXPECT_EQ(a.parallel.pp, b.parallel.pp);
  EXPECT_EQ(a.parallel.dp, b.parallel.dp);
  EXPECT_EQ(a.parallel.zero, b.parallel.zero);
  EXPECT_EQ(a.parallel.schedule, b.parallel.schedule);
  EXPECT_EQ(a.data.blend, b.data.blend);
  EXPECT_EQ(a.checkpoint.dir, b.checkpoint.dir);
  EXPECT_EQ(a.checkpoint.every, b.checkpoint.every);
  EXPECT_EQ(a.checkpoint.resume, b.checkpoint.resume);
  EXPECT_EQ(a.checkpoint.keep, b.checkpoint.keep);
}

TEST_F(RunConfigTest, TomlRoundTripIsExact) {
  const std::string p = write("a.toml", R"(
[model]
preset = "wiola-tiny"
d = 96
n_heads = 6
n_kv_heads = 3
d_a = 48
d_b = 384
vocab_size = 513
srpe_theta = 12345.678901234567
srpe_radial_amp = 0.30000000000000004
srpe_radial_freq = 1e-300
atm = false
atm_tau = 0.9199999999999999
rms_eps = 1e-5
ctx_gate_init = -3.25
[train]
micro_batch = 3
grad_accum = 5
steps = 1234
tokens = 9876543210
lr_max = 0.00030000000000000003
lr_min = 1.5e-7
warmup = 0
adam_eps = 1e-12
clip = -1
nonfinite_fatal = true
seed = 9223372036854775807
recompute = true
threads = 7
log_every = 10
eval_every = 25
eval_batches = 3
eval_tasks = ["tasks/hellaswag.jsonl", "q\"uote.jsonl"]
eval_tasks_every = 7
run_dir = "runs/q\"uote\\back\tslash ünï 日本"
max_steps = 17
tensorboard = true
straggler_share = 0.35000000000000003
[data]
path = "C:\\data\\manifest.json"
shuffle = false
seed = 42
prefetch = 0
max_open_shards = 3
[parallel]
tp = 3
pp = 2
dp = 4
zero = false
schedule = "gpipe"
[checkpoint]
dir = "ckpt\nnewline"
every = 100
resume = false
keep = 5
)");
  const RunConfig a = load_run_config(p, {});
  const std::string text = run_config_to_toml(a);
  const RunConfig b = load_run_config(write("b.toml", text), {});
  expect_same(a, b);
  EXPECT_EQ(run_config_to_toml(b), text);
  EXPECT_EQ(b.train.eval_tasks, (std::vector<std::string>{"tasks/hellaswag.jsonl", "q\"uote.jsonl"}));
  EXPECT_EQ(b.train.eval_tasks_every, 7);
  EXPECT_NE(text.find("preset = \"wiola-tiny\""), std::string::npos) << text;

  // Custom model (no preset) and defaults round-trip too; no preset key.
  const RunConfig c = load_run_config("", {});
  const std::string ctext = run_config_to_toml(c);
  EXPECT_EQ(ctext.find("preset"), std::string::npos) << ctext;
  const RunConfig d = load_run_config(write("c.toml", ctext), {});
  expect_same(c, d);
  // Every key of every section is written.
  for (const char* k :
       {"[model]", "[train]", "[data]", "[parallel]", "[checkpoint]", "d =", "srpe_spiral_divisor =", "lookback =",
        "init_std =", "max_steps =", "nonfinite_fatal =", "prefetch =", "schedule =", "keep ="})
    EXPECT_NE(ctext.find(k), std::string::npos) << k;
}

// data.blend: inline tables or [[data.blend]] sections, --set, the canonical
// form, and every way it can be wrong.
TEST_F(RunConfigTest, DataBlend) {
  const RunConfig a = load_run_config(write("a.toml", R"(
[data]
blend = [{ path = "runs/web", weight = 0.7 }, { path = "runs/b\"ooks", weight = 3 }]
)"),
                                      {});
  ASSERT_EQ(a.data.blend.size(), 2u);
  EXPECT_EQ(a.data.blend[0], (BlendSource{"runs/web", 0.7}));
  EXPECT_EQ(a.data.blend[1], (BlendSource{"runs/b\"ooks", 3.0}));
  EXPECT_EQ(a.data_sources(), a.data.blend);
  const RunConfig sections = load_run_config(write("s.toml", R"(
[[data.blend]]
path = "runs/web"
weight = 0.7

[[data.blend]]
weight = 3
path = "runs/b\"ooks"
)"),
                                             {});
  EXPECT_EQ(sections.data.blend, a.data.blend);
  // The canonical form reads back exactly; without a blend it is empty and
  // data_sources() is data.path with weight 1.
  const std::string text = run_config_to_toml(a);
  EXPECT_CONTAINS(text, R"(blend = [{ path = "runs/web", weight = 0.7 }, { path = "runs/b\"ooks", weight = 3.0 }])");
  EXPECT_EQ(load_run_config(write("b.toml", text), {}).data.blend, a.data.blend);
  const RunConfig plain = load_run_config("", {"data.path=x/manifest.json"});
  EXPECT_CONTAINS(run_config_to_toml(plain), "blend = []");
  EXPECT_EQ(plain.data_sources(), (std::vector<BlendSource>{{"x/manifest.json", 1.0}}));
  // --set, and clearing the file's data.path for it.
  const std::string with_path = write("p.toml", "[data]\npath = \"runs/one\"\n");
  const RunConfig set =
      load_run_config(with_path, {"data.path=\"\"", R"(data.blend=[{path="a", weight=1}, {path="b", weight=2}])"});
  EXPECT_EQ(set.data.blend, (std::vector<BlendSource>{{"a", 1.0}, {"b", 2.0}}));
  EXPECT_CONTAINS(load_error(with_path, {R"(data.blend=[{path="a", weight=1}])"}),
                  "data.path and data.blend are both set");
  EXPECT_CONTAINS(load_error(with_path, {R"(data.blend=[{path="a", weight=1}])"}), "--set 'data.path=\"\"'");
  // Wrong shapes and values, each naming the source and what is wrong.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"(blend = "runs/web")", "expected an array of {path = \"...\", weight = w} tables, got a string"},
      {R"(blend = ["runs/web"])", "source 1 of 1: expected a table"},
      {R"(blend = [{ path = "a", weight = 1 }, { path = "b" }])", "source 2 of 2: needs both path and weight"},
      {R"(blend = [{ path = "a", weight = 0 }])", "source 1 of 1: weight must be positive and finite (got 0.0)"},
      {R"(blend = [{ path = "a", weight = -2.5 }])", "weight must be positive and finite (got -2.5)"},
      {R"(blend = [{ path = "a", weight = nan }])", "weight must be positive and finite"},
      {R"(blend = [{ path = "a", weight = "1" }])", "weight must be a number, got a string"},
      {R"(blend = [{ path = "", weight = 1 }])", "path must be a non-empty string"},
      {R"(blend = [{ path = 3, weight = 1 }])", "path must be a non-empty string, got an integer (3)"},
      {R"(blend = [{ path = "a", weight = 1, share = 2 }])", "unknown field 'share' (a source has path and weight)"},
  };
  for (const auto& [line, want] : bad) {
    const std::string m = load_error(write("bad.toml", "[data]\n" + line + "\n"));
    EXPECT_CONTAINS(m, "bad.toml:2:");
    EXPECT_CONTAINS(m, "data.blend: ");
    EXPECT_CONTAINS(m, want);
  }
}

// data.stages: [[data.stages]] sections or inline tables, the canonical form,
// and the errors (file:line:column for the shapes, the keys for the checks
// against data.blend).
TEST_F(RunConfigTest, DataStages) {
  const std::string blend = "[data]\nblend = [{ path = \"a\", weight = 1 }, { path = \"b\", weight = 3 }]\n";
  const RunConfig a = load_run_config(write("a.toml", blend + R"(
[[data.stages]]
from = 801
weights = [0, 1]

[[data.stages]]
weights = [1, 1.5]
from = 901
)"),
                                      {});
  EXPECT_EQ(a.data.stages, (std::vector<DataStage>{{801, {0.0, 1.0}}, {901, {1.0, 1.5}}}));
  const std::string text = run_config_to_toml(a);
  EXPECT_CONTAINS(text, "stages = [{ from = 801, weights = [0.0, 1.0] }, { from = 901, weights = [1.0, 1.5] }]");
  EXPECT_EQ(load_run_config(write("b.toml", text), {}).data.stages, a.data.stages);
  EXPECT_EQ(load_run_config(write("c.toml", blend), {"data.stages=[{from=5, weights=[2, 0]}]"}).data.stages,
            (std::vector<DataStage>{{5, {2.0, 0.0}}}));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"stages = 3", "expected an array of {from = step, weights = [...]} tables, got an integer"},
      {"stages = [{ from = 1, weights = [1, 1] }]", "stage 1 of 1: from must be a step >= 2, got an integer (1)"},
      {"stages = [{ from = 5 }]", "stage 1 of 1: needs both from and weights"},
      {"stages = [{ from = 5, weights = [1, -1] }]", "stage 1 of 1: weight 2 must be a finite number >= 0"},
      {"stages = [{ from = 5, weights = 1 }]", "weights must be an array of numbers, got an integer"},
      {"stages = [{ from = 5, weights = [1, 1], shares = 2 }]",
       "unknown field 'shares' (a stage has from and weights)"},
  };
  for (const auto& [line, want] : bad) {
    const std::string m = load_error(write("bad.toml", blend + line + "\n"));
    EXPECT_CONTAINS(m, "bad.toml:3:");
    EXPECT_CONTAINS(m, "data.stages: ");
    EXPECT_CONTAINS(m, want);
  }
  EXPECT_CONTAINS(load_error(write("n.toml", blend + "stages = [{ from = 5, weights = [1, 1, 1] }]\n")),
                  "data.stages: stage 1 (from step 5) has 3 weights, data.blend 2 sources");
  EXPECT_CONTAINS(load_error(write(
                      "o.toml", blend + "stages = [{ from = 5, weights = [1, 1] }, { from = 5, weights = [1, 0] }]\n")),
                  "data.stages: stage 2 (from step 5) must start after stage 1 (from step 5)");
  EXPECT_CONTAINS(load_error(write("z.toml", blend + "stages = [{ from = 5, weights = [0, 0] }]\n")),
                  "has no weight above 0");
  EXPECT_CONTAINS(load_error(write("p.toml", "[data]\npath = \"x\"\nstages = [{ from = 5, weights = [1] }]\n")),
                  "data.stages changes the shares of a blend: set data.blend");
}

// The text a checkpoint manifest records loads like the file it came from,
// and its errors name the given source.
TEST_F(RunConfigTest, FromTomlTextMatchesTheFile) {
  const std::string p = write("t.toml", "[model]\npreset = \"wiola-tiny\"\nd = 32\n[train]\nsteps = 7\n");
  const RunConfig a = load_run_config(p, {"train.seed=9"});
  const RunConfig b = run_config_from_toml_text(run_config_to_toml(a), "ckpt/manifest.json (config)");
  expect_same(a, b);
  EXPECT_EQ(b.source, "ckpt/manifest.json (config)");
  EXPECT_CONTAINS(error_of([] { run_config_from_toml_text("[model]\nd = = 1\n", "mf (config)"); }), "mf (config):2:");
  EXPECT_CONTAINS(error_of([] { run_config_from_toml_text("[model]\nn_heads = 3\n", "mf (config)"); }),
                  "mf (config): ");
}

TEST_F(RunConfigTest, ShippedConfigsLoad) {
  const fs::path configs = fs::path(WIOLA_SOURCE_DIR) / "configs";
  ASSERT_TRUE(fs::is_directory(configs)) << configs;
  int n = 0;
  for (const auto& e : fs::directory_iterator(configs)) {
    if (e.path().extension() != ".toml") continue;
    ++n;
    SCOPED_TRACE(e.path().string());
    RunConfig rc;
    ASSERT_NO_THROW(rc = load_run_config(e.path().string(), {}));
    EXPECT_FALSE(rc.preset.empty());
    EXPECT_EQ(rc.preset, e.path().stem().string() == "brown-small" ? "wiola-small" : e.path().stem().string());
    expect_same(rc, load_run_config(write("rt.toml", run_config_to_toml(rc)), {}));
  }
  EXPECT_GE(n, 6);
}

TEST_F(RunConfigTest, BrownSmallIsTheCpuDemo) {
  const RunConfig rc = load_run_config((fs::path(WIOLA_SOURCE_DIR) / "configs" / "brown-small.toml").string(), {});
  EXPECT_EQ(rc.model.d, 128);
  EXPECT_EQ(rc.model.L, 6);
  EXPECT_EQ(rc.model.H, 4);
  EXPECT_EQ(rc.model.Hkv, 2);
  EXPECT_EQ(rc.model.V, 32000);
  EXPECT_EQ(rc.model.T, 128);
  EXPECT_EQ(rc.train.micro_batch, 8);
  EXPECT_EQ(rc.train.grad_accum, 1);
  EXPECT_EQ(rc.train.steps, 300);
  EXPECT_DOUBLE_EQ(rc.train.lr_max, 1e-3);
  EXPECT_EQ(rc.train.warmup, -1);
  EXPECT_EQ(rc.train.run_dir, "runs/brown-small");
  EXPECT_EQ(rc.train.eval_every, 50);
  EXPECT_EQ(rc.train.eval_batches, 2);
  EXPECT_EQ(rc.train.threads, 0);
  EXPECT_EQ(rc.data.path, "runs/brown-shards/manifest.json");
  EXPECT_EQ(rc.checkpoint.dir, "runs/brown-small/ck");  // generate and export read it
  EXPECT_EQ(rc.checkpoint.every, 100);
}

// The schema docs/config.md's tables are generated from (scripts/config_docs.py):
// every key once, with a doc line a table cell can hold, and its default the
// value the effective config of a config without keys writes for it, which
// reads back as that value.
TEST_F(RunConfigTest, SchemaDocumentsEveryKeyWithItsEffectiveDefault) {
  const std::vector<ConfigKeyDoc> schema = run_config_schema();
  const RunConfig defaults = load_run_config("", {});
  const std::string effective = run_config_to_toml(defaults);
  // "section.key" -> value, from the effective config's lines.
  std::map<std::string, std::string> written;
  std::string section;
  std::istringstream lines(effective);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t eq = line.find(" = ");
    ASSERT_NE(eq, std::string::npos) << line;
    written[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  std::set<std::string> seen;
  for (const ConfigKeyDoc& k : schema) {
    const std::string name = k.section + "." + k.key;
    SCOPED_TRACE(name);
    EXPECT_TRUE(seen.insert(name).second) << "twice in the schema";
    EXPECT_FALSE(k.doc.empty());
    EXPECT_EQ(k.doc.find_first_of("|\n"), std::string::npos) << "a table cell cannot hold it: " << k.doc;
    EXPECT_FALSE(k.type.empty());
    if (name == "model.preset") {
      EXPECT_EQ(k.default_value, "\"\"");  // the effective config leaves an empty preset out
      EXPECT_EQ(written.count(name), 0u);
    } else {
      ASSERT_EQ(written.count(name), 1u) << "not in the effective config";
      EXPECT_EQ(k.default_value, written[name]);
    }
    // The default, set explicitly, is the default.
    EXPECT_EQ(run_config_to_toml(load_run_config("", {name + "=" + k.default_value})), effective);
  }
  EXPECT_EQ(seen.size(), written.size() + 1);  // every key of the effective config, and model.preset
}

}  // namespace
}  // namespace wiola
