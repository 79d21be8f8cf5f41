// A shared library loaded at run time by SONAME (dlopen), found through
// LD_LIBRARY_PATH or the binary's RUNPATH: how the CUDA backend loads cuBLAS
// and the data plane loads NCCL, so that a run that does not use them never
// maps them. The library stays loaded for the life of the process.
#pragma once

#include <string>

namespace wiola {

class SharedLib {
 public:
  // Throws wiola::Error "<who>: cannot load <soname> (<loader message>); <hint>".
  SharedLib(const char* soname, std::string who, const std::string& hint);

  // fn = the address of `symbol`; a missing symbol is a wiola::Error naming it.
  template <class F>
  void bind(F& fn, const char* symbol) const {
    fn = reinterpret_cast<F>(address(symbol));
  }
  // The dlopen handle, for code that looks its symbols up itself (the cuDNN
  // frontend's dynamic loading, bench/cudnn_sdpa.cpp).
  void* handle() const { return handle_; }

 private:
  void* address(const char* symbol) const;
  void* handle_;
  const char* soname_;
  std::string who_;
};

}  // namespace wiola
