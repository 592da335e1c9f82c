// The CUDA kernels of fsdp/ops/fused.h against their ATen twins on the GPU: RMSNorm and SwiGLU,
// forward and backward, fp32 (to float rounding) and bf16 (within a few of bf16's rounding
// steps), over row lengths that do not divide by the block (3, 1000, 2048) and one wider than
// the backward's shared memory (16384), more rows than the backward's blocks, a frozen weight,
// and more elements than one pass of SwiGLU's grid; the residual add fused with RMSNorm; the
// rotary embedding against apply_rotary_pos_emb (bit for bit). The float8 cast's kernels
// (ops/cuda/float8_kernels.h) give the ATen cast's bytes and scale exactly, in every layout.
// Skips without a GPU, fails under FSDP_REQUIRE_GPU=1, where the kernels must also be built.
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "fsdp/errors.h"
#include "fsdp/ops/float8.h"
#include "fsdp/ops/fused.h"
#include "fsdp/tools/memory.h"
#include "ops/float8_cast.h"
#include "ops/fused_reference.h"
#include "support/gpu.h"
#include "support/tensor_compare.h"
#include "support/torch_api.h"

namespace fsdp::testing::fused_cuda_test {
namespace {

// `values` copied to a contiguous tensor of `opts`, starting one element into its storage when
// `offset` (then off a 16-byte boundary: the kernels' single-element paths).
at::Tensor stored(const at::Tensor& values, const at::TensorOptions& opts, bool offset) {
  const int64_t n = values.numel(), skip = offset ? 1 : 0;
  auto t = at::empty({n + skip}, opts).narrow(0, skip, n).view(values.sizes());
  t.copy_(values);
  return t;
}

TEST(FusedCuda, KernelsAreBuiltForTheGpuCheck) {
  FSDP_SKIP_WITHOUT_GPU();
  if (gpu_required()) {
    EXPECT_TRUE(ops::cuda_kernels_built());
  }
  if (!ops::cuda_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
}

// float8_unsupported_on says of this GPU what torch._scaled_mm does, for each recipe: empty where
// a float8 GEMM runs (one scale each, or rowwise scales [m, 1] and [1, n]), a message naming the
// device and its compute capability where it throws; float8_mm then refuses with that message.
TEST(FusedCuda, Float8UnsupportedOnAgreesWithScaledMm) {
  FSDP_SKIP_WITHOUT_GPU();
  const auto o = at::TensorOptions().device(at::kCUDA);
  const auto a = at::ones({16, 32}, o).to(at::kFloat8_e4m3fn);
  const auto b = at::ones({16, 32}, o).to(at::kFloat8_e4m3fn).t();  // column-major [32, 16]
  for (auto scaling : {ops::Float8Scaling::tensorwise, ops::Float8Scaling::rowwise}) {
    const bool rowwise = scaling == ops::Float8Scaling::rowwise;
    const auto sa = rowwise ? at::ones({16, 1}, o) : at::ones({}, o);
    const auto sb = rowwise ? at::ones({1, 16}, o) : at::ones({}, o);
    bool runs = true;
    try {
      at::_scaled_mm(a, b, sa, sb, std::nullopt, std::nullopt, at::kBFloat16);
    } catch (const c10::Error&) {
      runs = false;
    }
    const auto why = ops::float8_unsupported_on(a.device(), scaling);
    EXPECT_EQ(why.empty(), runs) << "rowwise " << rowwise << ": " << why;
    if (!runs) {
      EXPECT_NE(why.find("compute capability"), std::string::npos) << why;
      EXPECT_THROW(ops::float8_mm({a, sa}, {b, sb}, at::kBFloat16), UnsupportedError);
    }
  }
}

// The device memory `f` allocates at its peak beyond what was allocated before it.
int64_t peak_rise(const std::function<void()>& f) {
  const int device = c10::cuda::current_device();
  cuda_reset_peak_allocated_bytes(device);
  const int64_t before = cuda_peak_allocated_bytes(device);
  f();
  return cuda_peak_allocated_bytes(device) - before;
}

TEST(FusedCuda, RmsNormEqualsLlamasFormula) {
  FSDP_SKIP_WITHOUT_GPU();
  // Rows of 3, 1000, 1001 (single elements: no 16-byte packs) and 2048, and of 1000 stored one
  // element off a 16-byte boundary (single elements); 51 rows (a block each) and 1200 (several
  // per block of the backward's 512, whose blocks then sum their weight-gradient parts); rows
  // of 12032, the widest whose parts a block keeps in shared memory, and of 12033 and 16384,
  // whose parts add up in global memory (single elements and packs).
  struct Case {
    int64_t rows, d;
    bool offset = false;
  };
  const std::vector<Case> cases{{51, 3},      {51, 1000},   {51, 1000, true},
                                {51, 1001},   {51, 2048},   {1200, 2048},
                                {600, 12032}, {600, 12033}, {600, 16384}};
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (const auto& [rows, d, offset] : cases) {
      const auto where = ::testing::Message() << c10::toString(dtype) << " rows " << rows << " d "
                                              << d << " offset " << offset;
      torch::manual_seed(5);
      const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
      const auto make = [&](const at::Tensor& values) { return stored(values, opts, offset); };
      auto x = make(torch::randn({rows, d}) * 3);
      auto w = (torch::rand({d}) + 0.5).to(opts);
      auto dy = make(torch::randn({rows, d}));
      auto xa = x.detach().requires_grad_(), wa = w.clone().requires_grad_();
      auto xb = x.clone().requires_grad_(), wb = w.clone().requires_grad_();
      auto ya = ops::rms_norm(xa, wa, 1e-5);
      auto yb = rms_norm_reference(xb, wb, 1e-5);
      const int64_t trained = peak_rise([&] { ya.backward(dy); });
      yb.backward(dy);
      const auto tol = tolerance(dtype);
      EXPECT_EQ(ya.scalar_type(), dtype);
      EXPECT_LT(rel_diff(ya, yb), tol) << where;
      EXPECT_LT(rel_diff(xa.grad(), xb.grad()), tol) << where;
      EXPECT_LT(rel_diff(wa.grad(), wb.grad()), tol) << where;
      // A frozen weight (LoRA's norms): x's gradient the same, and no weight gradient made: the
      // backward allocates neither its workspace (a float per column for each of up to 512
      // blocks) nor the gradient.
      auto xf = x.detach().requires_grad_();
      auto yf = ops::rms_norm(xf, w, 1e-5);
      const int64_t frozen = peak_rise([&] { yf.backward(dy); });
      EXPECT_TRUE(xf.grad().equal(xa.grad())) << where;
      EXPECT_GE(trained - frozen, std::min<int64_t>(rows, 512) * d * 4) << where;
    }
  }
}

// The residual add fused with the norm after it, h used again after (as the layer's second
// residual): h bit for bit (one rounded add), the norm and the gradients of x, y and the weight
// as RMSNorm's. Also with the norm's output alone used (h gets no other gradient), and rows of
// 1001 (single elements, no 16-byte packs).
TEST(FusedCuda, AddRmsNormEqualsTheAddThenTheNorm) {
  FSDP_SKIP_WITHOUT_GPU();
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (auto [h_used, d] : {std::pair{true, int64_t{1000}}, std::pair{false, int64_t{1000}},
                             std::pair{true, int64_t{1001}}}) {
      torch::manual_seed(11);
      const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
      auto x = (torch::randn({3, 67, d}) * 2).to(opts), y = torch::randn({3, 67, d}).to(opts);
      auto w = (torch::rand({d}) + 0.5).to(opts);
      auto gh = torch::randn({3, 67, d}).to(opts), gn = torch::randn({3, 67, d}).to(opts);
      auto xa = x.clone().requires_grad_(), ya = y.clone().requires_grad_(),
           wa = w.clone().requires_grad_();
      auto xb = x.clone().requires_grad_(), yb = y.clone().requires_grad_(),
           wb = w.clone().requires_grad_();
      const auto loss = [&, h_used = h_used](const at::Tensor& h, const at::Tensor& n) {
        return h_used ? (h * gh).sum() + (n * gn).sum() : (n * gn).sum();
      };
      auto [ha, na] = ops::add_rms_norm(xa, ya, wa, 1e-5);
      auto hb = xb + yb;
      auto nb = rms_norm_reference(hb, wb, 1e-5);
      const int64_t trained = peak_rise([&] { loss(ha, na).backward(); });
      loss(hb, nb).backward();
      const auto where = ::testing::Message()
                         << c10::toString(dtype) << " h used " << h_used << " d " << d;
      const auto tol = tolerance(dtype);
      EXPECT_TRUE(ha.equal(hb)) << where;
      EXPECT_LT(rel_diff(na, nb), tol) << where;
      EXPECT_LT(rel_diff(xa.grad(), xb.grad()), tol) << where;
      EXPECT_LT(rel_diff(ya.grad(), yb.grad()), tol) << where;
      EXPECT_LT(rel_diff(wa.grad(), wb.grad()), tol) << where;
      // The weight frozen: x's and y's gradients as before, and no weight gradient made (nor
      // the backward's workspace: a float per column for each of its blocks, one per row here).
      auto xf = x.clone().requires_grad_(), yf = y.clone().requires_grad_();
      auto [hf, nf] = ops::add_rms_norm(xf, yf, w, 1e-5);
      const int64_t frozen = peak_rise([&] { loss(hf, nf).backward(); });
      EXPECT_TRUE(xf.grad().equal(xa.grad())) << where;
      EXPECT_TRUE(yf.grad().equal(ya.grad())) << where;
      EXPECT_GE(trained - frozen, 3 * 67 * d * 4) << where;
    }
  }
}

TEST(FusedCuda, SwigluEqualsSiluTimesUp) {
  FSDP_SKIP_WITHOUT_GPU();
  // 33 x 512 x 1025 elements: 16-byte packs. 33 x 511 x 1025 (odd) and the same starting one
  // element in (not on a 16-byte boundary): single elements, over 17.2M of them, more than the
  // grid's 65535 blocks of 256 cover in one pass.
  struct Case {
    std::vector<int64_t> shape;
    bool offset;
  };
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& c : {Case{{33, 512, 1025}, false}, Case{{33, 511, 1025}, false},
                          Case{{33, 512, 1025}, true}}) {
      torch::manual_seed(6);
      const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
      const auto make = [&](const at::Tensor& values) { return stored(values, opts, c.offset); };
      auto gate = make(torch::randn(c.shape) * 4), up = make(torch::randn(c.shape));
      auto dout = make(torch::randn(c.shape));
      auto ga = gate.detach().requires_grad_(), ua = up.detach().requires_grad_();
      auto gb = gate.clone().requires_grad_(), ub = up.clone().requires_grad_();
      auto oa = ops::swiglu(ga, ua);
      auto ob = at::silu(gb) * ub;
      oa.backward(dout);
      ob.backward(dout);
      const auto where = ::testing::Message()
                         << c10::toString(dtype) << " " << c10::IntArrayRef(c.shape) << " offset "
                         << c.offset;
      const auto tol = tolerance(dtype);
      EXPECT_LT(rel_diff(oa, ob), tol) << where;
      EXPECT_LT(rel_diff(ga.grad(), gb.grad()), tol) << where;
      EXPECT_LT(rel_diff(ua.grad(), ub.grad()), tol) << where;
    }
  }
}

