// Fuzz target: arbitrary bytes through the bundled Wiola-360M tokenizer, as
// `wiola prep` feeds it documents. Valid UTF-8 must round-trip exactly, and
// a second encode (served from the per-thread word cache) must give the same
// ids; anything else must be refused naming the bad byte. The first input
// byte chooses whether added tokens are parsed.
#include <string>
#include <vector>

#include "data/byte_level.h"
#include "data/tokenizer.h"
#include "tests/fuzz/fuzz.h"

using namespace wiola;

namespace {
const Tokenizer& bundled() {
  static const Tokenizer t = Tokenizer::load(WIOLA_SOURCE_DIR "/data/wiola360m/tokenizer.json");
  return t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool parse_special = data[0] & 1;
  const std::string text(fuzz::as_text(data + 1, size - 1));
  const Tokenizer& t = bundled();
  const bool accepted = fuzz::accept_or_refuse([&] {
    const std::vector<int32_t> ids = t.encode(text, parse_special);
    FUZZ_EXPECT(t.encode(text, parse_special) == ids, "a second encode (word cache) differs");
    for (int32_t id : ids) FUZZ_EXPECT(id >= 0 && uint32_t(id) < t.vocab_size(), "id ", id);
    FUZZ_EXPECT(t.decode(ids) == text, "decode(encode(x)) != x");
  });
  FUZZ_EXPECT(accepted == valid_utf8(text), "accepted ", accepted, " for text whose UTF-8 validity is ",
              valid_utf8(text));
  return 0;
}
