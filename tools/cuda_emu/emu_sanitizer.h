// Whether the emulated backend a test links runs under AddressSanitizer
// (asan.* tests: tests/cuda_emu/CMakeLists.txt). The op tests are compiled once
// for every emulated backend, so they ask at run time. Under ASan a test keeps
// every kernel and mask path (bounds are per path, not per value) and may
// leave out the repeats that only add numerics, which the emu. and rev. runs
// check; implemented in emu.cpp.
#pragma once

namespace wiola_emu {

bool under_address_sanitizer();

}  // namespace wiola_emu