// transformers' apply_rotary_pos_emb, written out.
at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const auto rotated = torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

// The kernels round where the formula's ops round (each product, then the sum; autograd's
// gradient sum likewise), so float32 and bf16 are bit for bit. Heads-first views of a
// [batch, seq, heads, d] projection (the model's), positions shared and per sequence, a
// contiguous heads-first x, and more pairs than one pass of the grid.
TEST(FusedCuda, RopeEqualsApplyRotaryPosEmb) {
  FSDP_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t batch, seq, heads, d, cos_batch;
    bool heads_first_memory;
  };
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& c : std::vector<Case>{{2, 7, 3, 8, 1, false},
                                           {2, 7, 3, 64, 2, false},
                                           {1, 1, 4, 128, 1, false},
                                           {3, 5, 2, 16, 3, true},
                                           {8, 2048, 32, 64, 1, false}}) {
      torch::manual_seed(7);
      const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
      auto x = c.heads_first_memory
                   ? torch::randn({c.batch, c.heads, c.seq, c.d}).to(opts)
                   : torch::randn({c.batch, c.seq, c.heads, c.d}).to(opts).transpose(1, 2);
      auto cos = torch::randn({c.cos_batch, c.seq, c.d}).to(opts);
      auto sin = torch::randn({c.cos_batch, c.seq, c.d}).to(opts);
      auto dy = torch::randn({c.batch, c.heads, c.seq, c.d}).to(opts);
      auto xa = x.detach().clone().requires_grad_(), xb = x.detach().clone().requires_grad_();
      auto ya = ops::rope(xa, cos, sin), yb = rope_reference(xb, cos, sin);
      ya.backward(dy);
      yb.backward(dy);
      const auto where = ::testing::Message()
                         << c10::toString(dtype) << " batch " << c.batch << " seq " << c.seq
                         << " heads " << c.heads << " d " << c.d << " cos_batch " << c.cos_batch;
      ASSERT_EQ(ya.sizes(), yb.sizes()) << where;
      EXPECT_TRUE(ya.equal(yb)) << where << " " << rel_diff(ya, yb);
      EXPECT_TRUE(xa.grad().equal(xb.grad())) << where << " " << rel_diff(xa.grad(), xb.grad());
    }
  }
}

