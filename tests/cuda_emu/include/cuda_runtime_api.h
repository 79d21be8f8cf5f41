// The emulator's runtime API (tests/cuda_emu/include/cuda_runtime.h).
#pragma once

#include "cuda_runtime.h"
