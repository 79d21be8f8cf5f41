// Run monitoring pieces on their own: CRC-32C and the metrics -> TensorBoard
// tags, straggler detection, the rank state board (docs/performance.md).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "dist/diagnostics.h"
#include "dist/rank_states.h"
#include "train/stragglers.h"
#include "train/tensorboard.h"
#include "data/text_input.h"

namespace wiola {
namespace {

TEST(TensorBoard, Crc32cKnownValues) {
  // RFC 3720 B.4 and the usual check value.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  // Continuing a CRC equals one pass.
  EXPECT_EQ(crc32c("56789", 5, crc32c("1234", 4)), 0xE3069283u);
  const uint32_t c = crc32c("123456789", 9);
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, ScalarsOfAMetricsRecord) {
  const auto j = nlohmann::json::parse(
      R"({"step": 7, "loss": 2.5, "lr": 1e-4, "mfu": 0.4, "time_ms": {"compute": 10, "comm": 2},
          "peak_mem_mib": 100, "val_loss_sources": [3.0, null], "grad_norm": null, "new_field": 5})");
  std::map<std::string, double> m;
  for (const auto& [tag, v] : tensorboard_scalars(j, {"web", "code"})) m[tag] = v;
  EXPECT_EQ(m.count("step"), 0u);
  EXPECT_EQ(m.at("train/loss"), 2.5);
  EXPECT_EQ(m.at("perf/mfu"), 0.4);
  EXPECT_EQ(m.at("time_ms/compute"), 10);
  EXPECT_EQ(m.at("memory/peak_mib"), 100);
  EXPECT_EQ(m.at("val/1-web/loss"), 3.0);
  EXPECT_TRUE(std::isnan(m.at("val/2-code/loss")));
  EXPECT_TRUE(std::isnan(m.at("train/grad_norm")));
  EXPECT_EQ(m.at("metrics/new_field"), 5);
  EXPECT_EQ(tensorboard_source_name("runs/web shards/manifest.json"), "web_shards");
  EXPECT_EQ(tensorboard_source_name("/data/code/"), "code");
  EXPECT_EQ(tensorboard_source_name("one.h5"), "one.h5");
}

TEST(Stragglers, MedianAndDetection) {
  EXPECT_EQ(median_of({3, 1, 2}), 2);
  EXPECT_EQ(median_of({4, 1, 3, 2}), 2.5);
  EXPECT_TRUE(std::isnan(median_of({})));
  // All ranks peers: rank 2 is 1.5x the median.
  EXPECT_EQ(find_stragglers({1.0, 1.0, 1.5, 1.1}, {-1, -1, -1, -1}, 0.2), std::vector<int>{2});
  EXPECT_TRUE(find_stragglers({1.0, 1.0, 1.5, 1.1}, {-1, -1, -1, -1}, 0.0).empty());  // off
  EXPECT_TRUE(find_stragglers({1.0, 1.0, 1.5, 1.1}, {-1, -1, -1, -1}, 0.6).empty());
  // Per pipeline stage: the last stage's heavier work is not a straggler,
  // its slow replica is.
  EXPECT_EQ(find_stragglers({1.0, 1.0, 2.0, 3.0}, {0, 0, 1, 1}, 0.1), std::vector<int>{3});
  EXPECT_TRUE(find_stragglers({1.0, std::nan("")}, {-1, -1}, 0.2).empty());
}

TEST(RankStates, PublishedAndReadBack) {
  const auto dir = std::filesystem::path(WIOLA_BINARY_DIR) / "tests/monitor/rank_states";
  std::filesystem::remove_all(dir);
  {
    // An earlier job's file for rank 2.
    dist::RankStateBoard old(dir.string(), 2, 3, 42);
  }
  dist::RankStateBoard board(dir.string(), 0, 3, 7);
  dist::set_context("stage 0 step 3 forward micro-batch 1");
  dist::publish_rank_wait("all_reduce on group 'tp' (rank 0 of 2), count 5 float32", 1.5);
  std::string r = dist::rank_states_report();
  EXPECT_NE(r.find("rank 0 ("), std::string::npos) << r;
  EXPECT_NE(r.find("stage 0 step 3 forward micro-batch 1; blocked for 1."), std::string::npos) << r;
  EXPECT_NE(r.find("in all_reduce on group 'tp'"), std::string::npos) << r;
  EXPECT_NE(r.find("rank 1: no state"), std::string::npos) << r;
  EXPECT_NE(r.find("rank 2: no state from this job"), std::string::npos) << r;
  dist::publish_rank_wait_done();
  r = dist::rank_states_report();
  EXPECT_NE(r.find("; not blocked in a communication wait"), std::string::npos) << r;
  // The file is plain text (cat RUN/ranks/* on a hung job).
  const std::string text = read_file((dir / "rank-0.txt").string());
  EXPECT_NE(text.find("context stage 0 step 3 forward micro-batch 1\n"), std::string::npos);
  // Cost of one context change (a pwrite of the 1 KiB record).
  const int n = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) dist::set_context("stage 0 step " + std::to_string(i) + " forward micro-batch 0");
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
  std::printf("set_context with the board open: %.2f us per call\n", us);
  EXPECT_LT(us, 1000.0);
}

TEST(RankStates, NothingWithoutABoard) {
  EXPECT_EQ(dist::rank_states_report(), "");
  dist::set_context("no board");  // publishes nowhere
}

}  // namespace
}  // namespace wiola