// torchao's cast written in ATen ops on the GPU (what the library ran before its kernels).
// With `scale` undefined, t's own.
ops::Float8Tensor aten_float8(const at::Tensor& t, at::ScalarType dtype, at::Tensor scale = {}) {
  const double max = dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0;
  if (!scale.defined()) scale = ops::float8_scale(t.abs().max(), dtype);
  return {(t.to(at::kFloat) * scale).clamp(-max, max).to(dtype), scale};
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  return a.contiguous().view(at::kByte).equal(b.contiguous().view(at::kByte));
}

TEST(FusedCuda, Float8CastKernelsGiveTheAtenCastsBytes) {
  FSDP_SKIP_WITHOUT_GPU();
  if (!ops::cuda_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  // Shapes off the 32 x 32 tile, and 2.1M rows: more tiles down than the grid's 65535 (a
  // block then casts several).
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (auto f8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (auto [m, k] : std::vector<std::pair<int64_t, int64_t>>{
               {21, 48}, {1, 16}, {1000, 2048}, {4099, 33}, {2100000, 16}}) {
        torch::manual_seed(9);
        // Magnitudes over many binades, so that subnormals, rounding ties and saturation occur.
        auto t = (torch::randn({m, k}) * torch::exp(torch::randn({m, k}) * 4))
                     .to(at::TensorOptions().device(at::kCUDA).dtype(dtype));
        const auto want = aten_float8(t, f8);
        const auto got = ops::to_float8(t, f8);
        const auto where = ::testing::Message() << c10::toString(dtype) << " " << c10::toString(f8)
                                                << " [" << m << ", " << k << "]";
        EXPECT_TRUE(got.scale.equal(want.scale)) << where;
        EXPECT_TRUE(same_bytes(got.data, want.data)) << where;
        // Both layouts in one pass, the column-major one padded to 16 rows.
        const auto both = ops::detail::cast_to_float8(t, f8, {}, true, true, 16);
        const int64_t padded = (m + 15) / 16 * 16;
        EXPECT_TRUE(same_bytes(both.row, want.data)) << where;
        ASSERT_EQ(both.col.sizes(), (std::vector<int64_t>{padded, k})) << where;
        EXPECT_EQ(both.col.stride(0), 1) << where;
        EXPECT_TRUE(same_bytes(both.col.narrow(0, 0, m), want.data)) << where;
        EXPECT_EQ(both.col.narrow(0, m, padded - m).view(at::kByte).count_nonzero().item<int64_t>(),
                  0)
            << where;
        // A given scale (the float8 all-gather's) 4 times the tensor's own, so that the largest
        // values saturate, on the transposed layout alone.
        const auto given = want.scale * 4;
        const auto col = ops::detail::cast_to_float8(t, f8, given, false, true);
        EXPECT_FALSE(col.row.defined()) << where;
        EXPECT_TRUE(same_bytes(col.col, aten_float8(t, f8, given).data)) << where;
      }
    }
  }
}

