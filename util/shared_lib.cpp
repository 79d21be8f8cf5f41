#include "util/shared_lib.h"

#include <dlfcn.h>

#include "util/error.h"

namespace wiola {

SharedLib::SharedLib(const char* soname, std::string who, const std::string& hint)
    : handle_(dlopen(soname, RTLD_NOW | RTLD_LOCAL)), soname_(soname), who_(std::move(who)) {
  const char* err = handle_ ? nullptr : dlerror();
  WIOLA_CHECK(handle_, who_, ": cannot load ", soname, " (", err ? err : "unknown error", "); ", hint);
}

void* SharedLib::address(const char* symbol) const {
  dlerror();
  void* p = dlsym(handle_, symbol);
  const char* err = dlerror();
  WIOLA_CHECK(p && !err, who_, ": ", soname_, " has no symbol ", symbol, err ? ": " : "", err ? err : "");
  return p;
}

}  // namespace wiola
