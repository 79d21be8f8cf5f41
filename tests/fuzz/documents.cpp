// Fuzz target: a corpus file as `wiola prep` and `wiola tokenizer train`
// read it, once as JSONL and once as plain text. Every document handed on is
// non-empty UTF-8, and the bytes reported consumed add up to the file's size.
#include <string>

#include "data/byte_level.h"
#include "data/text_input.h"
#include "tests/fuzz/fuzz.h"

using namespace wiola;

namespace {
void read_as(const std::string& path, InputFormat format, size_t size) {
  DocReaderOptions opt;
  opt.format = format;
  uint64_t consumed = 0;
  const bool accepted = fuzz::accept_or_refuse([&] {
    read_documents(
        path, opt,
        [&](std::string&& doc) {
          FUZZ_EXPECT(!doc.empty(), "an empty document");
          FUZZ_EXPECT(valid_utf8(doc), "a document that is not UTF-8");
        },
        [&](uint64_t n) { consumed += n; });
  });
  FUZZ_EXPECT(accepted ? consumed == size : consumed <= size, consumed, " bytes consumed of ", size);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes = fuzz::as_text(data, size);
  read_as(fuzz::Scratch::write("docs.jsonl", bytes), InputFormat::kJsonl, size);
  read_as(fuzz::Scratch::write("docs.txt", bytes), InputFormat::kText, size);
  return 0;
}