// The rowwise recipe's axiswise cast (a scale per row or per column, powers of 2): the kernels'
// scales and bytes against torchao's ATen ops on the same GPU, both axes (and their negative
// names), both formats, float, bf16 and half, shapes off the block and the column runs, more
// rows than the row kernel's grid and than the column kernel's (4.2M), an all-zero row and
// column, a transposed input, amaxes a few ulps around 448 / 2^k (where the power-of-2 rounding
// turns); a NaN makes its row's (or column's) scale and elements NaN and leaves the rest.
TEST(FusedCuda, Float8RowwiseCastKernelsGiveTheAtenCastsBytes) {
  FSDP_SKIP_WITHOUT_GPU();
  if (!ops::cuda_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  auto aten_rowwise = [](const at::Tensor& t, at::ScalarType f8, int64_t dim) {
    auto scale = ops::float8_scale(t.abs().amax({dim}, true), f8);
    scale = at::exp2(at::floor(at::log2(scale)));
    const double max = f8 == at::kFloat8_e4m3fn ? 448.0 : 57344.0;
    return ops::Float8Tensor{(t.to(at::kFloat) * scale).clamp(-max, max).to(f8), scale};
  };
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (auto f8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (auto [m, k] : std::vector<std::pair<int64_t, int64_t>>{
               {1, 16}, {21, 48}, {129, 1000}, {1000, 2048}, {70000, 16}, {4200001, 3}}) {
        if (m > 100000 && (dtype != at::kFloat || f8 != at::kFloat8_e4m3fn)) continue;
        torch::manual_seed(12);
        // half's range is narrower: magnitudes over fewer binades there.
        const double spread = dtype == at::kHalf ? 1.5 : 4;
        auto t = (torch::randn({m, k}) * torch::exp(torch::randn({m, k}) * spread))
                     .to(at::TensorOptions().device(at::kCUDA).dtype(dtype));
        if (m > 3) t[2].zero_();                     // an all-zero row: the scale of amax 1e-12
        if (m > 3 && k > 3) t.select(1, 1).zero_();  // and an all-zero column
        if (m >= 21 && k >= 16 && dtype == at::kFloat) {
          // Row r's amax a few ulps around 448 / 2^r: its scale sits at a power of 2.
          for (int64_t r = 3; r < 16; ++r) {
            const float edge = 448.0f / static_cast<float>(1 << (r - 3));
            const float v = std::nextafter(edge, r % 3 == 0 ? 0.0f : (r % 3 == 1 ? 1e9f : edge));
            t[r].clamp_(-edge / 2, edge / 2);
            t[r][0] = v;
          }
        }
        for (int64_t dim : {1, 0, -1, -2}) {
          const auto want = aten_rowwise(t, f8, dim);
          const auto got = ops::to_float8_rowwise(t, f8, dim);
          const auto where = ::testing::Message()
                             << c10::toString(dtype) << " " << c10::toString(f8) << " [" << m
                             << ", " << k << "] dim " << dim;
          ASSERT_EQ(got.scale.sizes(), want.scale.sizes()) << where;
          EXPECT_TRUE(got.scale.equal(want.scale)) << where;
          EXPECT_TRUE(same_bytes(got.data, want.data)) << where;
        }
        if (m == 129) {  // a transposed (column-major) input
          const auto tt = t.t();
          const auto got = ops::to_float8_rowwise(tt, f8, 1);
          EXPECT_TRUE(got.scale.equal(aten_rowwise(tt, f8, 1).scale)) << "transposed";
          EXPECT_TRUE(same_bytes(got.data, aten_rowwise(tt, f8, 1).data)) << "transposed";
        }
      }
    }
  }
  auto t = torch::randn({40, 64}, at::TensorOptions().device(at::kCUDA));
  t[5][7] = std::numeric_limits<float>::quiet_NaN();
  for (int64_t dim : {1, 0}) {
    const auto got = ops::to_float8_rowwise(t, at::kFloat8_e4m3fn, dim);
    const auto want = aten_rowwise(t, at::kFloat8_e4m3fn, dim);
    EXPECT_TRUE(got.scale.isnan().equal(want.scale.isnan())) << dim;
    EXPECT_EQ(got.scale.isnan().sum().item<int64_t>(), 1) << dim;
    const auto got_nan = got.data.to(at::kFloat).isnan(),
               want_nan = want.data.to(at::kFloat).isnan();
    EXPECT_TRUE(got_nan.equal(want_nan)) << dim;
    EXPECT_EQ(got_nan.sum().item<int64_t>(), dim == 1 ? 64 : 40) << dim;  // row 5 or column 7
    EXPECT_TRUE(got.data.view(at::kByte)
                    .masked_fill(got_nan, 0)
                    .equal(want.data.view(at::kByte).masked_fill(want_nan, 0)))
        << dim;
  }
}

