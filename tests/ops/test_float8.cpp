// ops::to_float8, float8_mm and float8_linear against their definitions (float8.h): the cast's
// scale, rounding and saturation; the GEMM against float32 matmuls of the dequantized operands
// in every layout; the linear's output and its three gradients against the same GEMMs built by
// hand from casts (e4m3 forward, e5m2 gradient), bf16, a frozen weight, and bad input. The
// comparison with torchao's Float8Linear itself is llama_parity_float8 (tests/reference).
#include <gtest/gtest.h>

#include "fsdp/errors.h"
#include "fsdp/ops/float8.h"
#include "ops/float8_cast.h"
#include "support/tensor_compare.h"
#include "support/torch_api.h"

namespace fsdp::testing {
namespace {

using ops::Float8Tensor;
using ops::to_float8;

at::Tensor dequantize(const Float8Tensor& t) { return t.data.to(at::kFloat) / t.scale; }

TEST(Float8Cast, ScaleMapsTheLargestMagnitudeToTheFormatsMaximum) {
  torch::manual_seed(1);
  auto t = torch::randn({64, 48}) * 3;
  t[5][7] = -40.5;  // the largest magnitude (randn * 3 stays below 20 here), negative
  for (auto dtype : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
    const double max = dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0;
    const auto c = to_float8(t, dtype);
    EXPECT_EQ(c.data.scalar_type(), dtype);
    EXPECT_EQ(c.scale.scalar_type(), at::kFloat);
    EXPECT_EQ(c.scale.numel(), 1);
    EXPECT_FLOAT_EQ(c.scale.item<float>(), static_cast<float>(max / 40.5));
    EXPECT_EQ(c.data[5][7].to(at::kFloat).item<float>(), -max);
    // Every element rounds to the nearest float8 value: within half a step of 3 (e4m3) or 2
    // (e5m2) mantissa bits, relative, for the normal ones; the tiny ones within the smallest
    // subnormal's half.
    const double step = dtype == at::kFloat8_e4m3fn ? 1.0 / 8 : 1.0 / 4;
    const double subnormal =
        dtype == at::kFloat8_e4m3fn ? std::ldexp(1.0, -9) : std::ldexp(1.0, -16);
    auto scaled = t * c.scale;
    auto err = (c.data.to(at::kFloat) - scaled).abs();
    auto bound = scaled.abs() * (step / 2) + subnormal / 2;
    EXPECT_TRUE((err <= bound * (1 + 1e-6)).all().item<bool>()) << c10::toString(dtype);
  }
}

TEST(Float8Cast, ZeroStaysZeroAndBf16CastsAsFloat) {
  auto zero = torch::zeros({16, 16});
  const auto c = to_float8(zero, at::kFloat8_e4m3fn);
  EXPECT_FLOAT_EQ(c.scale.item<float>(), static_cast<float>(448.0 / 1e-12));
  EXPECT_EQ(c.data.to(at::kFloat).abs().max().item<float>(), 0.0f);
  torch::manual_seed(2);
  auto b = torch::randn({32, 16}).to(at::kBFloat16);
  const auto from_bf16 = to_float8(b, at::kFloat8_e4m3fn);
  const auto from_f32 = to_float8(b.to(at::kFloat), at::kFloat8_e4m3fn);
  EXPECT_TRUE(from_bf16.scale.equal(from_f32.scale));
  EXPECT_TRUE(from_bf16.data.view(at::kByte).equal(from_f32.data.view(at::kByte)));
}

TEST(Float8Cast, RefusesWhatItCannotCast) {
  EXPECT_THROW(to_float8(torch::randn({4}), at::kBFloat16), InvalidArgument);
  EXPECT_THROW(to_float8(torch::ones({4}, torch::kLong), at::kFloat8_e4m3fn), InvalidArgument);
  EXPECT_THROW(to_float8(torch::randn({0, 4}), at::kFloat8_e4m3fn), InvalidArgument);
}

// The GEMMs' layouts of one cast (ops/float8_cast.h): the column-major one holds the row-major
// one's bytes, then zero rows up to the padding; the scale is the cast's.
TEST(Float8Cast, ColumnMajorAndPaddedLayoutsHoldTheSameBytes) {
  torch::manual_seed(4);
  const auto t = torch::randn({21, 48}) * 5;
  const auto want = to_float8(t, at::kFloat8_e5m2);
  for (int64_t pad : {1, 16}) {
    const auto c = ops::detail::cast_to_float8(t, at::kFloat8_e5m2, {}, true, true, pad);
    const int64_t padded = pad == 1 ? 21 : 32;
    EXPECT_TRUE(c.scale.equal(want.scale));
    EXPECT_TRUE(c.row.view(at::kByte).equal(want.data.view(at::kByte)));
    ASSERT_EQ(c.col.sizes(), (std::vector<int64_t>{padded, 48}));
    EXPECT_EQ(c.col.stride(0), 1);  // column-major
    EXPECT_EQ(c.col.stride(1), padded);
    const auto bytes = c.col.contiguous().view(at::kByte);
    EXPECT_TRUE(bytes.narrow(0, 0, 21).equal(want.data.view(at::kByte)));
    EXPECT_EQ(bytes.narrow(0, 21, padded - 21).count_nonzero().item<int64_t>(), 0);
  }
  // With a given scale, and the column-major layout alone.
  const auto scale = torch::full({1}, 2.5f);
  const auto c = ops::detail::cast_to_float8(t, at::kFloat8_e4m3fn, scale, false, true);
  EXPECT_FALSE(c.row.defined());
  EXPECT_TRUE(c.col.contiguous().view(at::kByte).equal(
      to_float8(t, at::kFloat8_e4m3fn, scale).data.view(at::kByte)));
  EXPECT_THROW(
      ops::detail::cast_to_float8(torch::randn({2, 3, 4}), at::kFloat8_e4m3fn, {}, false, true),
      InvalidArgument);
  EXPECT_THROW(
      ops::detail::cast_to_float8(torch::randn({0, 16}), at::kFloat8_e4m3fn, {}, true, true),
      InvalidArgument);
  // Neither layout asked for: a caller's mistake, named (the kernel would leave the scale unset).
  EXPECT_THROW(ops::detail::cast_to_float8(t, at::kFloat8_e4m3fn, {}, false, false),
               InvalidArgument);
}

// The CPU runs float8 GEMMs of both recipes (ATen's _scaled_mm; rowwise as torchao's
// emulation): nothing to say. A device neither the CPU nor CUDA is named.
TEST(Float8Mm, TheCpuRunsItAndOtherDevicesAreNamed) {
  for (auto scaling : {ops::Float8Scaling::tensorwise, ops::Float8Scaling::rowwise}) {
    EXPECT_EQ(ops::float8_unsupported_on(at::Device(at::kCPU), scaling), "");
  }
  EXPECT_EQ(ops::float8_unsupported_on(at::Device(at::kMeta)),
            "float8 GEMMs run on the CPU and on CUDA GPUs, not on meta");
}

TEST(Float8Mm, EqualsTheFloat32ProductOfTheDequantizedOperandsInEveryLayout) {
  torch::manual_seed(3);
  const auto a = to_float8(torch::randn({48, 64}), at::kFloat8_e4m3fn);
  const auto b = to_float8(torch::randn({64, 32}) * 0.1, at::kFloat8_e4m3fn);
  const auto want = at::mm(dequantize(a), dequantize(b));
  for (bool a_t : {false, true}) {
    for (bool b_t : {false, true}) {
      Float8Tensor aa{a_t ? a.data.t().contiguous().t() : a.data, a.scale};
      Float8Tensor bb{b_t ? b.data.t().contiguous().t() : b.data, b.scale};
      const auto got = ops::float8_mm(aa, bb, at::kFloat);
      EXPECT_EQ(got.scalar_type(), at::kFloat);
      EXPECT_LT(rel_diff(got, want), 1e-6) << a_t << b_t;
    }
  }
  const auto e5 = to_float8(torch::randn({48, 64}), at::kFloat8_e5m2);
  EXPECT_LT(rel_diff(ops::float8_mm(e5, b, at::kFloat), at::mm(dequantize(e5), dequantize(b))),
            1e-6);
  EXPECT_EQ(ops::float8_mm(a, b, at::kBFloat16).scalar_type(), at::kBFloat16);
  EXPECT_THROW(ops::float8_mm(a, a, at::kFloat), InvalidArgument);
}

struct LinearCase {
  at::Tensor x, weight, bias, dy;
};

LinearCase make_linear(at::ScalarType dtype) {
  torch::manual_seed(4);
  LinearCase c;
  c.x = (torch::randn({2, 24, 64}) * 2).to(dtype).requires_grad_();
  c.weight = (torch::randn({96, 64}) * 0.05).to(dtype).requires_grad_();
  c.bias = (torch::randn({96}) * 0.1).to(dtype).requires_grad_();
  c.dy = (torch::randn({2, 24, 96}) * 1e-3).to(dtype);
  return c;
}

// The three GEMMs built by hand from the casts: what float8_linear must compute.
struct Expected {
  at::Tensor y, dx, dw, db;
};

Expected by_hand(const LinearCase& c) {
  const auto dtype = c.x.scalar_type();
  const auto x = c.x.detach().reshape({-1, 64});
  const auto w = c.weight.detach();
  const auto dy = c.dy.reshape({-1, 96});
  const auto x8 = to_float8(x, at::kFloat8_e4m3fn), w8 = to_float8(w, at::kFloat8_e4m3fn);
  const auto dy8 = to_float8(dy, at::kFloat8_e5m2);
  Expected e;
  e.y =
      (at::mm(dequantize(x8), dequantize(w8).t()).to(dtype) + c.bias.detach()).reshape({2, 24, 96});
  e.dx = at::mm(dequantize(dy8), dequantize(w8)).to(dtype).reshape({2, 24, 64});
  e.dw = at::mm(dequantize(dy8).t(), dequantize(x8)).to(dtype);
  e.db = dy.to(at::kFloat).sum(0);
  return e;
}

TEST(Float8Linear, OutputAndGradientsAreTheFloat8Gemms) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    auto c = make_linear(dtype);
    const auto want = by_hand(c);
    auto y = ops::float8_linear(c.x, c.weight, c.bias);
    EXPECT_EQ(y.scalar_type(), dtype);
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 24, 96}));
    y.backward(c.dy);
    // fp32: the same products summed in another order; bf16: one rounding of the output.
    const double tol = dtype == at::kFloat ? 1e-6 : 1e-2;
    EXPECT_LT(rel_diff(y, want.y), tol) << c10::toString(dtype);
    EXPECT_LT(rel_diff(c.x.grad(), want.dx), tol);
    EXPECT_LT(rel_diff(c.weight.grad(), want.dw), tol);
    EXPECT_LT(rel_diff(c.bias.grad(), want.db), tol);
    EXPECT_EQ(c.weight.grad().scalar_type(), dtype);
    // And float8 is only a rounding of the high-precision linear: a few percent, not more.
    const auto exact = at::linear(c.x.detach().to(at::kFloat), c.weight.detach().to(at::kFloat),
                                  c.bias.detach().to(at::kFloat));
    const double r = rel_diff(y, exact);
    EXPECT_GT(r, 0.0);
    EXPECT_LT(r, 0.08);
  }
}

