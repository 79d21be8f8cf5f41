// The cost model and the planner (perf/): memory sizes equal what a built
// model allocates, the pipeline simulation with per-stage costs and link
// delays, the GPT workload's FLOPs against Megatron-LM's closed form, the
// hardware table, and the layout search's rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <tuple>
#include <vector>

#include "dist/grid.h"
#include "dist/optimizer.h"
#include "dist/schedule.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "model/flops.h"
#include "model/model.h"
#include "perf/cost_model.h"
#include "perf/device_profile.h"
#include "perf/hardware.h"
#include "perf/planner.h"
#include "util/error.h"

namespace wiola::perf {
namespace {

ModelConfig tiny() {
  ModelConfig c = model_preset("wiola-tiny");
  c.L = 6;
  c.Lambda = 3;
  c.validate();
  return c;
}

// Model::plan_memory sizes every buffer the constructor allocates (cpu-bf16:
// the GPU's bf16 storage types, with the summaries' bf16 operand copies).
TEST(CostModel, PlanMemoryEqualsTheBuiltModel) {
  for (const char* backend : {"cpu", "cpu-bf16"}) {
    SCOPED_TRACE(backend);
    auto ops = make_backend<float>(backend);
    const ModelConfig c = tiny();
    for (int tp : {1, 2})
      for (auto range : {std::pair{0, 6}, std::pair{0, 2}, std::pair{2, 5}, std::pair{4, 6}})
        for (bool rc : {false, true})
          for (int slots : {1, 3}) {
            ModelShard sh{0, tp, range.first, range.second};
            ModelOptions mo;
            mo.micro_batch = 2;
            mo.recompute = rc;
            mo.slots = slots;
            Model<float> m(*ops, c, sh, nullptr, mo);
            const auto got = m.memory();
            const auto want = Model<float>::plan_memory(*ops, c, sh, mo, ops->precision());
            SCOPED_TRACE(testing::Message() << "tp " << tp << " layers [" << range.first << "," << range.second
                                            << ") recompute " << rc << " slots " << slots);
            EXPECT_EQ(got.master, want.master);
            EXPECT_EQ(got.grads, want.grads);
            EXPECT_EQ(got.weights, want.weights);
            EXPECT_EQ(got.activations, want.activations);
            EXPECT_EQ(got.workspace, want.workspace);
            EXPECT_EQ(got.activations, m.activation_bytes());
          }
  }
}

TEST(CostModel, StagesSlotsAndBoundaries) {
  const ModelConfig c = tiny();
  Layout l;
  l.pp = 3;
  l.micro_batches = 4;
  l.stage_balance = StageBalance::Layers;
  EXPECT_EQ(stage_slots(l, 0), 3);  // 1F1B: pp - stage
  EXPECT_EQ(stage_slots(l, 2), 1);
  l.schedule = dist::Schedule::GPipe;
  EXPECT_EQ(stage_slots(l, 1), 4);
  const ModelShard s1 = stage_shard(c, l, 1);
  EXPECT_EQ(s1.layer_begin, 2);
  EXPECT_EQ(s1.end(c), 4);
  // Into [2,4): X(2) plus summaries max(0, 2+1-3)=0 .. 1; out of it X(4) and 2..3.
  EXPECT_EQ(boundary_tensors_in(c, s1), 3);
  EXPECT_EQ(boundary_tensors_out(c, s1), 3);
  EXPECT_EQ(boundary_tensors_in(c, stage_shard(c, l, 0)), 0);
  EXPECT_EQ(boundary_tensors_out(c, stage_shard(c, l, 2)), 0);
}

TEST(CostModel, ZeroPaddingMatchesTheBucketPlan) {
  // 10 elements, dp 4, buckets of 3 floats rounded down to a multiple of 4
  // (at least 4): buckets [0,4) [4,8) [8,10) -> chunks 1, 1, 1 -> 12.
  EXPECT_EQ(dist::zero_padded_elems(10, 4, 12), 12u);
  EXPECT_EQ(dist::bucket_spans(10, 4, 12).size(), 3u);
  EXPECT_EQ(dist::zero_padded_elems(8, 2, size_t(25) << 20), 8u);
  EXPECT_EQ(dist::zero_padded_elems(9, 2, size_t(25) << 20), 10u);
}

TEST(CostModel, LayerAndHeadFlopsSumToTheStepCount) {
  const ModelConfig c = tiny();
  double f = head_step_flops(c, 3);
  for (int l = 0; l < c.L; ++l) f += layer_step_flops(c, 3, l);
  EXPECT_DOUBLE_EQ(f, train_step_flops(c, 3));
  Layout l;
  l.pp = 2;
  l.tp = 2;
  l.micro_batch = 3;
  EXPECT_NEAR(stage_flops(c, l, 0) + stage_flops(c, l, 1), train_step_flops(c, 3) / 2, 1e-6 * f);
}

TEST(Pipeline, PerStageCostsAndLinkDelay) {
  using dist::Action;
  std::vector<std::vector<Action>> s = {dist::schedule_1f1b(2, 0, 1), dist::schedule_1f1b(2, 1, 1)};
  // One micro-batch: F0 on stage 0, link, F0 on stage 1, B0 there, link, B0.
  const auto sim = dist::simulate_pipeline(s, dist::StageCosts{{1.0, 2.0}, {3.0, 4.0}, 0.5});
  EXPECT_DOUBLE_EQ(sim.makespan, 1.0 + 0.5 + 2.0 + 4.0 + 0.5 + 3.0);
  // Uniform costs and no link: the old form.
  std::vector<std::vector<Action>> s4;
  for (int st = 0; st < 4; ++st) s4.push_back(dist::schedule_1f1b(4, st, 8));
  const auto a = dist::simulate_pipeline(s4, 1.0, 2.0);
  const auto b = dist::simulate_pipeline(s4, dist::StageCosts{{1, 1, 1, 1}, {2, 2, 2, 2}, 0.0});
  EXPECT_DOUBLE_EQ(a.makespan, b.makespan);
  EXPECT_NEAR(a.bubble_fraction, dist::bubble_fraction_predicted(4, 8), 1e-12);
  EXPECT_THROW(dist::simulate_pipeline(s4, dist::StageCosts{{1}, {2}, 0}), Error);
}

// The stage balancer against the bubble split (issue 37), 64 H100s timed by
// the committed H100 profile, tp1 pp8 dp8, 1 x 32 micro-batches. The
// balancer weighs layers and the head by FLOPs; the profile times them.
Prediction pp8_on_h100s(const std::string& model, const std::string& balance, const std::string& schedule = "1f1b",
                        int v = 1) {
  const ModelConfig c = model_preset(model);
  const Cluster cl = Cluster::gpu("h100", 64);
  const auto cm = gpu_compute_model(cl, GpuComputeChoice{});
  Layout l;
  l.pp = 8;
  l.dp = 8;
  l.micro_batches = 32;
  l.stage_balance = *parse_enum<StageBalance>(balance);
  l.schedule = *parse_enum<dist::Schedule>(schedule);
  l.virtual_stages = v;
  return predict(wiola_workload(c, l, Precision{DType::BF16, DType::F32, DType::BF16, true}), cl, *cm);
}

TEST(Planner, BubbleSplitAndTheStageBalancer) {
  for (const char* model : {"wiola-1.5b", "wiola-360m"})
    for (const char* balance : {"compute", "layers"}) {
      const Prediction p = pp8_on_h100s(model, balance);
      SCOPED_TRACE(testing::Message() << model << " balance " << balance);
      EXPECT_NEAR(p.bubble_fill_drain + p.bubble_imbalance, p.bubble_sim, 1e-12);
      // Fill/drain: the formula, plus the pipeline transfers' latency.
      EXPECT_GE(p.bubble_fill_drain, p.bubble_analytic);
      EXPECT_LT(p.bubble_fill_drain, p.bubble_analytic + 0.02);
      EXPECT_GT(p.bubble_imbalance, 0.02);  // the stages are uneven: the head
    }
  // wiola-1.5b (28 layers): the FLOP balance is the even split, 4 4 4 4 3 3 3 3+head.
  const Prediction big = pp8_on_h100s("wiola-1.5b", "compute"), big_even = pp8_on_h100s("wiola-1.5b", "layers");
  EXPECT_EQ(big.stage_fwd_s, big_even.stage_fwd_s);
  EXPECT_DOUBLE_EQ(big.bubble_imbalance, big_even.bubble_imbalance);
  // wiola-360m (16 layers): by FLOPs the head outweighs a layer, so the
  // balancer moves a layer from the last stage to the first, but timed the
  // head is lighter than a layer: the even split has less imbalance.
  const Prediction small = pp8_on_h100s("wiola-360m", "compute"), small_even = pp8_on_h100s("wiola-360m", "layers");
  EXPECT_GT(small.bubble_imbalance, small_even.bubble_imbalance + 0.03);
  EXPECT_GT(small.step_s, small_even.step_s);
}

// The backward's split (issue 37): W is one pass of the weight GEMMs, B the
// rest (input-gradient GEMMs, attention, context attention), so per stage
// 0 < W ≤ B and W ≤ the forward; over the stages W adds up to
// model/flops.h's weight-gradient count.
TEST(CostModel, BackwardSplitsIntoInputAndWeightGradients) {
  const ModelConfig c = tiny();
  for (bool rc : {false, true}) {
    Layout l;
    l.pp = 3;
    l.tp = 2;
    l.micro_batch = 2;
    l.recompute = rc;
    double w = 0;
    for (int s = 0; s < l.pp; ++s) {
      const StageFlops f = stage_flops_split(c, l, s);
      EXPECT_GT(f.bwd_weight, 0.0);
      EXPECT_LE(f.bwd_weight, f.bwd - f.bwd_weight);
      EXPECT_LE(f.bwd_weight, f.fwd);
      const StageKinds k = stage_kinds(c, l, s);
      EXPECT_EQ(k.gemm_bwd_weight, f.bwd_weight);
      EXPECT_LE(k.gemm_bwd_weight, k.gemm_bwd);
      w += f.bwd_weight;
    }
    double want = head_weight_grad_flops(c, 2);
    for (int i = 0; i < c.L; ++i) want += layer_weight_grad_flops(c, 2, i);
    EXPECT_NEAR(w * l.tp, want, 1e-9 * want);
  }
  // Without attention (the weights only), W is exactly a third of the step.
  ModelConfig big = model_preset("wiola-1.5b");
  EXPECT_NEAR(layer_weight_grad_flops(big, 1, 0) * 3,
              layer_step_flops(big, 1, 0) - attention_step_flops(big, 1) / big.L -
                  3.0 * big.T * big.H * 4.0 * big.dh() * big.n_ctx(0),
              1e-9 * layer_step_flops(big, 1, 0));
  EXPECT_DOUBLE_EQ(head_weight_grad_flops(big, 2) * 3, head_step_flops(big, 2));
}

// The schedules past 1F1B on the planner's H100 model (tp1 pp8 dp8, 1 x 32).
TEST(Planner, InterleavedAndZeroBubbleSchedules) {
  for (const char* model : {"wiola-1.5b", "wiola-360m"}) {
    SCOPED_TRACE(model);
    const Prediction one = pp8_on_h100s(model, "compute");
    const Prediction zb = pp8_on_h100s(model, "compute", "zb-h1");
    const Prediction il = pp8_on_h100s(model, "compute", "interleaved", 2);
    // ZB-H1: less fill/drain and a shorter step, live activations at 1F1B's
    // peak (8 micro-batches) on every rank.
    EXPECT_LT(zb.bubble_fill_drain, one.bubble_fill_drain - 0.02);
    EXPECT_LT(zb.step_s, one.step_s);
    EXPECT_EQ(one.peak_live, (std::vector<double>{8, 7, 6, 5, 4, 3, 2, 1}));
    EXPECT_EQ(zb.peak_live, std::vector<double>(8, 8.0));
    for (size_t g = 0; g < zb.stage_bwd_s.size(); ++g) {
      EXPECT_GT(zb.stage_bwd_weight_s[g], 0.0);
      EXPECT_LT(zb.stage_bwd_weight_s[g], zb.stage_bwd_s[g] / 2);  // W ≤ B
    }
    // Interleaved, 2 chunks per rank: the formula's fill/drain (plus the
    // transfers: 2 x as many), one chunk cost per global chunk, twice the
    // pipeline traffic's messages.
    EXPECT_DOUBLE_EQ(il.bubble_analytic, dist::bubble_fraction_interleaved(8, 32, 2));
    EXPECT_GE(il.bubble_fill_drain, il.bubble_analytic);
    EXPECT_LT(il.bubble_fill_drain, il.bubble_analytic + 0.03);
    EXPECT_LT(il.bubble_fill_drain, one.bubble_fill_drain - 0.05);
    EXPECT_LT(il.step_s, one.step_s);
    EXPECT_EQ(il.stage_fwd_s.size(), 16u);
    EXPECT_GT(il.traffic.pp, 1.5 * one.traffic.pp);
    EXPECT_GT(il.pp_s, 1.9 * one.pp_s);
    EXPECT_EQ(il.peak_live.front(), 11.5);  // (v−1)p + 2(p−1) + 1 = 23 chunks of 1/2
    EXPECT_EQ(il.peak_live.back(), 4.5);
  }
  // Not legal: m not a multiple of pp, more chunks than layers, unknown names.
  const ModelConfig c = tiny();
  Layout l;
  l.pp = 2;
  l.micro_batches = 3;
  l.schedule = dist::Schedule::Interleaved;
  l.virtual_stages = 2;
  EXPECT_THROW(stage_schedule(l, 0), Error);
  l.micro_batches = 4;
  l.virtual_stages = 4;
  EXPECT_THROW(wiola_workload(c, l, Precision{DType::F32, DType::F32, DType::F32, false}), Error);
  l.schedule = dist::Schedule::ZbH1;
  EXPECT_EQ(stage_slots(l, 1), 2);  // W's deferred: 1F1B's peak on every stage
  EXPECT_NE(l.name().find(", zb-h1"), std::string::npos);
  l.schedule = dist::Schedule::Interleaved;
  l.virtual_stages = 3;
  EXPECT_NE(l.name().find(", interleaved v3"), std::string::npos);
  EXPECT_EQ(wiola_workload(c, l, Precision{DType::F32, DType::F32, DType::F32, false}).chunks.size(), 6u);
}

// ZB-V on the planner's H100 model (tp1 pp8 dp8, 1 x 32): two chunks per
// rank in a V, at 1F1B's peak of live activations (p micro-batches of the
// rank's layers) on every rank, less fill/drain than ZB-H1, a shorter step
// than 1F1B; the last rank's two chunks meet without a transfer.
TEST(Planner, ZeroBubbleVSchedule) {
  for (const char* model : {"wiola-1.5b", "wiola-360m"}) {
    SCOPED_TRACE(model);
    const Prediction one = pp8_on_h100s(model, "compute");
    const Prediction zb = pp8_on_h100s(model, "compute", "zb-h1");
    const Prediction zv = pp8_on_h100s(model, "compute", "zb-v");
    EXPECT_EQ(zv.peak_live, std::vector<double>(8, 8.0));
    EXPECT_EQ(zv.stage_fwd_s.size(), 16u);
    EXPECT_LT(zv.bubble_fill_drain, zb.bubble_fill_drain);
    EXPECT_LT(zv.step_s, one.step_s);
    EXPECT_NEAR(zv.bubble_fill_drain + zv.bubble_imbalance, zv.bubble_sim, 1e-12);
    EXPECT_GT(zv.traffic.pp, 1.5 * one.traffic.pp);
  }
  // The V's turn on the last rank is not on the wire: its pipeline bytes are
  // its two chunks' less the boundary between them.
  const ModelConfig c = tiny();
  const Precision f32{DType::F32, DType::F32, DType::F32, false};
  Layout l;
  l.pp = 2;
  l.micro_batches = 3;
  l.schedule = dist::Schedule::ZbV;
  const Workload w = wiola_workload(c, l, f32);
  ASSERT_EQ(w.chunks.size(), 4u);
  EXPECT_DOUBLE_EQ(w.stages[0].traffic.pp, w.chunks[0].traffic.pp + w.chunks[3].traffic.pp);
  EXPECT_LT(w.stages[1].traffic.pp, w.chunks[1].traffic.pp + w.chunks[2].traffic.pp);
  EXPECT_EQ(stage_slots(l, 0), 2);  // 2p chunks live = p micro-batches of the rank's layers
  EXPECT_EQ(chunks_per_rank(l), 2);
  l.micro_batches = 1;  // m < p
  EXPECT_THROW(stage_schedule(l, 0), Error);
}

// The chunk-aware stage balancer (issue 37) against the simulator: its cut
// is never slower than the even split or the FLOP balance, its pipeline is
// the simulation of its chunks' times, and where the head outweighs a
// layer's share it takes layers off the last chunk.
TEST(Planner, ChunkBalancerAgainstTheSimulator) {
  const Cluster cl = Cluster::gpu("h100", 64);
  const auto profile = gpu_compute_model(cl, GpuComputeChoice{});
  // The datasheet model times by FLOPs: there wiola-360m's tied head (V·d)
  // outweighs one of its layers.
  const auto datasheet = flops_compute_model(cl.peak_flops, kGpuGemmEfficiency, 2000);
  const Precision bf16{DType::BF16, DType::F32, DType::BF16, true};
  for (auto [model, schedule, v, pp, by_flops] : {std::tuple{"wiola-1.5b", "zb-v", 1, 4, false},
                                                  {"wiola-1.5b", "interleaved", 2, 4, false},
                                                  {"wiola-360m", "zb-v", 1, 4, false},
                                                  {"wiola-360m", "zb-v", 1, 4, true},
                                                  {"wiola-360m", "interleaved", 2, 4, true},
                                                  {"wiola-1.5b", "1f1b", 1, 8, false}}) {
    SCOPED_TRACE(testing::Message() << model << " " << schedule << " pp" << pp << (by_flops ? " datasheet" : ""));
    ComputeModel& cm = by_flops ? *datasheet : *profile;
    const ModelConfig c = model_preset(model);
    Layout l;
    l.pp = pp;
    l.dp = 64 / pp;
    l.micro_batches = 4 * pp;
    l.schedule = *parse_enum<dist::Schedule>(schedule);
    l.virtual_stages = v;
    const int n = pp * chunks_per_rank(l);
    Layout even_l = l;  // the same rank-level stages, the chunks cut evenly
    even_l.cuts = {0};
    for (int g = 0; g < n; ++g) even_l.cuts.push_back(dist::stage_layers(c.L, n, g).second);
    const Prediction flops = predict(wiola_workload(c, l, bf16), cl, cm);
    const Prediction even = predict(wiola_workload(c, even_l, bf16), cl, cm);
    const Layout b = balance_chunks(c, l, cl, cm, bf16);
    ASSERT_EQ(int(b.cuts.size()), n + 1);
    const Prediction bal = predict(wiola_workload(c, b, bf16), cl, cm);
    EXPECT_LE(bal.step_s, flops.step_s + 1e-12);
    EXPECT_LE(bal.step_s, even.step_s + 1e-12);
    // Its pipeline is the simulator's makespan on its chunks' times (the
    // prediction adds the transfers' delay).
    std::vector<std::vector<dist::Action>> sched;
    for (int s = 0; s < pp; ++s) sched.push_back(stage_schedule(b, s));
    const dist::StageCosts cost{bal.stage_fwd_s, bal.stage_bwd_s, 0.0, bal.stage_bwd_weight_s};
    EXPECT_LE(dist::simulate_pipeline(sched, cost, chunk_placement(b)).makespan, bal.pipeline_s + 1e-12);
    EXPECT_GT(dist::simulate_pipeline(sched, cost, chunk_placement(b)).makespan, 0.95 * bal.pipeline_s);
    const int last = b.cuts[size_t(n)] - b.cuts[size_t(n) - 1],
              last_even = even_l.cuts[size_t(n)] - even_l.cuts[size_t(n) - 1];
    EXPECT_LE(last, last_even + 1);
    if (by_flops) {
      EXPECT_LT(last, last_even);  // the head-heavy case: layers off the last chunk
      EXPECT_LT(bal.step_s, even.step_s);
    }
    std::printf("%s %s pp%d%s: cuts", model, schedule, pp, by_flops ? " datasheet" : "");
    for (int x : b.cuts) std::printf(" %d", x);
    std::printf("; step %.4f (even %.4f, flops %.4f)\n", bal.step_s, even.step_s, flops.step_s);
  }
}

// The search's schedule choice (issue 37): among the schedules wiola train
// runs, the fastest that fits; interleaved predicted and named, never picked.
TEST(Planner, ChoosesTheScheduleByStepTimeAndMemoryAndSaysWhy) {
  const ModelConfig c = model_preset("wiola-1.5b");
  Cluster cl = Cluster::gpu("h100", 64);
  const auto cm = gpu_compute_model(cl, GpuComputeChoice{});
  const Precision bf16{DType::BF16, DType::F32, DType::BF16, true};
  Layout l;
  l.pp = 8;
  l.dp = 8;
  l.micro_batches = 32;
  const Prediction p = predict_schedules(c, l, cl, *cm, bf16);
  // 1f1b, zb-h1, interleaved v2 (v4: 32 chunks for 28 layers, left out), zb-v.
  ASSERT_EQ(p.schedule_options.size(), 4u);
  EXPECT_EQ(p.schedule_options[0].name, "1f1b");
  EXPECT_EQ(p.schedule_options[1].name, "zb-h1");
  EXPECT_EQ(p.schedule_options[2].name, "interleaved v2");
  EXPECT_EQ(p.schedule_options[3].name, "zb-v");
  EXPECT_FALSE(p.schedule_options[2].runnable);
  EXPECT_FALSE(p.schedule_options[3].runnable);
  EXPECT_NE(p.schedule_why.find("zb-v: step"), std::string::npos) << p.schedule_why;
  EXPECT_GT(p.schedule_options[2].pp_bytes, 1.5 * p.schedule_options[0].pp_bytes);  // twice the boundaries
  // Each option is predict()'s figure for that schedule.
  Layout zl = l;
  zl.schedule = dist::Schedule::ZbH1;
  const Prediction zb = predict(wiola_workload(c, zl, bf16), cl, *cm);
  EXPECT_DOUBLE_EQ(p.schedule_options[1].step_s, zb.step_s);
  EXPECT_DOUBLE_EQ(p.schedule_options[1].bubble_sim, zb.bubble_sim);
  EXPECT_DOUBLE_EQ(p.schedule_options[1].activation_bytes, zb.memory.activations);
  // Everything fits on an H100: ZB-H1 is faster than 1F1B and is picked.
  EXPECT_LT(p.schedule_options[1].step_s, p.schedule_options[0].step_s);
  EXPECT_EQ(p.layout.schedule, dist::Schedule::ZbH1);
  EXPECT_DOUBLE_EQ(p.step_s, zb.step_s);
  EXPECT_EQ(p.schedule_why.rfind("zb-h1: step", 0), 0u) << p.schedule_why;
  EXPECT_NE(p.schedule_why.find("interleaved v2: step"), std::string::npos) << p.schedule_why;
  EXPECT_NE(p.schedule_why.find("not picked on GPUs: pipeline messages through host memory"), std::string::npos)
      << p.schedule_why;
  EXPECT_NE(p.schedule_why.find("2.0x the pipeline traffic"), std::string::npos) << p.schedule_why;
  // Even where interleaved would be fastest, the pick stays runnable.
  for (const char* model : {"wiola-1.5b", "wiola-360m"}) {
    const Prediction q = predict_schedules(model_preset(model), l, cl, *cm, bf16, true, false);
    EXPECT_NE(q.layout.schedule, dist::Schedule::Interleaved) << model;
    for (const auto& o : q.schedule_options) {
      if (o.runnable && o.fits) {
        EXPECT_LE(q.step_s, o.step_s) << model << " " << o.name;
      }
    }
  }
  // Memory decides: a device where 1F1B fits and ZB-H1 (more live W
  // operands and activations) does not.
  Layout ol = l;
  const Prediction one = predict(wiola_workload(c, ol, bf16), cl, *cm);
  ASSERT_LT(one.memory.total(), zb.memory.total());
  Cluster tight = cl;
  tight.memory_bytes = (one.memory.total() + zb.memory.total()) / 2 / 0.92;
  const Prediction m = predict_schedules(c, l, tight, *cm, bf16, true, false);
  EXPECT_TRUE(m.fits);
  EXPECT_EQ(m.layout.schedule, dist::Schedule::OneFOneB);
  EXPECT_NE(m.schedule_why.find("zb-h1: does not fit"), std::string::npos) << m.schedule_why;
  // m not a multiple of pp: no interleaved (zb-v: m ≥ p); m < p: neither;
  // the chunked ones off: neither.
  Layout odd = l;
  odd.micro_batches = 30;
  EXPECT_EQ(predict_schedules(c, odd, cl, *cm, bf16, true, false).schedule_options.size(), 3u);
  odd.micro_batches = 6;
  EXPECT_EQ(predict_schedules(c, odd, cl, *cm, bf16, true, false).schedule_options.size(), 2u);
  EXPECT_EQ(predict_schedules(c, l, cl, *cm, bf16, false).schedule_options.size(), 2u);
  // pp 1: nothing to choose.
  Layout flat;
  flat.dp = 64;
  const Prediction f = predict_schedules(c, flat, cl, *cm, bf16);
  EXPECT_TRUE(f.schedule_options.empty());
  EXPECT_TRUE(f.schedule_why.empty());
  // The search: every pipelined layout carries its choice, all runnable;
  // try_schedules = false keeps 1F1B.
  SearchSpace sp;
  sp.global_batch = 256;
  sp.micro_batch_sizes = {1, 2};
  sp.try_recompute = sp.try_no_zero = false;
  bool saw_zb = false;
  for (const Prediction& x : search_wiola(c, cl, *cm, sp, bf16)) {
    EXPECT_NE(x.layout.schedule, dist::Schedule::Interleaved);
    EXPECT_EQ(x.schedule_why.empty(), x.layout.pp == 1) << x.layout.name();
    saw_zb = saw_zb || x.layout.schedule == dist::Schedule::ZbH1;
  }
  EXPECT_TRUE(saw_zb);
  sp.try_schedules = false;
  for (const Prediction& x : search_wiola(c, cl, *cm, sp, bf16)) EXPECT_EQ(x.layout.schedule, dist::Schedule::OneFOneB);
}

// The run report's predicted bubble (perf::schedule_bubble): the run's own
// schedule simulated on its stages' FLOPs. Its fill/drain part is the
// balanced formula for 1F1B and GPipe; ZB-H1's is smaller; pp 1 has none.
TEST(Planner, ScheduleBubbleOfTheRunsOwnSchedule) {
  const ModelConfig c = model_preset("wiola-360m");
  Layout l;
  l.pp = 4;
  l.micro_batches = 8;
  for (const char* s : {"1f1b", "gpipe"}) {
    l.schedule = *parse_enum<dist::Schedule>(s);
    const dist::PipelineSim b = schedule_bubble(c, l);
    EXPECT_NEAR(b.bubble_fill_drain, dist::bubble_fraction_predicted(4, 8), 1e-12) << s;
    EXPECT_GT(b.bubble_imbalance, 0.0) << s;  // the head on the last stage
    EXPECT_NEAR(b.bubble_fraction, b.bubble_fill_drain + b.bubble_imbalance, 1e-12) << s;
  }
  l.schedule = dist::Schedule::OneFOneB;
  const double one = schedule_bubble(c, l).bubble_fraction;
  l.schedule = dist::Schedule::ZbH1;
  const dist::PipelineSim zb = schedule_bubble(c, l);
  EXPECT_LT(zb.bubble_fill_drain, dist::bubble_fraction_predicted(4, 8) - 0.05);
  EXPECT_LT(zb.bubble_fraction, one);
  l.schedule = dist::Schedule::Interleaved;
  l.virtual_stages = 2;
  EXPECT_LT(schedule_bubble(c, l).bubble_fill_drain, dist::bubble_fraction_predicted(4, 8) - 0.05);
  Layout flat;
  EXPECT_EQ(schedule_bubble(c, flat).bubble_fraction, 0.0);
}

TEST(Hardware, TableLookups) {
  const Accelerator* h = find_accelerator("NVIDIA H100 80GB HBM3");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->key, "h100");
  EXPECT_NEAR(h->bf16_tflops, 989.4, 0.1);
  EXPECT_EQ(find_accelerator("NVIDIA GeForce RTX 4090"), nullptr);
  EXPECT_EQ(find_accelerator("a100")->key, "a100");
  EXPECT_EQ(find_interconnect("ib-ndr").gbs, 50);
  EXPECT_THROW(find_interconnect("ethernet"), Error);
  for (const auto& a : accelerators()) EXPECT_FALSE(a.source.empty()) << a.key;
  for (const auto& i : interconnects()) EXPECT_FALSE(i.source.empty()) << i.key;
}

TEST(Planner, GptFlopsFollowMegatronsFormula) {
  GptConfig g;
  g.d = 2048;
  g.L = 24;
  g.H = 16;
  g.V = 51200;
  g.T = 2048;
  Layout l;
  l.micro_batch = 4;
  l.micro_batches = 8;
  l.dp = 4;
  const Workload w = gpt_workload(g, l);
  const double B = l.global_batch(), s = g.T, h = g.d;
  // Narayanan et al. 2021: 72 B s L h^2 (1 + s/(6h) + V/(12 h L)).
  const double want = 72 * B * s * g.L * h * h * (1 + s / (6 * h) + g.V / (12 * h * g.L));
  EXPECT_NEAR(w.step_flops, want, 1e-9 * want);
}

TEST(Planner, OneDeviceIsComputePlusOptimizer) {
  GptConfig g;
  g.d = 1024;
  g.L = 8;
  g.H = 16;
  g.V = 32768;
  g.T = 1024;
  Cluster cl = Cluster::gpu("h100", 1);
  auto cm = flops_compute_model(cl.peak_flops, 0.5, 2000);
  Layout l;
  l.micro_batch = 2;
  l.micro_batches = 3;
  const Workload w = gpt_workload(g, l);
  const Prediction p = predict(w, cl, *cm);
  const double compute = (w.stages[0].fwd_flops + w.stages[0].bwd_flops) * 3 / (cl.peak_flops * 0.5);
  EXPECT_NEAR(p.pipeline_s, compute, 1e-12);
  EXPECT_NEAR(p.step_s, compute + cm->optimizer(w.stages[0].opt_elems), 1e-12);
  EXPECT_NEAR(p.mfu, w.step_flops / p.step_s / cl.peak_flops, 1e-12);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.traffic.total(), 0.0);
}

