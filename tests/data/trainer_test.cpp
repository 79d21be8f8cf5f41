// BPE training: the first merges on a toy corpus, thread independence, and
// Hugging Face loading the written file and encoding identically.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/bpe_trainer.h"
#include "data/tokenizer.h"
#include "data_test_util.h"
#include "util/error.h"

namespace wiola {
namespace {

TEST(BpeTrainer, MergesTheMostFrequentPairFirst) {
  test::TempDir dir("train-toy");
  test::write_text(dir / "toy.txt", "ab ab ab cd\n");
  BpeTrainOptions o;
  o.vocab_size = 8 + 256 + 2;
  o.min_frequency = 1;
  auto j = nlohmann::json::parse(train_bpe({dir / "toy.txt"}, o));
  ASSERT_GE(j["model"]["merges"].size(), 2u);
  EXPECT_EQ(j["model"]["merges"][0], nlohmann::json::array({"a", "b"}));    // 3 times
  EXPECT_EQ(j["model"]["merges"][1], nlohmann::json::array({"Ġ", "ab"}));  // 2 times
  EXPECT_EQ(j["model"]["vocab"]["<eos>"], 2);
  Tokenizer t = Tokenizer::from_json_text(j.dump(), "toy");
  EXPECT_EQ(t.encode("ab ab").size(), 2u);
  EXPECT_THROW(train_bpe({dir / "nope.txt"}, o), Error);
}

TEST(BpeTrainer, BrownTrainedTokenizerMatchesHuggingFace) {
  test::TempDir dir("train-brown");
  BpeTrainOptions o;
  o.vocab_size = 1000;
  o.threads = 1;
  std::string one = train_bpe({test::kBrown}, o);
  o.threads = 2;
  std::string two = train_bpe({test::kBrown}, o);
  EXPECT_EQ(one, two) << "result depends on the thread count";
  test::write_text(dir / "tokenizer.json", two);
  Tokenizer t = Tokenizer::load(dir / "tokenizer.json");
  EXPECT_EQ(t.vocab_size(), 1000u);
  EXPECT_EQ(t.model().num_merges(), 1000u - 264u);
  if (!test::hf_tokenizers_available()) GTEST_SKIP() << test::kHfMissing;
  std::string text = test::slurp(test::kBrown).substr(0, 400000);
  text = text.substr(0, text.rfind('\n') + 1) + "Unseen: ünïcödé 日本 👋 don't  stop\n";
  test::write_text(dir / "lines.txt", text);
  auto hf = test::hf_encode_lines(dir / "tokenizer.json", dir / "lines.txt", dir.path.string());
  ASSERT_FALSE(hf.empty()) << "HF could not load or run on the trained tokenizer.json";
  size_t pos = 0, i = 0, bad = 0;
  while (pos < text.size()) {
    size_t e = text.find('\n', pos);
    std::vector<int32_t> ours = t.encode(text.substr(pos, e - pos));
    ASSERT_LT(i, hf.size());
    if (std::vector<int>(ours.begin(), ours.end()) != hf[i]) ++bad;
    pos = e + 1;
    ++i;
  }
  EXPECT_EQ(i, hf.size());
  EXPECT_EQ(bad, 0u);
}

}  // namespace
}  // namespace wiola