TEST(FusedCuda, Float8AmaxKernelIsAtensAndKeepsNaN) {
  FSDP_SKIP_WITHOUT_GPU();
  if (!ops::cuda_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  torch::manual_seed(10);
  auto t = torch::randn({3000, 1001}, at::TensorOptions().device(at::kCUDA));
  t[2999][1000] = -77.5;  // a bf16 value too
  EXPECT_EQ(ops::detail::abs_max(t).item<float>(), 77.5f);
  const auto b = t.to(at::kBFloat16);
  EXPECT_EQ(ops::detail::abs_max(b).item<float>(), b.abs().max().to(at::kFloat).item<float>());
  EXPECT_EQ(ops::detail::abs_max(torch::zeros({5}, t.options())).item<float>(), 0.0f);
  t[7][3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(ops::detail::abs_max(t).item<float>()));
  EXPECT_TRUE(std::isnan(ops::to_float8(t, at::kFloat8_e4m3fn).scale.item<float>()));
}

// float8_linear on the GPU (sm_89 or newer: _scaled_mm, the cast kernels) against the CPU's
// (ATen's casts), with 21 tokens: the weight gradient's GEMM runs over the tokens, padded to 32
// for the GPU. Sizes off the cast's 32 x 32 tile; a frozen weight and an input without a
// gradient (the backward then casts the gradient in one layout only).
TEST(FusedCuda, Float8LinearWithTokensNotAMultipleOf16) {
  FSDP_SKIP_WITHOUT_GPU();
  if (at::cuda::getCurrentDeviceProperties()->major < 9) GTEST_SKIP() << "float8 needs sm_89+";
  for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{{64, 48}, {80, 112}}) {
    for (auto [x_grad, w_grad] :
         std::vector<std::pair<bool, bool>>{{true, true}, {true, false}, {false, true}}) {
      torch::manual_seed(8);
      auto x = torch::randn({3, 7, in}), w = torch::randn({out, in}) * 0.1,
           dy = torch::randn({3, 7, out});
      auto xc = x.clone().requires_grad_(x_grad), wc = w.clone().requires_grad_(w_grad);
      auto xg = x.cuda().requires_grad_(x_grad), wg = w.cuda().requires_grad_(w_grad);
      auto yc = ops::float8_linear(xc, wc, {});
      auto yg = ops::float8_linear(xg, wg, {});
      yc.backward(dy);
      yg.backward(dy.cuda());
      const auto where = ::testing::Message() << "in " << in << " out " << out << " x_grad "
                                              << x_grad << " w_grad " << w_grad;
      // The forward's GEMM accumulates fast on the GPU (torchao's setting: Hopper keeps fewer
      // bits in its float8 accumulators), the CPU in float32; the backward's do not.
      EXPECT_LT(rel_diff(yg.cpu(), yc), 1e-3) << where;
      if (x_grad) {
        EXPECT_LT(rel_diff(xg.grad().cpu(), xc.grad()), 1e-5) << where;
      }
      if (w_grad) {
        EXPECT_LT(rel_diff(wg.grad().cpu(), wc.grad()), 1e-5) << where;
      }
    }
  }
}

