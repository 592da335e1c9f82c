// The CUDA emulator's half (../emulator.h): c10's, whose conversion from float rounds to nearest
// even as __float2half_rn does.
#pragma once
#include <c10/util/Half.h>

#include "../emulator.h"

using __half = c10::Half;
inline float __half2float(__half v) { return static_cast<float>(v); }
inline __half __float2half_rn(float v) { return __half(v); }
