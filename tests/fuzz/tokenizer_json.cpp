// Fuzz target: a tokenizer.json as a user might hand `wiola prep` or
// `wiola tokenize`. A file that loads must then keep the tokenizer's promise,
// decode(encode(x)) == x with every id inside the vocabulary, on text that
// mixes plain words with the file's own added tokens.
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "tests/fuzz/fuzz.h"

using namespace wiola;

namespace {
void check_round_trip(const Tokenizer& t, const std::string& text, bool parse_special) {
  const std::vector<int32_t> ids = t.encode(text, parse_special);
  for (int32_t id : ids)
    FUZZ_EXPECT(id >= 0 && uint32_t(id) < t.vocab_size(), "id ", id, " of vocabulary size ", t.vocab_size());
  const std::string back = t.decode(ids);
  FUZZ_EXPECT(back == text, "decode(encode(\"", text, "\")) gave \"", back, "\"");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(fuzz::as_text(data, size));
  fuzz::accept_or_refuse([&] {
    const Tokenizer t = Tokenizer::from_json_text(json, "fuzz/tokenizer.json");
    std::string text = "Hello, world! It's 2026 \xc3\xa9t\xc3\xa9  \n\t tabs";
    for (const AddedToken& a : t.added_tokens()) text += "x" + a.content + " ";
    check_round_trip(t, text, true);
    check_round_trip(t, text, false);
  });
  return 0;
}