// The rowwise recipe on the GPU (_scaled_mm's rowwise kernel for the forward, the tensorwise one
// and the scales after it for the backward; bf16 results for float32, as torchao) against the
// CPU's emulation: within bf16's rounding.
TEST(FusedCuda, Float8RowwiseLinearMatchesTheCpusEmulation) {
  FSDP_SKIP_WITHOUT_GPU();
  if (at::cuda::getCurrentDeviceProperties()->major < 9) GTEST_SKIP() << "float8 needs sm_89+";
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    torch::manual_seed(12);
    auto x = torch::randn({3, 7, 64}).to(dtype), w = (torch::randn({48, 64}) * 0.1).to(dtype),
         dy = torch::randn({3, 7, 48}).to(dtype);
    auto xc = x.clone().requires_grad_(), wc = w.clone().requires_grad_();
    auto xg = x.cuda().requires_grad_(), wg = w.cuda().requires_grad_();
    const auto rowwise = ops::Float8Scaling::rowwise;
    auto yc = ops::float8_linear(xc, wc, {}, {}, rowwise);
    auto yg = ops::float8_linear(xg, wg, {}, {}, rowwise);
    yc.backward(dy);
    yg.backward(dy.cuda());
    EXPECT_EQ(yg.scalar_type(), dtype);
    EXPECT_LT(rel_diff(yg.cpu(), yc), 1e-2) << c10::toString(dtype);
    EXPECT_LT(rel_diff(xg.grad().cpu(), xc.grad()), 1e-2) << c10::toString(dtype);
    EXPECT_LT(rel_diff(wg.grad().cpu(), wc.grad()), 1e-2) << c10::toString(dtype);
  }
}

}  // namespace
}  // namespace fsdp::testing::fused_cuda_test
