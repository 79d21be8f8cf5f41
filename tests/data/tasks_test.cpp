// Multiple-choice task files (data/tasks.h): reading and its errors, the
// requests encoded as lm-evaluation-harness encodes a (context, " " +
// choice) pair with left truncation, and acc / acc_norm / the gold
// log-likelihood from given log-likelihoods.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/tasks.h"
#include "data/tokenizer.h"
#include "data_test_util.h"
#include "util/error.h"

namespace wiola {
namespace {

std::string error_of(const std::string& path) {
  try {
    read_task_file(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Tasks, ReadsItemsAndNames) {
  test::TempDir dir("tasks-read");
  test::write_text(dir / "a.jsonl",
                   "{\"context\": \"Q: 1+1?\\nA:\", \"choices\": [\"2\", \"3\"], \"gold\": 0}\n\n"
                   "{\"context\": \"x\", \"choices\": [\"a\", \"b\", \"c\"], \"gold\": 2}\n");
  test::write_text(dir / "b.jsonl",
                   "{\"task\": \"a\", \"context\": \"y\", \"choices\": [\"p\", \"q\"], \"gold\": 1}\n");
  const TaskFile a = read_task_file(dir / "a.jsonl");
  EXPECT_EQ(a.name, "a");
  ASSERT_EQ(a.items.size(), 2u);
  EXPECT_EQ(a.items[0].context, "Q: 1+1?\nA:");
  EXPECT_EQ(a.items[1].choices, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(a.items[1].gold, 2);
  const std::vector<TaskFile> both = read_task_files({dir / "a.jsonl", dir / "b.jsonl"});
  EXPECT_EQ(both[0].name, "a");
  EXPECT_EQ(both[1].name, "a:2");  // the same "task" twice stays apart
}

TEST(Tasks, BadFilesNameTheLineAndTheProblem) {
  test::TempDir dir("tasks-bad");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"context\": \"x\", \"choices\": [\"a\", \"b\"], \"gold\": 0}\n{\"context\": \"x\"", ":2: not JSON"},
      {"{\"choices\": [\"a\", \"b\"], \"gold\": 0}", ":1: no \"context\""},
      {"{\"context\": \"x\", \"choices\": [\"a\"], \"gold\": 0}", "1 choices (at least 2"},
      {"{\"context\": \"x\", \"choices\": [\"a\", 3], \"gold\": 0}", "not an array of strings"},
      {"{\"context\": \"x\", \"choices\": [\"a\", \"b\"], \"gold\": 2}", "\"gold\" is 2, not an index"},
      {"{\"context\": \"x\", \"choices\": [\"a\", \"b\"], \"gold\": 0.5}", "\"gold\" is 0.5"},
      {"{\"context\": \"\", \"choices\": [\"a\", \"b\"], \"gold\": 0}", "\"context\" is empty"},
      {"{\"task\": \"s\", \"context\": \"x\", \"choices\": [\"a\", \"b\"], \"gold\": 0}\n"
       "{\"task\": \"t\", \"context\": \"x\", \"choices\": [\"a\", \"b\"], \"gold\": 0}",
       ":2: \"task\" is \"t\", earlier lines say \"s\""},
      {"\n", "no items"},
  };
  for (const auto& [text, want] : cases) {
    test::write_text(dir / "t.jsonl", text);
    const std::string e = error_of(dir / "t.jsonl");
    EXPECT_NE(e.find("t.jsonl"), std::string::npos) << e;
    EXPECT_NE(e.find(want), std::string::npos) << "want " << want << ", got: " << e;
  }
  EXPECT_NE(error_of(dir / "missing.jsonl").find("cannot be read"), std::string::npos);
}

TEST(Tasks, RequestsAreLmEvalsEncodingTruncatedOnTheLeft) {
  const Tokenizer tok = Tokenizer::load(test::kWiolaTokenizer);
  TaskFile t;
  t.path = "mem";
  t.items.push_back({"The cat sat on the", {"mat", "quantum chromodynamics"}, 0});
  t.items.push_back({"Question: why?\nAnswer: ", {"because"}, 0});  // a trailing space moves to the choice
  const std::vector<TaskRequest> r = task_requests(t, tok, 64);
  ASSERT_EQ(r.size(), 3u);
  const auto check = [&](const TaskRequest& q, const std::string& ctx, const std::string& cont) {
    const std::vector<int32_t> whole = tok.encode(ctx + cont), c = tok.encode(ctx);
    EXPECT_EQ(q.window, whole);
    EXPECT_EQ(q.scored, int(whole.size() - c.size()));
  };
  check(r[0], "The cat sat on the", " mat");
  check(r[1], "The cat sat on the", " quantum chromodynamics");
  check(r[2], "Question: why?\nAnswer:", "  because");
  EXPECT_GE(r[1].scored, 2);
  // T = 3: the last 4 tokens; the continuation keeps at most 3 targets.
  const std::vector<TaskRequest> s = task_requests(t, tok, 3);
  const std::vector<int32_t> whole = tok.encode("The cat sat on the quantum chromodynamics");
  EXPECT_EQ(s[1].window, std::vector<int32_t>(whole.end() - 4, whole.end()));
  EXPECT_EQ(s[1].scored, std::min(r[1].scored, 3));
}

TEST(Tasks, RowsAndLogLikelihoods) {
  TaskRequest q{{5, 6, 7, 8}, 2};  // targets 6, 7, 8 at positions 0..2; the last two are the choice's
  std::vector<int32_t> row(7);
  fill_task_row(q, 6, row.data());
  EXPECT_EQ(row, (std::vector<int32_t>{5, 6, 7, 8, 8, 8, 8}));
  const float losses[6] = {100, 0.5f, 0.25f, 100, 100, 100};
  EXPECT_DOUBLE_EQ(task_loglik(q, losses), -0.75);
}

TEST(Tasks, AccAndAccNormAsLmEval) {
  TaskFile t;
  t.name = "toy";
  // acc picks "a" (-1); per character "bbbb" wins (-1.2 / 4 = -0.3 > -1).
  t.items.push_back({"c", {"a", "bbbb"}, 1});
  // acc_norm divides by characters, not bytes: "é" is one (-0.9), "xy" two (-0.6).
  t.items.push_back({"c", {"é", "xy"}, 0});
  // equal log-likelihoods: the first is taken (numpy's argmax).
  t.items.push_back({"c", {"p", "q", "r"}, 0});
  const TaskScores s = score_task(t, {-1.0, -1.2, -0.9, -1.2, -2.0, -2.0, -3.0});
  EXPECT_EQ(s.name, "toy");
  EXPECT_EQ(s.items, 3);
  EXPECT_DOUBLE_EQ(s.acc, 2.0 / 3.0);       // item 2 (-0.9 > -1.2) and item 3
  EXPECT_DOUBLE_EQ(s.acc_norm, 2.0 / 3.0);  // item 1 and item 3; item 2: -0.6 > -0.9
  EXPECT_DOUBLE_EQ(s.gold_loglik, (-1.2 - 0.9 - 2.0) / 3.0);
}

}  // namespace
}  // namespace wiola
