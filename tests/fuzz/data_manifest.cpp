// Fuzz target: the manifest.json that `wiola prep` writes beside its shards
// and the loader reads. One that reads must write and read back unchanged.
#include <string>

#include "data/manifest.h"
#include "tests/fuzz/fuzz.h"

using namespace wiola;

namespace {
bool same(const Manifest& a, const Manifest& b) {
  if (a.vocab_size != b.vocab_size || a.eos_id != b.eos_id || a.tokenizer_sha256 != b.tokenizer_sha256 ||
      a.tokenizer_file != b.tokenizer_file || a.extra_json != b.extra_json || a.splits.size() != b.splits.size())
    return false;
  for (const auto& [name, s] : a.splits) {
    auto it = b.splits.find(name);
    if (it == b.splits.end() || it->second.num_tokens != s.num_tokens ||
        it->second.num_documents != s.num_documents || it->second.shards.size() != s.shards.size())
      return false;
    for (size_t i = 0; i < s.shards.size(); ++i) {
      const ManifestShard &x = s.shards[i], &y = it->second.shards[i];
      if (x.file != y.file || x.num_tokens != y.num_tokens || x.num_documents != y.num_documents) return false;
    }
  }
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::Scratch::write("in/manifest.json", fuzz::as_text(data, size));
  fuzz::accept_or_refuse([&] {
    const Manifest m = read_manifest(path);
    const std::string out = (fuzz::Scratch::dir() / "out" / "manifest.json").string();
    std::filesystem::create_directories(fuzz::Scratch::dir() / "out");
    write_manifest(out, m);
    FUZZ_EXPECT(same(read_manifest(out), m), "the manifest changes on writing and reading back");
  });
  return 0;
}