// torchao's rowwise recipe by hand: each GEMM's operands cast along its inner dimension (e4m3,
// power-of-2 scales), the dequantized operands multiplied (torchao's emulation on the CPU).
Expected rowwise_by_hand(const LinearCase& c) {
  const auto dtype = c.x.scalar_type();
  const auto x = c.x.detach().reshape({-1, 64});
  const auto w = c.weight.detach();
  const auto dy = c.dy.reshape({-1, 96});
  auto dq = [](const at::Tensor& t, int64_t dim) {
    return dequantize(ops::to_float8_rowwise(t, at::kFloat8_e4m3fn, dim));
  };
  Expected e;
  e.y = (at::mm(dq(x, 1), dq(w, 1).t()).to(dtype) + c.bias.detach()).reshape({2, 24, 96});
  e.dx = at::mm(dq(dy, 1), dq(w, 0)).to(dtype).reshape({2, 24, 64});
  e.dw = at::mm(dq(dy, 0).t(), dq(x, 0)).to(dtype);
  e.db = dy.to(at::kFloat).sum(0);
  return e;
}

TEST(Float8Cast, RowwiseScalesArePowersOfTwoPerRowOrColumn) {
  torch::manual_seed(5);
  // Rows of very different magnitudes, one all zero.
  auto t = torch::randn({6, 32}) * torch::tensor({1e-3, 0.5, 3.0, 40.0, 1e3, 0.0}).unsqueeze(1);
  for (int64_t dim : {1, 0}) {
    const auto c = ops::to_float8_rowwise(t, at::kFloat8_e4m3fn, dim);
    ASSERT_EQ(c.scale.sizes(),
              (dim == 1 ? std::vector<int64_t>{6, 1} : std::vector<int64_t>{1, 32}));
    EXPECT_EQ(c.scale.scalar_type(), at::kFloat);
    // A power of 2, the largest one that keeps the slice's largest magnitude within 448 (the
    // zero row: 448 / 1e-12 rounded down).
    const auto amax = t.abs().amax({dim}, true).clamp_min(1e-12).to(at::kDouble);
    const auto s = c.scale.to(at::kDouble);
    EXPECT_TRUE(at::exp2(at::log2(s).round()).equal(s)) << dim;
    EXPECT_TRUE((amax * s <= 448).all().item<bool>()) << dim;
    EXPECT_TRUE((amax * s * 2 > 448).all().item<bool>()) << dim;
    // The data: the scaled values rounded to e4m3.
    const auto want = (t * c.scale).clamp(-448, 448).to(at::kFloat8_e4m3fn);
    EXPECT_TRUE(c.data.view(at::kByte).equal(want.view(at::kByte))) << dim;
  }
  EXPECT_THROW(ops::to_float8_rowwise(torch::randn({2, 3, 4}), at::kFloat8_e4m3fn, 1),
               InvalidArgument);
  EXPECT_THROW(ops::to_float8_rowwise(t, at::kFloat8_e4m3fn, 2), InvalidArgument);
}

