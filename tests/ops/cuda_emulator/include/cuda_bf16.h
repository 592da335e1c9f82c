// The CUDA emulator's bfloat16 (../emulator.h): c10's, whose conversion from float rounds to
// nearest even as __float2bfloat16_rn does.
#pragma once
#include <c10/util/BFloat16.h>

#include "../emulator.h"

using __nv_bfloat16 = c10::BFloat16;
inline float __bfloat162float(__nv_bfloat16 v) { return static_cast<float>(v); }
inline __nv_bfloat16 __float2bfloat16_rn(float v) { return __nv_bfloat16(v); }
