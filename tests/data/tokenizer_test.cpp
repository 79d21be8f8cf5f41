// Byte-level BPE: merges on hand-made vocabularies, the GPT-2 split on tricky
// text, round trips, unsupported files, and ids equal to Hugging Face's.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "data/byte_level.h"
#include "data/pretokenizer.h"
#include "data/tokenizer.h"
#include "data_test_util.h"
#include "util/error.h"

namespace wiola {
namespace {

using json = nlohmann::json;

// A byte-level tokenizer.json: the 256 byte characters (id = byte value) plus
// `merges` (byte-level spelling), new tokens numbered from 256.
json make_json(const std::vector<std::pair<std::string, std::string>>& merges, bool with_specials = false) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(uint8_t(b))] = b + (with_specials ? 2 : 0);
  int next = 256 + (with_specials ? 2 : 0);
  json mj = json::array();
  for (auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    mj.push_back(json::array({a, b}));
  }
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = json::array();
  if (with_specials) {
    j["added_tokens"].push_back({{"id", 0}, {"content", "<eos>"}, {"special", true}});
    j["added_tokens"].push_back({{"id", 1}, {"content", "<|end|>"}, {"special", true}});
  }
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", mj}};
  return j;
}

Tokenizer make(const std::vector<std::pair<std::string, std::string>>& merges) {
  return Tokenizer::from_json_text(make_json(merges).dump(), "test.json");
}

std::vector<int32_t> ids_of(const std::string& bytes) {
  std::vector<int32_t> v;
  for (unsigned char c : bytes) v.push_back(c);
  return v;
}

TEST(BpeMerges, AppliesMergesToAWholeWord) {
  Tokenizer t = make({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}});
  EXPECT_EQ(t.encode("hello"), (std::vector<int32_t>{259}));
  std::vector<int32_t> want = {259, 260};
  for (int32_t c : ids_of("orld")) want.push_back(c);
  EXPECT_EQ(t.encode("hello world"), want);
}

TEST(BpeMerges, LowerRankWins) {
  EXPECT_EQ(make({{"a", "b"}, {"b", "c"}}).encode("abc"), (std::vector<int32_t>{256, 'c'}));
  EXPECT_EQ(make({{"b", "c"}, {"a", "b"}}).encode("abc"), (std::vector<int32_t>{'a', 256}));
}

TEST(BpeMerges, LeftmostFirstOnTies) {
  Tokenizer t = make({{"a", "a"}});
  EXPECT_EQ(t.encode("aaa"), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(t.encode("aaaa"), (std::vector<int32_t>{256, 256}));
  Tokenizer t2 = make({{"a", "a"}, {"aa", "aa"}});
  EXPECT_EQ(t2.encode("aaaaa"), (std::vector<int32_t>{257, 'a'}));
}

TEST(BpeMerges, MergesOnlyInsideAPiece) {
  Tokenizer t = make({{"a", "Ġ"}});  // "a " would need a merge across the split
  EXPECT_EQ(t.encode("a a"), (std::vector<int32_t>{'a', ' ', 'a'}));
}

TEST(BpeMerges, SpecialTokensAreCutOutLeftmostLongest) {
  Tokenizer t = Tokenizer::from_json_text(make_json({}, true).dump(), "s.json");
  std::vector<int32_t> ids = t.encode("a<eos>b<|end|>");
  EXPECT_EQ(ids, (std::vector<int32_t>{'a' + 2, 0, 'b' + 2, 1}));
  EXPECT_EQ(t.decode(ids), "a<eos>b<|end|>");
  std::vector<int32_t> plain = t.encode("a<eos>", false);
  EXPECT_EQ(plain.size(), 6u);
  EXPECT_EQ(t.decode(plain), "a<eos>");
  EXPECT_EQ(t.eos_id(), 0);
}

TEST(BpeMerges, MergeOfUnknownTokenIsAnError) {
  json j = make_json({{"a", "b"}});
  j["model"]["vocab"].erase("ab");
  try {
    Tokenizer::from_json_text(j.dump(), "bad.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not in model.vocab"), std::string::npos) << e.what();
  }
}

