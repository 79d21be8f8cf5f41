// Fuzz target: the manifest.json of a checkpoint folder, which resume,
// `wiola ckpt` and `wiola export` read before any tensor file. A manifest
// that opens has a step, and verifying its (absent) files reports problems
// rather than failing. `wiola ckpt verify` (verify_deep), which reads any
// manifest, sound or not, lists problems and never throws.
#include <string>

#include "ckpt/format.h"
#include "ckpt/tools.h"
#include "tests/fuzz/fuzz.h"

using namespace wiola;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Scratch::write("ckpt/manifest.json", fuzz::as_text(data, size));
  const std::string folder = (fuzz::Scratch::dir() / "ckpt").string();
  const bool opens = fuzz::accept_or_refuse([&] {
    const ckpt::Reader r(folder);
    (void)r.step();
    const auto problems = r.verify();
    FUZZ_EXPECT(problems.size() >= r.files().size(), problems.size(), " problems for ", r.files().size(),
                " files that do not exist");
  });
  const bool listed = fuzz::accept_or_refuse([&] {
    const std::vector<std::string> problems = ckpt::verify_deep(folder, nullptr);
    FUZZ_EXPECT(!problems.empty() || !opens, "no problem found in a checkpoint without its files");
  });
  FUZZ_EXPECT(listed, "verify_deep threw instead of listing the problems");
  return 0;
}
