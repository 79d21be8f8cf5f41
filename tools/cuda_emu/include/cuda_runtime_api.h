// The emulator's runtime API (tools/cuda_emu/include/cuda_runtime.h).
#pragma once

#include "cuda_runtime.h"
