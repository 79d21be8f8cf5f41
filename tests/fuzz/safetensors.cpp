// Fuzz target: a model.safetensors file, as `wiola export --check` and the
// Hugging Face import read it. A file that opens must be readable: every
// tensor it lists comes back with as many values as its shape holds, and
// can be found by name.
#include <string>
#include <vector>

#include "infer/safetensors.h"
#include "tests/fuzz/fuzz.h"

using namespace wiola;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::Scratch::write("model.safetensors", fuzz::as_text(data, size));
  fuzz::accept_or_refuse([&] {
    const st::File f(path);
    uint64_t bytes = 0;
    for (const st::TensorInfo& t : f.tensors()) {
      FUZZ_EXPECT(f.find(t.name) == &t, "tensor ", t.name, " not found by name");
      const std::vector<float> v = f.read(t.name);
      FUZZ_EXPECT(int64_t(v.size()) == t.numel(), t.name, ": ", v.size(), " values for ", t.numel());
      bytes += t.end - t.begin;
    }
    FUZZ_EXPECT(bytes <= size, "tensors hold ", bytes, " bytes of a ", size, "-byte file");
  });
  return 0;
}
