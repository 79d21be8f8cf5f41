// The emulator's record of kernel launches, for tests that must tell which
// kernel shape an option launched where the outputs cannot (a variant that
// gives another's bits, such as the fa2 forward's head packing): the name,
// grid and block of each launch issued while recording is on. Plain C++ (no
// CUDA types), so a test built against the emulated backend includes it
// without emu.h; implemented in emu.cpp.
#pragma once

#include <string>
#include <vector>

namespace wiola_emu {

struct LaunchShape {
  std::string name;  // the kernel as the launch names it in its source
  unsigned grid[3], block[3];
};

// On: clears the record, then keeps every launch issued (off by default).
void record_launches(bool on);
// The launches issued since recording was turned on, in order.
std::vector<LaunchShape> recorded_launches();

}  // namespace wiola_emu