TEST(Float8Mm, RowwiseScalesEqualTheDequantizedProduct) {
  torch::manual_seed(6);
  const auto a = ops::to_float8_rowwise(torch::randn({24, 64}), at::kFloat8_e4m3fn, 1);
  const auto b = ops::to_float8_rowwise(torch::randn({32, 64}), at::kFloat8_e4m3fn, 1);
  const auto got = ops::float8_mm(a, {b.data.t(), b.scale.t()}, at::kFloat);
  EXPECT_TRUE(got.equal(at::mm(dequantize(a), dequantize(b).t())));
  // One operand's scale of the wrong shape is refused, naming the shapes it takes.
  EXPECT_THROW(ops::float8_mm(a, {b.data.t(), b.scale}, at::kFloat), InvalidArgument);
}

TEST(Float8Linear, RowwiseOutputAndGradientsAreTorchaosRowwiseGemms) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    auto c = make_linear(dtype);
    const auto want = rowwise_by_hand(c);
    auto y = ops::float8_linear(c.x, c.weight, c.bias, {}, ops::Float8Scaling::rowwise);
    y.backward(c.dy);
    EXPECT_TRUE(y.equal(want.y)) << c10::toString(dtype);
    EXPECT_TRUE(c.x.grad().equal(want.dx)) << c10::toString(dtype);
    EXPECT_TRUE(c.weight.grad().equal(want.dw)) << c10::toString(dtype);
    EXPECT_LT(rel_diff(c.bias.grad(), want.db), dtype == at::kFloat ? 1e-6 : 1e-2);
  }
  // Where tokens differ in magnitude, rowwise keeps the small ones that tensorwise flushes
  // towards zero: its output is far closer to the high-precision linear's.
  torch::manual_seed(7);
  const auto x = torch::randn({64, 64}) * at::pow(10.0, torch::linspace(-4, 2, 64)).unsqueeze(1);
  const auto w = torch::randn({32, 64}) * 0.1;
  const auto exact = at::linear(x, w, {});
  const auto rowwise = ops::float8_linear(x, w, {}, {}, ops::Float8Scaling::rowwise);
  const auto tensorwise = ops::float8_linear(x, w, {});
  auto worst_row = [&](const at::Tensor& y) {  // the worst token's relative error
    return ((y - exact).abs().amax(1) / exact.abs().amax(1)).max().item<double>();
  };
  EXPECT_LT(worst_row(rowwise), 0.1);
  EXPECT_GT(worst_row(tensorwise), 10 * worst_row(rowwise));
  auto c = make_linear(at::kFloat);
  EXPECT_THROW(
      ops::float8_linear(c.x, c.weight, c.bias, torch::ones({}), ops::Float8Scaling::rowwise),
      InvalidArgument);
}

