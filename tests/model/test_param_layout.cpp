// The flat parameter layout's alignment (model/params.h, issue 32): every
// tensor starts on a multiple of kParamAlign elements (256 bytes of the bf16
// weight copy) except the members of the one-GEMM runs wq|wk|wv|wgate and
// wkc|wvc after the first, in every preset under TP and pipeline shards; the padding is
// zero in parameters, gradients, moments and the weight copy and stays zero
// through training; and the layout changes no result: training with the
// packed layout (alignment 1, the layout before issue 32) and the aligned one
// is bit for bit the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dist/grid.h"
#include "dist/optimizer.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/params.h"
#include "tests/model/backend_under_test.h"
#include "train/trainer.h"
#include "util/error.h"

namespace wiola {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// k, v and gate are bound with q as one GEMM operand, and the context v
// projection with the context k projection (ModelParams::bind).
bool in_run_after_first(const std::string& name) {
  return ends_with(name, ".self_attn.k_proj.weight") || ends_with(name, ".self_attn.v_proj.weight") ||
         ends_with(name, ".self_attn.gate_proj.weight") || ends_with(name, ".self_attn.ctx_v_proj.weight");
}

// Every rule of an aligned layout; returns how many entries follow their
// predecessor at an offset that is not a multiple of the alignment.
size_t check_layout(const ParamLayout& lay, const std::string& what) {
  const size_t A = lay.alignment();
  const auto& es = lay.entries();
  size_t unaligned = 0, elements = 0;
  for (size_t i = 0; i < es.size(); ++i) {
    const ParamEntry& e = es[i];
    SCOPED_TRACE(what + ": " + e.name);
    EXPECT_EQ(e.follows, in_run_after_first(e.name));
    if (e.follows) {
      EXPECT_EQ(e.offset, es[i - 1].offset + es[i - 1].size()) << "the run must stay adjacent";
      unaligned += e.offset % A != 0;
    } else {
      EXPECT_EQ(e.offset % A, 0u) << "offset " << e.offset;
    }
    // Spans tile the buffer; padding only up to the next boundary.
    const size_t next = i + 1 < es.size() ? es[i + 1].offset : lay.total();
    EXPECT_EQ(e.offset + e.span, next);
    EXPECT_GE(e.span, e.size());
    EXPECT_LT(e.span - e.size(), A);
    elements += e.size();
  }
  EXPECT_EQ(lay.n_elements(), elements);
  size_t padding = 0;
  for (const ParamLayout::Range& r : lay.padding()) padding += r.size;
  EXPECT_EQ(elements + padding, lay.total());
  return unaligned;
}

// Every preset, single process, TP 2 and 4 (where the preset's KV groups
// split), pipeline stages of 2 and 4: only followers of q and of the context
// k projection may be unaligned,
// and in the presets none is (their sizes are multiples of 128).
TEST(ParamLayout, EveryTensorStartsOnTheAlignmentInEveryPresetAndShard) {
  for (const std::string& name : model_preset_names()) {
    const ModelConfig c = model_preset(name);
    size_t layouts = 0, matrices = 0;
    for (int tp : {1, 2, 4}) {
      if (c.Hkv % tp != 0) continue;
      for (int pp : {1, 2, 4})
        for (int stage = 0; stage < pp; ++stage)
          for (int rank = 0; rank < tp; ++rank) {
            const auto [l0, l1] = dist::stage_layers(c.L, pp, stage);
            const ParamLayout lay(c, ModelShard{rank, tp, l0, l1});
            const std::string what = name + " tp " + std::to_string(rank) + "/" + std::to_string(tp) +
                                     " layers [" + std::to_string(l0) + ", " + std::to_string(l1) + ")";
            EXPECT_EQ(check_layout(lay, what), 0u) << what;
            for (const ParamEntry& e : lay.entries()) {
              matrices += e.is_matrix();
              // The bf16 weight copy (2 bytes) and fp32 buffers (4 bytes).
              EXPECT_EQ(e.offset * 2 % 256, 0u) << what << ": " << e.name;
              EXPECT_EQ(e.offset * 4 % 512, 0u) << what << ": " << e.name;
            }
            ++layouts;
          }
    }
    std::printf("  %s: %zu layouts, %zu matrices, all 256-byte aligned in bf16\n", name.c_str(), layouts, matrices);
  }
}

// A model whose sizes are not multiples of 128: k, v and gate follow q
// (400 elements) unaligned as one GEMM operand, and the context v projection
// the context k projection (200 elements), everything else is aligned,
// and padding follows most tensors, the last of a layer (W_f, 800) and the
// embedding (800) included.
ModelConfig odd_config() {
  ModelConfig c;
  c.name = "odd";
  c.d = 20; c.L = 3; c.H = 2; c.Hkv = 1; c.dA = 20; c.dB = 40; c.V = 40; c.T = 8;
  return c;
}

TEST(ParamLayout, TheQkvgRunStaysAdjacentWhenItsSizesAreOdd) {
  const ModelConfig c = odd_config();
  const ParamLayout lay(c, ModelShard{});
  // k at q + 400, v at q + 600, gate at q + 800, ctx_v at ctx_k + 200, in
  // every layer.
  EXPECT_EQ(check_layout(lay, "odd"), size_t(4 * c.L));
  const ParamEntry& q = lay.find("model.layers.1.self_attn.q_proj.weight");
  const ParamEntry& gate = lay.find("model.layers.1.self_attn.gate_proj.weight");
  EXPECT_EQ(q.offset % kParamAlign, 0u);
  EXPECT_NE(lay.find("model.layers.1.self_attn.k_proj.weight").offset % kParamAlign, 0u);
  EXPECT_EQ(lay.find("model.layers.1.self_attn.ctx_k_proj.weight").offset % kParamAlign, 0u);
  EXPECT_EQ(gate.offset + gate.span, lay.find("model.layers.1.self_attn.ctx_k_proj.weight").offset);
  const ParamEntry& kc = lay.find("model.layers.1.self_attn.ctx_k_proj.weight");
  EXPECT_EQ(lay.find("model.layers.1.self_attn.ctx_v_proj.weight").offset, kc.offset + 200);
  // bind checks the runs' adjacency (throws otherwise).
  std::vector<float> buf(lay.total());
  EXPECT_NO_THROW(ModelParams::bind(lay, Ptr(buf.data()), c, ModelShard{}));
}

// Alignment 1 is the packed layout written before issue 32: tensors back to
// back in table order, no padding, the buffer exactly the parameter count.
TEST(ParamLayout, AlignmentOneIsThePackedLayout) {
  for (const ModelConfig& c : {odd_config(), model_preset("wiola-tiny"), model_preset("wiola-360m")}) {
    const ParamLayout packed(c, ModelShard{}, 1), aligned(c, ModelShard{});
    size_t at = 0;
    for (const ParamEntry& e : packed.entries()) {
      EXPECT_EQ(e.offset, at) << c.name << ": " << e.name;
      EXPECT_EQ(e.span, e.size()) << c.name << ": " << e.name;
      at += e.size();
    }
    EXPECT_EQ(int64_t(packed.total()), c.param_count()) << c.name;
    EXPECT_TRUE(packed.padding().empty()) << c.name;
    EXPECT_EQ(aligned.n_elements(), packed.n_elements()) << c.name;
    EXPECT_GT(aligned.total(), packed.total()) << c.name << ": φ alone needs padding";
    ASSERT_EQ(aligned.entries().size(), packed.entries().size());
    for (size_t i = 0; i < packed.entries().size(); ++i)
      EXPECT_EQ(aligned.entries()[i].name, packed.entries()[i].name);
  }
}

// A rank holding several chunks (interleaved, ZB-V; model/model.h
// ParamStore): the layer-range layout has exactly the tensors of the
// chunks' own layouts, in layer order whatever the ranges' order, the tied
// embedding once where the ranges hold both its ends, each tensor with the
// same shape and global maps as in its chunk's layout; one range is the
// contiguous layout. Overlapping or empty ranges are refused.
TEST(ParamLayout, LayerRangesHoldTheirChunksTensorsWithTheEmbeddingOnce) {
  ModelConfig c = model_preset("wiola-tiny");
  c.L = 8;
  for (int tp : {1, 2}) {
    const LayerRanges v_rank0 = {{0, 2}, {6, 8}};  // ZB-V's rank 0: both ends of the embedding
    const ParamLayout both(c, 0, tp, {{6, 8}, {0, 2}});
    const ParamLayout first(c, ModelShard{0, tp, 0, 2}), last(c, ModelShard{0, tp, 6, 8});
    std::vector<std::string> want;
    for (const ParamLayout* l : {&first, &last})
      for (const ParamEntry& e : l->entries())
        if (std::find(want.begin(), want.end(), e.name) == want.end()) want.push_back(e.name);
    std::vector<std::string> got;
    for (const ParamEntry& e : both.entries()) {
      got.push_back(e.name);
      const ParamEntry& own = first.try_find(e.name) ? first.find(e.name) : last.find(e.name);
      EXPECT_EQ(e.rows, own.rows) << e.name;
      EXPECT_EQ(e.cols, own.cols) << e.name;
      EXPECT_EQ(e.row_map, own.row_map) << e.name;
      EXPECT_TRUE(e.offset % kParamAlign == 0 || e.follows) << e.name;
    }
    EXPECT_EQ(got, want) << "tp " << tp;
    EXPECT_EQ(std::count(got.begin(), got.end(), "model.embed_tokens.weight"), 1);
    EXPECT_EQ(both.total(), ParamLayout(c, 0, tp, v_rank0).total());
    // A middle rank: no embedding, no final norm.
    const ParamLayout middle(c, 0, tp, {{2, 3}, {5, 6}});
    EXPECT_FALSE(middle.try_find("model.embed_tokens.weight"));
    EXPECT_FALSE(middle.try_find("model.norm.weight"));
    EXPECT_TRUE(middle.try_find(layer_param_name(5, "mlp.fusion.weight")));
    EXPECT_FALSE(middle.try_find(layer_param_name(4, "mlp.fusion.weight")));
    // One range: the contiguous layout, entry for entry.
    const ParamLayout one(c, 0, tp, {{2, 5}}), contiguous(c, ModelShard{0, tp, 2, 5});
    ASSERT_EQ(one.entries().size(), contiguous.entries().size());
    for (size_t i = 0; i < one.entries().size(); ++i) {
      EXPECT_EQ(one.entries()[i].name, contiguous.entries()[i].name);
      EXPECT_EQ(one.entries()[i].offset, contiguous.entries()[i].offset);
    }
  }
  EXPECT_THROW(ParamLayout(c, 0, 1, {{0, 3}, {2, 4}}), Error);
  EXPECT_THROW(ParamLayout(c, 0, 1, {{3, 3}}), Error);
  EXPECT_THROW(ParamLayout(c, 0, 1, {{6, 9}}), Error);
}

// init_params_host zeroes the padding whatever the buffer held, and every
// tensor holds the packed layout's values (init depends on names only).
TEST(ParamLayout, InitZeroesThePaddingAndGivesThePackedValues) {
  const ModelConfig c = odd_config();
  const ParamLayout packed(c, ModelShard{}, 1), aligned(c, ModelShard{});
  std::vector<float> a(aligned.total(), std::nanf("")), p(packed.total());
  init_params_host(aligned, 5, a.data());
  init_params_host(packed, 5, p.data());
  ASSERT_FALSE(aligned.padding().empty());
  for (const ParamLayout::Range& r : aligned.padding())
    for (size_t i = r.offset; i < r.offset + r.size; ++i) ASSERT_EQ(a[i], 0.0f) << "padding element " << i;
  for (const ParamEntry& e : aligned.entries()) {
    const ParamEntry& pe = packed.find(e.name);
    EXPECT_EQ(std::memcmp(a.data() + e.offset, p.data() + pe.offset, e.size() * sizeof(float)), 0) << e.name;
  }
}

// What a few training steps leave behind, by tensor name, and the padding's
// values in every flat buffer.
struct Trained {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> params, m, v;
  std::vector<float> pad_params, pad_grads, pad_m, pad_v;
  std::vector<uint8_t> pad_weight_bytes;  // the weight copy's padding, raw
};

std::vector<int32_t> step_tokens(const ModelConfig& c, int B, int steps) {
  std::mt19937_64 g(12);
  std::vector<int32_t> t(size_t(steps) * B * (c.T + 1));
  for (auto& x : t) x = int32_t(g() % uint64_t(c.V));
  return t;
}

// `steps` AdamW steps (weight decay on; clip 0.05, so the norm scales every
// step's update) from init seed 3 on `ops`, with the model laid out at
// `align`; the optimizer segments are the trainer's.
Trained train_steps(Ops<float>& ops, const ModelConfig& c, size_t align, int steps) {
  const int B = 2;
  ModelOptions mo;
  mo.micro_batch = B;
  mo.param_align = align;
  Model<float> model(ops, c, ModelShard{}, nullptr, mo);
  model.init(3);
  dist::AdamWConfig ac;
  ac.weight_decay = 0.1;
  ac.clip = 0.05;
  dist::DistAdamW adam(ops, model.params(), model.grads(), model.n_params(),
                       dist::optimizer_segments(model.layout().entries()), ac, nullptr, nullptr);
  const auto tok = step_tokens(c, B, steps);
  Trained out;
  for (int s = 0; s < steps; ++s) {
    model.zero_grads();
    out.losses.push_back(model.train_micro_step(tok.data() + size_t(s) * B * (c.T + 1), 1.0 / (B * c.T)));
    const dist::StepResult r = adam.step(1e-2, adam.applied_steps() + 1);
    EXPECT_FALSE(r.skipped);
    out.norms.push_back(r.grad_norm);
    model.refresh_weights();
  }
  const ParamLayout& lay = model.layout();
  const auto params = download_vec(ops, model.params(), model.n_params());
  const auto grads = download_vec(ops, model.grads(), model.n_params());
  std::vector<float> m, v;
  adam.gather_moments(m, v);
  for (const ParamEntry& e : lay.entries()) {
    auto slice = [&](const std::vector<float>& x) {
      return std::vector<float>(x.begin() + long(e.offset), x.begin() + long(e.offset + e.size()));
    };
    out.params[e.name] = slice(params);
    out.m[e.name] = slice(m);
    out.v[e.name] = slice(v);
  }
  std::vector<uint8_t> weights;
  if (model.weight_copy()) {
    weights.resize(model.n_params() * dtype_bytes(model.weight_copy().dtype()));
    ops.download(weights.data(), model.weight_copy().raw(), weights.size());
  }
  const size_t wb = model.weight_copy() ? dtype_bytes(model.weight_copy().dtype()) : 0;
  for (const ParamLayout::Range& r : lay.padding())
    for (size_t i = r.offset; i < r.offset + r.size; ++i) {
      out.pad_params.push_back(params[i]);
      out.pad_grads.push_back(grads[i]);
      out.pad_m.push_back(m[i]);
      out.pad_v.push_back(v[i]);
      for (size_t b = 0; b < wb; ++b) out.pad_weight_bytes.push_back(weights[i * wb + b]);
    }
  return out;
}

bool all_zero(const std::vector<float>& x) {
  for (float f : x)
    if (f != 0.0f || std::signbit(f)) return false;
  return true;
}

// Packed (alignment 1) and aligned layouts train bit for bit alike: every
// loss, gradient norm, parameter, m and v. On the CPU backends every kernel
// sees the same values in the same order (GEMMs per tensor, elementwise ops,
// and the gradient norm as one sum_squares per tensor in table order: with
// one bucket and no DP the optimizer's pieces are the tensors in both
// layouts), so the addresses are all that differ. And the aligned run's
// padding is zero in parameters, gradients, moments and the weight copy
// after several steps.
void expect_layouts_train_alike(Ops<float>& ops, const ModelConfig& c) {
  const int steps = 4;
  const Trained packed = train_steps(ops, c, 1, steps);
  const Trained aligned = train_steps(ops, c, kParamAlign, steps);
  EXPECT_EQ(aligned.losses, packed.losses);
  EXPECT_EQ(aligned.norms, packed.norms);
  for (const auto& [name, p] : packed.params) {
    EXPECT_EQ(aligned.params.at(name), p) << name;
    EXPECT_EQ(aligned.m.at(name), packed.m.at(name)) << name;
    EXPECT_EQ(aligned.v.at(name), packed.v.at(name)) << name;
  }
  ASSERT_FALSE(aligned.pad_params.empty());
  EXPECT_TRUE(all_zero(aligned.pad_params)) << "padding of the parameters";
  EXPECT_TRUE(all_zero(aligned.pad_grads)) << "padding of the gradients";
  EXPECT_TRUE(all_zero(aligned.pad_m)) << "padding of m";
  EXPECT_TRUE(all_zero(aligned.pad_v)) << "padding of v";
  for (uint8_t b : aligned.pad_weight_bytes) ASSERT_EQ(b, 0) << "padding of the weight copy";
  std::printf("  %s on %s: %zu padding elements zero after %d steps; losses, norms and every tensor bit for bit\n",
              c.name.c_str(), ops.name(), aligned.pad_params.size(), steps);
}

TEST(ParamAlignment, TrainingIsBitIdenticalToThePackedLayout) {
  auto ops = test_backend<float>();
  for (const ModelConfig& c : {odd_config(), model_preset("wiola-tiny")}) expect_layouts_train_alike(*ops, c);
}

// The same in the GPU's bf16 mode (cpu-bf16: bf16 weight copy, activations).
TEST(ParamAlignment, Bf16WeightCopyTrainsAlikeAndKeepsItsPaddingZero) {
  const char* b = std::getenv("WIOLA_TEST_BACKEND");
  if (b && *b && std::string(b) != "cpu") GTEST_SKIP() << "runs on the cpu pass only";
  auto ops = make_backend<float>("cpu-bf16");
  expect_layouts_train_alike(*ops, odd_config());
}

// Overlap: the backward's grad-ready reports plus the embedding's span cover
// the buffer exactly once, padding included, so every bucket completes.
TEST(ParamAlignment, GradReadyReportsTileTheBufferWithItsPadding) {
  auto ops = test_backend<float>();
  const ModelConfig c = odd_config();
  ModelOptions mo;
  mo.micro_batch = 1;
  Model<float> model(*ops, c, ModelShard{}, nullptr, mo);
  model.init(1);
  std::vector<int> seen(model.n_params(), 0);
  model.set_grad_ready([&](size_t off, size_t n) {
    for (size_t i = off; i < off + n; ++i) ++seen[i];
  });
  model.arm_grad_ready(true);
  const auto tok = step_tokens(c, 1, 1);
  model.zero_grads();
  model.train_micro_step(tok.data(), 1.0);
  const ParamEntry& embed = model.layout().find("model.embed_tokens.weight");
  for (size_t i = embed.offset; i < embed.offset + embed.span; ++i) ++seen[i];  // the trainer's report
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "element " << i;
}

}  // namespace
}  // namespace wiola
