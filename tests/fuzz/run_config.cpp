// Fuzz target: a `wiola train --config` TOML file, then (after a NUL byte)
// `--set section.key=value` overrides, one per line. A config that loads
// must survive the trip every run and checkpoint makes: written back as TOML
// (run_config_to_toml), it loads again to the same TOML.
#include <string>
#include <vector>

#include "config/run_config.h"
#include "tests/fuzz/fuzz.h"

using namespace wiola;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all = fuzz::as_text(data, size);
  const size_t nul = all.find('\0');
  const std::string toml(all.substr(0, nul));
  std::vector<std::string> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = all.substr(nul + 1);
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      overrides.emplace_back(rest.substr(0, nl));
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    }
  }
  fuzz::accept_or_refuse([&] {
    const RunConfig rc = run_config_from_toml_text(toml, "fuzz.toml", overrides);
    const std::string written = run_config_to_toml(rc);
    std::string again;
    const bool reloaded = fuzz::accept_or_refuse(
        [&] { again = run_config_to_toml(run_config_from_toml_text(written, "written.toml")); });
    FUZZ_EXPECT(reloaded, "the config it wrote does not load:\n", written);
    FUZZ_EXPECT(again == written, "the written config changes on reloading:\n", written, "\nvs\n", again);
  });
  return 0;
}