std::vector<std::string> split(const std::string& s) {
  PreTokenizer p(true);
  PreTokenizer::Scratch scratch;
  std::vector<std::string_view> v;
  p.split(s, v, scratch);
  return {v.begin(), v.end()};
}
using V = std::vector<std::string>;

TEST(SplitPattern, Contractions) {
  EXPECT_EQ(split("I'm can't we've they'll he'd she's you're"),
            (V{"I", "'m", " can", "'t", " we", "'ve", " they", "'ll", " he", "'d", " she", "'s", " you", "'re"}));
  EXPECT_EQ(split("DON'T"), (V{"DON", "'", "T"}));  // case-sensitive, as in GPT-2
  EXPECT_EQ(split("'s's"), (V{"'s", "'s"}));
}

TEST(SplitPattern, DigitsAndLetters) {
  EXPECT_EQ(split("abc123 4567 x1"), (V{"abc", "123", " 4567", " x", "1"}));
  EXPECT_EQ(split("3.14159"), (V{"3", ".", "14159"}));
  EXPECT_EQ(split("٣٤ Ⅻ"), (V{"٣٤", " Ⅻ"}));  // Arabic-Indic digits, Roman numeral (Nl)
}

TEST(SplitPattern, WhitespaceRuns) {
  EXPECT_EQ(split("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(split("a   \n\n b"), (V{"a", "   \n\n", " b"}));
  EXPECT_EQ(split("x   "), (V{"x", "   "}));
  EXPECT_EQ(split("  hello"), (V{" ", " hello"}));
  EXPECT_EQ(split("a\tb"), (V{"a", "\t", "b"}));
  EXPECT_EQ(split("a\xC2\xA0" "b"), (V{"a", "\xC2\xA0", "b"}));  // NBSP is whitespace, not a prefix space
  EXPECT_EQ(split("a\xE1\xA0\x8E" "b"), (V{"a", "\xE1\xA0\x8E", "b"}));  // U+180E is not White_Space
}

TEST(SplitPattern, AccentsCjkEmoji) {
  EXPECT_EQ(split("café naïve Ωmega"), (V{"café", " naïve", " Ωmega"}));
  EXPECT_EQ(split("e\xCC\x81t\xC3\xA9"), (V{"e", "\xCC\x81", "t\xC3\xA9"}));  // combining mark is Mn, not L
  EXPECT_EQ(split("日本語テキスト"), (V{"日本語テキスト"}));
  EXPECT_EQ(split("中文，标点"), (V{"中文", "，", "标点"}));
  EXPECT_EQ(split("hi 👋🏽!! ok"), (V{"hi", " 👋🏽!!", " ok"}));
}

TEST(Tokenizer, RoundTripsRandomUnicode) {
  Tokenizer t = Tokenizer::load(test::kWiolaTokenizer);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    int n = int(rng() % 40);
    for (int i = 0; i < n; ++i) {
      uint32_t cp;
      switch (rng() % 4) {
        case 0: cp = 32 + rng() % 95; break;
        case 1: cp = " \t\n\r"[rng() % 4]; break;
        case 2: cp = rng() % 0x3000; break;
        default: cp = rng() % 0x110000; break;
      }
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
      append_utf8(s, cp);
    }
    std::vector<int32_t> ids = t.encode(s);
    EXPECT_EQ(t.decode(ids), s);
    for (int32_t id : ids) EXPECT_LT(uint32_t(id), t.vocab_size());
  }
  std::string all_bytes_utf8;
  for (uint32_t cp = 1; cp < 0x800; ++cp) append_utf8(all_bytes_utf8, cp);
  EXPECT_EQ(t.decode(t.encode(all_bytes_utf8)), all_bytes_utf8);
}

TEST(Tokenizer, InvalidUtf8IsAnError) {
  Tokenizer t = make({});
  EXPECT_THROW(t.encode(std::string("ab\xFF" "c")), Error);
  EXPECT_THROW(t.encode(std::string("\xC0\xAF")), Error);          // overlong
  EXPECT_THROW(t.encode(std::string("\xED\xA0\x80")), Error);      // surrogate
  EXPECT_THROW(t.encode(std::string("\xE2\x82")), Error);          // truncated
  try {
    t.encode(std::string("abc\xFF"));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offset 3"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, WiolaFileFacts) {
  Tokenizer t = Tokenizer::load(test::kWiolaTokenizer);
  EXPECT_EQ(t.vocab_size(), 32000u);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.model().num_merges(), 31736u);
  EXPECT_EQ(t.sha256(), "6143f34c12731e3dfdfb6b803666be63a0a317ce81e7896d29ad75416b83e00e");
  EXPECT_EQ(t.token_to_id("<|assistant|>"), 5);
}

void expect_error(const std::string& json_text, const std::string& needle) {
  try {
    Tokenizer::from_json_text(json_text, "x/tokenizer.json");
    FAIL() << "no error for " << needle;
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("x/tokenizer.json"), std::string::npos) << w;
    EXPECT_NE(w.find(needle), std::string::npos) << w;
  }
}