TEST(Float8Linear, AFrozenWeightGetsNoGradientAndNoBiasIsFine) {
  auto c = make_linear(at::kFloat);
  c.weight.requires_grad_(false);
  auto y = ops::float8_linear(c.x, c.weight, at::Tensor());
  y.backward(c.dy);
  EXPECT_FALSE(c.weight.grad().defined());
  EXPECT_LT(rel_diff(c.x.grad(), by_hand(c).dx), 1e-6);
}

// The backward keeps x's float8 cast (1 byte an element), not x: x here is an activation (a
// non-leaf that needs a gradient; its clone's backward keeps nothing), so once the caller drops
// it, its storage is freed while the graph lives, and the gradients are still the float8
// GEMMs'. The same with a frozen weight (then nothing of x is kept at all). Before, the graph
// held x itself.
TEST(Float8Linear, KeepsXsFloat8CastForTheBackwardNotX) {
  for (bool frozen : {false, true}) {
    auto c = make_linear(at::kBFloat16);
    c.weight.requires_grad_(!frozen);
    const auto want = by_hand(c);
    auto leaf = c.x.detach().clone().requires_grad_();
    auto x = leaf.clone();
    auto y = ops::float8_linear(x, c.weight, c.bias);
    const auto storage = x.storage().getWeakStorageImpl();
    x = at::Tensor();
    EXPECT_TRUE(storage.expired()) << (frozen ? "frozen" : "trained") << " weight";
    y.backward(c.dy);
    EXPECT_LT(rel_diff(y, want.y), 1e-2);
    EXPECT_LT(rel_diff(leaf.grad(), want.dx), 1e-2);
    if (!frozen) {
      EXPECT_LT(rel_diff(c.weight.grad(), want.dw), 1e-2);
    }
  }
}

TEST(Float8Linear, RefusesShapesAndDtypesItCannotRun) {
  EXPECT_THROW(ops::float8_linear(torch::randn({4, 24}), torch::randn({32, 24}), {}),
               InvalidArgument);  // 24 inputs: not a multiple of 16
  EXPECT_THROW(ops::float8_linear(torch::randn({4, 32}), torch::randn({40, 32}), {}),
               InvalidArgument);  // 40 outputs
  EXPECT_THROW(ops::float8_linear(torch::randn({4, 32}), torch::randn({32, 16}), {}),
               InvalidArgument);  // in 32 against the weight's 16
  EXPECT_THROW(
      ops::float8_linear(torch::randn({4, 32}), torch::randn({32, 32}).to(at::kBFloat16), {}),
      InvalidArgument);
  EXPECT_THROW(ops::float8_linear(torch::randn({4, 32}), torch::randn({32, 32}), torch::randn({8})),
               InvalidArgument);
  EXPECT_TRUE(ops::float8_linear_unsupported(2048, 512).empty());
  EXPECT_NE(ops::float8_linear_unsupported(1001, 64).find("1001"), std::string::npos);
}

}  // namespace
}  // namespace fsdp::testing