TEST(Planner, SearchKeepsTpInsideANodeAndRanksFittingLayoutsFirst) {
  const ModelConfig c = model_preset("wiola-360m");
  Cluster cl = Cluster::gpu("h100", 16);
  auto cm = flops_compute_model(cl.peak_flops, kGpuGemmEfficiency, 2000);
  SearchSpace sp;
  sp.global_batch = 64;
  sp.micro_batch_sizes = {1, 4};
  const Precision bf16{DType::BF16, DType::F32, DType::BF16, true};
  const auto ps = search_wiola(c, cl, *cm, sp, bf16);
  ASSERT_FALSE(ps.empty());
  bool seen_unfit = false;
  for (size_t i = 0; i < ps.size(); ++i) {
    const Layout& l = ps[i].layout;
    EXPECT_LE(l.tp, cl.per_node);
    EXPECT_EQ(c.Hkv % l.tp, 0);
    EXPECT_LE(l.pp, c.L);
    EXPECT_EQ(l.world(), 16);
    EXPECT_EQ(l.global_batch(), 64);
    if (!ps[i].fits) {
      seen_unfit = true;
    } else {
      EXPECT_FALSE(seen_unfit) << "a fitting layout after one that does not fit";
    }
    if (i > 0 && ps[i].fits == ps[i - 1].fits) {
      EXPECT_GE(ps[i].step_s, ps[i - 1].step_s);
    }
  }
  // More memory than the device has does not fit.
  Cluster small = cl;
  small.memory_bytes = 1 << 20;
  const Prediction p = predict(wiola_workload(c, ps[0].layout, bf16), small, *cm);
  EXPECT_FALSE(p.fits);
  EXPECT_FALSE(p.why_not.empty());
}

TEST(Planner, RunEstimateCountsStepsAndCheckpoints) {
  Prediction p;
  p.step_s = 2.0;
  p.memory.params = 4e9;
  p.memory.optimizer = 6e9;
  Workload w;
  w.T = 1000;
  w.layout.micro_batch = 10;  // 10 000 tokens per step
  w.layout.dp = 2;            // 20 000
  Cluster cl;
  cl.host_copy_gbs = 10;
  const RunEstimate r = estimate_run(p, w, cl, 2e6, 1.0, true);
  EXPECT_EQ(r.steps, 100);
  EXPECT_EQ(r.checkpoints, 1 + 3);              // 200 s of steps, every minute, plus the last
  EXPECT_NEAR(r.checkpoint_s, 4 * 1.0, 1e-12);  // 10 GB at 10 GB/s each
  EXPECT_NEAR(r.device_hours, (200 + 4) * 2 / 3600.0, 1e-12);
}

}  // namespace
}  // namespace wiola::perf