TEST(Tokenizer, UnsupportedKindsAreClearErrors) {
  expect_error("{not json", "JSON parse error");
  expect_error("{}", "no \"model\"");
  json j = make_json({});
  json w = j;
  w["model"]["type"] = "WordPiece";
  expect_error(w.dump(), "model.type is \"WordPiece\"");
  w = j;
  w["normalizer"] = {{"type", "NFC"}};
  expect_error(w.dump(), "normalizer is NFC");
  w = j;
  w["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_error(w.dump(), "pre_tokenizer is not ByteLevel");
  w = j;
  w["pre_tokenizer"]["add_prefix_space"] = true;
  expect_error(w.dump(), "add_prefix_space");
  w = j;
  w["model"]["byte_fallback"] = true;
  expect_error(w.dump(), "byte_fallback");
  w = j;
  w["model"]["vocab"].erase(byte_char('A'));
  expect_error(w.dump(), "256 byte-level characters");
  EXPECT_THROW(Tokenizer::load("/nonexistent/tokenizer.json"), Error);
}

// Files a fuzzer made (tests/fuzz): wrong JSON types anywhere, and ids that
// could not index an embedding or could not decode, are refused naming the
// file rather than escaping as a library exception or a huge allocation.
TEST(Tokenizer, MalformedFilesAreClearErrors) {
  json j = make_json({}, /*with_specials=*/true);
  json w = j;
  w["model"]["type"] = {{"a", 0}};
  expect_error(w.dump(), "malformed tokenizer.json");
  w = j;
  w["normalizer"] = 3;
  expect_error(w.dump(), "normalizer is 3");
  w = j;
  w["decoder"] = "ByteLevel";
  expect_error(w.dump(), "decoder is not ByteLevel");
  w = j;
  w["model"]["vocab"][byte_char('A')] = 65.5;
  expect_error(w.dump(), "model.vocab token \"A\" has id 65.5, not an integer from 0 to 16777215");
  w = j;
  w["model"]["vocab"][byte_char('A')] = int64_t(1) << 24;
  expect_error(w.dump(), "has id 16777216");
  w = j;
  w["model"]["vocab"][byte_char('A')] = 2 + 'B';
  expect_error(w.dump(), "model.vocab gives id 68 to both");
  w = j;
  w["added_tokens"][0]["id"] = 2 + 'A';
  expect_error(w.dump(), "added token \"<eos>\" has id 67, which model.vocab gives to \"A\"");
  w = j;
  w["added_tokens"][1]["id"] = 0;
  expect_error(w.dump(), "added tokens \"<eos>\" and \"<|end|>\" share id 0");
  w = j;
  w["added_tokens"][1]["id"] = "1";
  expect_error(w.dump(), "added token \"<|end|>\" has id \"1\"");
  // An added token may repeat a vocabulary token under its id.
  w = j;
  w["model"]["vocab"]["<eos>"] = 0;
  const Tokenizer t = Tokenizer::from_json_text(w.dump(), "x/tokenizer.json");
  EXPECT_EQ(t.encode("a<eos>", true), (std::vector<int32_t>{2 + 'a', 0}));
}

// --- equality with Hugging Face `tokenizers` -----------------------------

const std::vector<std::string>& tricky_lines() {
  static const std::vector<std::string> lines = [] {
    std::vector<std::string> v = {
        "Hello, world! It's 2024-01-01 and I'm    fine.",
        "  leading spaces and trailing   ",
        "tabs\tand\t\tmore\ttabs \t mixed",
        "don't DON'T we'll WE'LL you'd 's 't 're 've 'm 'll 'd",
        "numbers 1234567890 3.14159 1,000,000 ٣٤٥ Ⅻ ½",
        "café naïve résumé Ωμέγα Ελληνικά русский текст",
        "日本語のテキスト、中文，标点符号。한국어 텍스트",
        "emoji 👋🏽👨‍👩‍👧‍👦 🇫🇷 !!! ?? ... ---",
        "nbsp\xC2\xA0here\xE3\x80\x80ideographic\xE2\x80\x83" "emspace \xE1\xA0\x8E mongolian",
        "e\xCC\x81 combining a\xCC\x8A marks",
        "<eos> specials <|user|>hi<|assistant|>there<|end|><pad>",
        "code: for (int i = 0; i < n; ++i) { x[i] += y[i]; }",
        "\x01\x02\x7F control \x1B[0m chars",
        "",
        " ",
        "a",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    };
    // A sweep over code points: each with letters, digits and spaces around it.
    for (uint32_t base = 0x20; base < 0x110000; base += (base < 0x3400 ? 64 : 64 * 37)) {
      std::string s;
      for (uint32_t cp = base; cp < base + 64 && cp < 0x110000; ++cp) {
        if ((cp >= 0xD800 && cp <= 0xDFFF) || cp == '\n') continue;
        s += "x";
        append_utf8(s, cp);
        s += "1 ";
        append_utf8(s, cp);
        append_utf8(s, cp);
        s += "  ";
      }
      v.push_back(s);
    }
    return v;
  }();
  return lines;
}

void compare_with_hf(const std::string& tokenizer, const std::string& lines_file, const std::vector<std::string>& lines,
                     const std::string& scratch) {
  auto hf = test::hf_encode_lines(tokenizer, lines_file, scratch);
  ASSERT_EQ(hf.size(), lines.size()) << "HF script failed or line count differs";
  Tokenizer t = Tokenizer::load(tokenizer);
  size_t mismatches = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<int32_t> ours = t.encode(lines[i]);
    std::vector<int> ours_i(ours.begin(), ours.end());
    if (ours_i != hf[i] && ++mismatches <= 5) ADD_FAILURE() << "line " << i + 1 << " differs: " << lines[i].substr(0, 80);
    if (ours_i == hf[i]) {
      EXPECT_EQ(t.decode(ours), lines[i]) << "round trip, line " << i + 1;
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(TokenizerVsHuggingFace, TrickyStrings) {
  if (!test::hf_tokenizers_available()) GTEST_SKIP() << test::kHfMissing;
  test::TempDir dir("tok-tricky");
  std::string text;
  for (const auto& l : tricky_lines()) text += l + "\n";
  test::write_text(dir / "lines.txt", text);
  compare_with_hf(test::kWiolaTokenizer, dir / "lines.txt", tricky_lines(), dir.path.string());
}

TEST(TokenizerVsHuggingFace, WholeBrownCorpus) {
  if (!test::hf_tokenizers_available()) GTEST_SKIP() << test::kHfMissing;
  test::TempDir dir("tok-brown");
  std::string text = test::slurp(test::kBrown);
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t e = text.find('\n', pos);
    lines.push_back(text.substr(pos, e - pos));
    pos = e + 1;
  }
  compare_with_hf(test::kWiolaTokenizer, test::kBrown, lines, dir.path.string());
  Tokenizer t = Tokenizer::load(test::kWiolaTokenizer);
  size_t total = 0;
  for (const auto& l : lines) total += t.encode(l).size();
  EXPECT_EQ(total, 1304297u);  // Brown, line by line, no special tokens
}

}  // namespace
}  // namespace wiola
