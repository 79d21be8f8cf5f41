// Fuzz target: model.safetensors.index.json, the map of a sharded Hugging
// Face model folder that `wiola export --check` and the import read. Two
// valid shards sit beside it (a, b in the first; c in the second). A folder
// that opens maps every tensor of its shards, each to the shard holding it.
#include <set>
#include <sstream>
#include <string>

#include "infer/safetensors.h"
#include "tests/fuzz/fuzz.h"

using namespace wiola;

namespace {
// The shards, written once: three one-value f32 tensors.
void write_shards() {
  static const bool done = [] {
    auto shard = [](const std::string& name, const std::vector<std::string>& tensors) {
      std::ostringstream h;
      for (size_t i = 0; i < tensors.size(); ++i)
        h << (i ? "," : "{") << '"' << tensors[i] << "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":["
          << 4 * i << "," << 4 * i + 4 << "]}";
      std::string header = h.str() + "}";
      header.resize((header.size() + 7) / 8 * 8, ' ');
      std::string bytes(8, '\0');
      for (int k = 0; k < 8; ++k) bytes[size_t(k)] = char((header.size() >> (8 * k)) & 0xff);
      bytes += header + std::string(4 * tensors.size(), '\0');
      fuzz::Scratch::write("hf/" + name, bytes);
    };
    shard(st::shard_name(1, 2), {"a", "b"});
    shard(st::shard_name(2, 2), {"c"});
    return true;
  }();
  (void)done;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  write_shards();
  fuzz::Scratch::write(std::string("hf/") + st::kIndexFile, fuzz::as_text(data, size));
  fuzz::accept_or_refuse([&] {
    const st::Folder f((fuzz::Scratch::dir() / "hf").string());
    std::set<std::string> names;
    for (const st::TensorInfo* t : f.tensors()) {
      names.insert(t->name);
      FUZZ_EXPECT(f.read(t->name).size() == 1, t->name);
    }
    FUZZ_EXPECT(names.size() == f.tensors().size(), "a tensor listed twice");
  });
  return 0;
}
