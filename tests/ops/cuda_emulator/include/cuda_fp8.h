// The CUDA emulator's float8 conversion (../emulator.h): c10's, rounding to nearest even, with
// __NV_SATFINITE's clamp to the largest finite value first (fp8_conversion_check proves the
// toolkit's conversion equal to c10's on the clamped values the kernels convert).
#pragma once
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <cmath>

#include "../emulator.h"

typedef unsigned char __nv_fp8_storage_t;
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };

inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t saturation,
                                                __nv_fp8_interpretation_t format) {
  const float largest = format == __NV_E4M3 ? 448.0f : 57344.0f;
  if (saturation == __NV_SATFINITE && !std::isnan(x)) {
    x = x < -largest ? -largest : (x > largest ? largest : x);
  }
  return format == __NV_E4M3 ? c10::Float8_e4m3fn(x).x : c10::Float8_e5m2(x).x;
}
