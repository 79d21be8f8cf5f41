// WIOLA_HD marks scalar code that both the host and a GPU kernel run (nvcc
// compiles it for both; a plain C++ compiler sees an ordinary inline
// function). Such code is written once and checked once.
#pragma once

#if defined(__CUDACC__)
#define WIOLA_HD __host__ __device__ inline
#else
#define WIOLA_HD inline
#endif
