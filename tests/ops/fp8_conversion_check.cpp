// The CUDA cast kernels round a float to float8 with NVIDIA's conversion (cuda_fp8.h's
// __nv_cvt_float_to_fp8, saturating to the finite range, round to nearest even: on sm_89 and
// newer one instruction, elsewhere and on the host the header's own emulation of it); ATen's
// .to(float8) rounds with c10's Float8_e4m3fn / Float8_e5m2. The kernels' bytes equal the ATen
// cast's only if the two conversions agree. This checks them on the host, where both run: every
// float8 value, the float midway between two neighbours (the ties), the floats beside those,
// and a stride over all 2^32 float bit patterns (clamped to the format's range first, as the
// kernels clamp). NaN is left out (its sign and payload bits are no promise of either).
// Prints the counts; exits 1 on a mismatch, naming the first few.
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

struct Format {
  const char* name;
  float max;
  __nv_fp8_interpretation_t nv;
  uint8_t (*c10)(float);
  float (*decode)(uint8_t);
};

const Format kFormats[] = {
    {"e4m3fn", 448.0f, __NV_E4M3, [](float v) { return c10::Float8_e4m3fn(v).x; },
     [](uint8_t b) {
       return static_cast<float>(c10::Float8_e4m3fn(b, c10::Float8_e4m3fn::from_bits()));
     }},
    {"e5m2", 57344.0f, __NV_E5M2, [](float v) { return c10::Float8_e5m2(v).x; },
     [](uint8_t b) {
       return static_cast<float>(c10::Float8_e5m2(b, c10::Float8_e5m2::from_bits()));
     }},
};

int64_t checked = 0, mismatches = 0;

void check(const Format& f, float v) {
  if (std::isnan(v)) return;
  v = v < -f.max ? -f.max : (v > f.max ? f.max : v);
  const uint8_t nv = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, f.nv);
  const uint8_t c = f.c10(v);
  ++checked;
  if (nv != c && mismatches++ < 8) {
    std::printf("%s: %a (%.9g) -> cuda_fp8.h 0x%02x, c10 0x%02x\n", f.name, v, v, nv, c);
  }
}

}  // namespace

int main() {
  for (const auto& f : kFormats) {
    // The finite values in increasing order, from the bytes.
    std::vector<float> values;
    for (int b = 0; b < 256; ++b) {
      const float v = f.decode(static_cast<uint8_t>(b));
      if (std::isfinite(v)) values.push_back(v);
    }
    std::sort(values.begin(), values.end());
    for (size_t i = 0; i < values.size(); ++i) {
      check(f, values[i]);
      if (i + 1 == values.size()) break;
      const float mid = static_cast<float>((static_cast<double>(values[i]) + values[i + 1]) / 2);
      check(f, mid);
      check(f, std::nextafter(mid, -INFINITY));
      check(f, std::nextafter(mid, INFINITY));
    }
    for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 61) {
      const auto u = static_cast<uint32_t>(bits);
      float v;
      std::memcpy(&v, &u, sizeof v);
      check(f, v);
    }
  }
  std::printf("%lld conversions checked, %lld mismatches\n", static_cast<long long>(checked),
              static_cast<long long>(mismatches));
  return mismatches == 0 ? 0 : 1;
}
