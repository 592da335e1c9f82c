// src/ops/cuda/float8_kernels.cu compiled as C++ for the emulator (emulator.h): the same source
// and launchers under the same names (this test program does not link libfsdp). One file per
// kernel source: each has its own constants in an unnamed namespace.
#include "ops/cuda/float8_kernels.cu"
