// The CUDA kernels of src/ops/cuda run on the CPU by the emulator (ops/cuda_emulator/emulator.h)
// against their formulas written in ATen: RMSNorm (and the residual add with it), SwiGLU and the
// rotary embedding forward and backward, the float8 casts, the cross-entropy rows. The same
// cases as the GPU tests (ops/test_fused_cuda.cpp) where they are small enough to emulate: the
// 16-byte and the single-element paths, rows wider than a block and more rows than blocks, the
// weight gradient in shared and in global memory. Each runs in each of the emulator's four
// orders of the threads (two of them with the blocks last to first): the results must be the
// same bits (a kernel that reads another thread's or block's write without a barrier between
// would differ); and in two grids, the launches' own
// and one cut to 2 blocks (so that a block takes several rows: in_each_grid). Every buffer ends
// at a page that faults (guarded), so a read or write past its end stops the test. What only a
// GPU shows (speed, the device's math functions, other out-of-bounds accesses) is
// test_fused_cuda's.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <utility>
#include <vector>

#include "ops/cuda/cross_entropy_kernels.h"
#include "ops/cuda/float8_kernels.h"
#include "ops/cuda/fused_kernels.h"
#include "ops/cuda_emulator/guarded_memory.h"
#include "ops/fused_reference.h"
#include "support/tensor_compare.h"

namespace fsdp::testing::cuda_emulated_test {
namespace {

namespace k = fsdp::ops::cuda;

k::DType kernel_dtype(at::ScalarType t) {
  return t == at::kFloat      ? k::DType::kFloat
         : t == at::kBFloat16 ? k::DType::kBFloat16
                              : k::DType::kHalf;
}

// Every tensor a kernel reads or writes lies in guarded memory (guarded_memory.h): its last byte
// is the last before a page that faults, so that an access past its end stops the test. With
// `offset` it starts off a 16-byte boundary instead (the kernels' single-element paths), one
// element short of the guard page.
at::Tensor guarded(at::IntArrayRef sizes, at::ScalarType dtype, bool offset = false) {
  const int64_t numel = c10::multiply_integers(sizes);
  const size_t item = c10::elementSize(dtype);
  const size_t bytes = (numel + (offset ? 1 : 0)) * item;
  // The start is the end's boundary minus `bytes`: off 16 bytes only if they are not a multiple.
  EXPECT_TRUE(!offset || bytes % 16 != 0) << "no offset for " << numel << " x " << item << " bytes";
  auto memory = cuda_emulator::guarded_alloc(bytes);
  return at::from_blob(
      memory.get(), sizes, [memory](void*) mutable { memory.reset(); },
      at::TensorOptions().dtype(dtype));
}
at::Tensor guarded_like(const at::Tensor& t) { return guarded(t.sizes(), t.scalar_type()); }

// `values` as `dtype` in guarded memory, off a 16-byte boundary when `offset`.
at::Tensor stored(const at::Tensor& values, at::ScalarType dtype, bool offset = false) {
  auto t = guarded(values.sizes(), dtype, offset);
  t.copy_(values);
  return t;
}
at::Tensor stored(const at::Tensor& values) { return stored(values, values.scalar_type()); }

// The kernels' tests. On x86 their sources are built with -mfma (tests/CMakeLists.txt: the
// host fuses a * b + c as the device does), which a processor without FMA cannot run.
class CudaKernelsEmulated : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("fma")) {
      GTEST_SKIP() << "this processor has no FMA instructions, which the emulated kernels use";
    }
#endif
  }
};

// run() with the threads of each block in each of the emulator's orders (the blocks too, in the
// two reversed ones): the tensors it returns must be equal bit for bit. Returns the first
// order's.
std::vector<at::Tensor> in_every_order(const std::function<std::vector<at::Tensor>()>& run) {
  using cuda_emulator::Order;
  cuda_emulator::set_order(Order::in_index_order);
  const auto first = run();
  for (auto order : {Order::reversed, Order::warp_by_warp, Order::warps_reversed}) {
    cuda_emulator::set_order(order);
    const auto other = run();
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_TRUE(first[i].view(at::kByte).equal(other[i].view(at::kByte)))
          << "result " << i << " depends on the order of the threads or blocks (order "
          << static_cast<int>(order) << ")";
    }
  }
  cuda_emulator::set_order(Order::in_index_order);
  return first;
}

// f() in each grid a case runs in: the launches' own, then at most 2 blocks in each dimension a
// kernel strides over, so that one block takes several rows or tiles and the barriers that guard
// a shared buffer's reuse from one to the next run (at the launches' own grids each block gets
// one row at these sizes). Results may differ between the two in rounding (the RMSNorm weight
// gradient sums per block), so each is compared with the formula.
void in_each_grid(const std::function<void(int64_t grid_blocks)>& f) {
  for (int64_t blocks : {int64_t{INT64_MAX}, int64_t{2}}) {
    SCOPED_TRACE(blocks == INT64_MAX ? "the launches' own grid" : "at most 2 blocks a dimension");
    cuda_emulator::Limits limits;
    limits.grid_blocks = blocks;
    cuda_emulator::ScopedLimits scoped(limits);
    const int64_t cut = cuda_emulator::grids_cut();
    f(blocks);
    if (blocks != INT64_MAX) {
      EXPECT_GT(cuda_emulator::grids_cut(), cut) << "no launch's grid was cut to 2 blocks";
    }
  }
}

TEST_F(CudaKernelsEmulated, RmsNormEqualsLlamasFormula) {
  struct Case {
    int64_t rows, d;
    bool offset = false;
  };
  const std::vector<Case> cases{{5, 3},      {5, 1000},  {5, 1000, true}, {5, 1001}, {5, 2048},
                                {1030, 520}, {3, 12032}, {3, 12033},      {2, 16384}};
  in_each_grid([&](int64_t grid_blocks) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (const auto& [rows, d, offset] : cases) {
        // Its backward blocks already take 2-3 rows each at the launch's own grid.
        if (grid_blocks != INT64_MAX && rows > 1000) continue;
        const auto where = ::testing::Message() << c10::toString(dtype) << " rows " << rows << " d "
                                                << d << " offset " << offset;
        at::manual_seed(5);
        const auto x = stored(at::randn({rows, d}) * 3, dtype, offset);
        const auto w = stored(at::rand({d}) + 0.5, dtype);
        const auto dy = stored(at::randn({rows, d}), dtype, offset);
        const auto out = in_every_order([&] {
          auto y = guarded_like(x), dx = guarded_like(x), dx_frozen = guarded_like(x);
          auto rstd = guarded({rows}, at::kFloat), dw = guarded({d}, at::kFloat);
          auto workspace = guarded({k::rms_norm_workspace_floats(rows, d)}, at::kFloat);
          const auto t = kernel_dtype(dtype);
          EXPECT_EQ(k::rms_norm_forward(t, x.data_ptr(), w.data_ptr(), y.data_ptr(),
                                        rstd.data_ptr<float>(), rows, d, 1e-5f, nullptr),
                    cudaSuccess);
          EXPECT_EQ(
              k::rms_norm_backward(t, dy.data_ptr(), x.data_ptr(), w.data_ptr(),
                                   rstd.data_ptr<float>(), dx.data_ptr(), dw.data_ptr<float>(),
                                   workspace.data_ptr<float>(), rows, d, nullptr),
              cudaSuccess);
          EXPECT_EQ(k::rms_norm_backward(t, dy.data_ptr(), x.data_ptr(), w.data_ptr(),
                                         rstd.data_ptr<float>(), dx_frozen.data_ptr(), nullptr,
                                         nullptr, rows, d, nullptr),
                    cudaSuccess);
          return std::vector<at::Tensor>{y, rstd, dx, dw, dx_frozen};
        });
        auto xr = x.detach().clone().requires_grad_(), wr = w.clone().requires_grad_();
        auto yr = rms_norm_reference(xr, wr, 1e-5);
        yr.backward(dy);
        const auto tol = tolerance(dtype);
        EXPECT_LT(rel_diff(out[0], yr), tol) << where;
        EXPECT_LT(rel_diff(out[1], at::rsqrt(x.to(at::kFloat).pow(2).mean(-1) + 1e-5)), 1e-5)
            << where;
        EXPECT_LT(rel_diff(out[2], xr.grad()), tol) << where;
        EXPECT_LT(rel_diff(out[3], wr.grad()), tol) << where;
        EXPECT_TRUE(out[4].equal(out[2])) << where << ": a frozen weight changes x's gradient";
      }
    }
  });
}

// h = cast(x + y) bit for bit (one rounded add), and the norm of h as rms_norm_forward's.
TEST_F(CudaKernelsEmulated, AddRmsNormEqualsTheAddThenTheNorm) {
  in_each_grid([&](int64_t) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t d : {1000, 1001}) {
        const auto where = ::testing::Message() << c10::toString(dtype) << " d " << d;
        at::manual_seed(6);
        const int64_t rows = 7;
        const auto x = stored(at::randn({rows, d}), dtype), y = stored(at::randn({rows, d}), dtype);
        const auto w = stored(at::rand({d}) + 0.5, dtype);
        const auto out = in_every_order([&] {
          auto h = guarded_like(x), o = guarded_like(x), rstd = guarded({rows}, at::kFloat);
          EXPECT_EQ(k::add_rms_norm_forward(kernel_dtype(dtype), x.data_ptr(), y.data_ptr(),
                                            h.data_ptr(), w.data_ptr(), o.data_ptr(),
                                            rstd.data_ptr<float>(), rows, d, 1e-6f, nullptr),
                    cudaSuccess);
          return std::vector<at::Tensor>{h, o};
        });
        EXPECT_TRUE(out[0].equal(x + y)) << where;
        EXPECT_LT(rel_diff(out[1], rms_norm_reference(x + y, w, 1e-6)), tolerance(dtype)) << where;
      }
    }
  });
}

// cast(silu(gate)) * up and its gradients by autograd, over an element count that divides into
// 16-byte packs (4096), one that does not (1001), and views off a 16-byte boundary.
TEST_F(CudaKernelsEmulated, SwigluEqualsSiluTimesUp) {
  in_each_grid([&](int64_t) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (auto [numel, offset] : {std::pair{int64_t{4096}, false}, std::pair{int64_t{1001}, false},
                                   std::pair{int64_t{4096}, true}}) {
        const auto where = ::testing::Message()
                           << c10::toString(dtype) << " numel " << numel << " offset " << offset;
        at::manual_seed(7);
        const auto g = stored(at::randn({numel}) * 3, dtype, offset);
        const auto u = stored(at::randn({numel}), dtype, offset);
        const auto dout = stored(at::randn({numel}), dtype, offset);
        const auto out = in_every_order([&] {
          auto o = guarded_like(g), dg = guarded_like(g), du = guarded_like(g);
          const auto t = kernel_dtype(dtype);
          EXPECT_EQ(k::swiglu_forward(t, g.data_ptr(), u.data_ptr(), o.data_ptr(), numel, nullptr),
                    cudaSuccess);
          EXPECT_EQ(k::swiglu_backward(t, dout.data_ptr(), g.data_ptr(), u.data_ptr(),
                                       dg.data_ptr(), du.data_ptr(), numel, nullptr),
                    cudaSuccess);
          return std::vector<at::Tensor>{o, dg, du};
        });
        auto gr = g.detach().clone().requires_grad_(), ur = u.detach().clone().requires_grad_();
        auto ref = at::silu(gr) * ur;
        ref.backward(dout);
        EXPECT_LT(rel_diff(out[0], ref), tolerance(dtype)) << where;
        EXPECT_LT(rel_diff(out[1], gr.grad()), tolerance(dtype)) << where;
        EXPECT_LT(rel_diff(out[2], ur.grad()), tolerance(dtype)) << where;
      }
    }
  });
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// transformers' apply_rotary_pos_emb on x [batch, seq, heads, d] seen as [batch, heads, seq, d],
// cos and sin [1 or batch, seq, d]: bit for bit, forward and backward (autograd's).
TEST_F(CudaKernelsEmulated, RopeEqualsApplyRotaryPosEmbBitForBit) {
  in_each_grid([&](int64_t grid_blocks) {
    // Also with 64-bit offsets, the kernel's path past 4G elements.
    for (bool wide : {false, true}) {
      SCOPED_TRACE(wide ? "64-bit offsets" : "32-bit offsets");
      cuda_emulator::Limits limits;
      limits.grid_blocks = grid_blocks;
      if (wide) limits.narrow_index = 0;
      cuda_emulator::ScopedLimits scoped(limits);
      for (auto dtype : {at::kFloat, at::kBFloat16}) {
        for (int64_t cos_batch : {1, 2}) {
          const auto where = ::testing::Message()
                             << c10::toString(dtype) << " cos batch " << cos_batch;
          at::manual_seed(8);
          // 1,536 pairs: 6 blocks of 256 threads (2 in the cut grid).
          const int64_t batch = 2, seq = 64, heads = 3, d = 8;
          const auto x = stored(at::randn({batch, seq, heads, d}), dtype);
          const auto cos = stored(at::randn({cos_batch, seq, d}), dtype);
          const auto sin = stored(at::randn({cos_batch, seq, d}), dtype);
          const auto dout = stored(at::randn({batch, seq, heads, d}), dtype);
          const auto out = in_every_order([&] {
            auto o = guarded_like(x), dx = guarded_like(x);
            const auto t = kernel_dtype(dtype);
            EXPECT_EQ(k::rope_forward(t, x.data_ptr(), cos.data_ptr(), sin.data_ptr(), o.data_ptr(),
                                      batch, seq, heads, d, cos_batch, nullptr),
                      cudaSuccess);
            EXPECT_EQ(k::rope_backward(t, dout.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                       dx.data_ptr(), batch, seq, heads, d, cos_batch, nullptr),
                      cudaSuccess);
            return std::vector<at::Tensor>{o, dx};
          });
          auto xr = x.detach().clone().transpose(1, 2).requires_grad_();  // [batch, heads, seq, d]
          const auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);
          auto ref = xr * c + rotate_half(xr) * s;
          ref.backward(dout.transpose(1, 2));
          EXPECT_TRUE(out[0].equal(ref.transpose(1, 2))) << where;
          EXPECT_TRUE(out[1].equal(xr.grad().transpose(1, 2))) << where;
        }
      }
    }
  });
  // An odd last dimension and a cos batch that is neither 1 nor the batch are refused.
  const auto x = at::zeros({3, 1, 1, 4});
  EXPECT_EQ(k::rope_forward(k::DType::kFloat, x.data_ptr(), x.data_ptr(), x.data_ptr(),
                            x.data_ptr(), 1, 1, 1, 3, 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(k::rope_forward(k::DType::kFloat, x.data_ptr(), x.data_ptr(), x.data_ptr(),
                            x.data_ptr(), 3, 1, 1, 4, 2, nullptr),
            cudaErrorInvalidValue);
}

double format_max(k::Float8Format f) { return f == k::Float8Format::kE4M3 ? 448.0 : 57344.0; }

// torchao's scale of an amax (float32 tensor): float32(max * (1 / max(double(amax), 1e-12))).
at::Tensor scale_of(const at::Tensor& amax, k::Float8Format f) {
  return (amax.to(at::kDouble).clamp_min(1e-12).reciprocal() * format_max(f)).to(at::kFloat);
}

// x * scale in float32, clamped, cast: the bytes.
at::Tensor cast_bytes(const at::Tensor& x, const at::Tensor& scale, k::Float8Format f) {
  const double m = format_max(f);
  const auto type = f == k::Float8Format::kE4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
  return (x.to(at::kFloat) * scale).clamp(-m, m).to(type).view(at::kByte);
}

// The tensorwise cast: the amax, the scale and the bytes of the row-major result and of the
// transpose (in a wider buffer, whose extra columns stay as they were), tiles cut at the edges.
TEST_F(CudaKernelsEmulated, Float8CastEqualsTorchaosFormula) {
  in_each_grid([&](int64_t) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (auto format : {k::Float8Format::kE4M3, k::Float8Format::kE5M2}) {
        for (auto [rows, cols] :
             {std::pair{int64_t{70}, int64_t{45}}, std::pair{int64_t{33}, int64_t{64}}}) {
          const auto where = ::testing::Message()
                             << c10::toString(dtype) << " format " << static_cast<int>(format)
                             << " " << rows << " x " << cols;
          at::manual_seed(9);
          const auto x = stored(at::randn({rows, cols}) * 100, dtype);
          const int64_t ld_t = rows + 3;
          const auto out = in_every_order([&] {
            auto amax = guarded({1}, at::kFloat), scale = guarded({1}, at::kFloat);
            auto o = guarded({rows, cols}, at::kByte);
            auto ot = guarded({cols, ld_t}, at::kByte).fill_(0x55);
            const auto t = kernel_dtype(dtype);
            EXPECT_EQ(k::abs_max(t, x.data_ptr(), rows * cols, amax.data_ptr<float>(), nullptr),
                      cudaSuccess);
            EXPECT_EQ(
                k::float8_cast(t, format, x.data_ptr(), rows, cols, amax.data_ptr<float>(),
                               scale.data_ptr<float>(), o.data_ptr(), ot.data_ptr(), ld_t, nullptr),
                cudaSuccess);
            // The same scale given instead of the amax, the row-major result alone.
            auto o2 = guarded({rows, cols}, at::kByte);
            EXPECT_EQ(k::float8_cast(t, format, x.data_ptr(), rows, cols, nullptr,
                                     scale.data_ptr<float>(), o2.data_ptr(), nullptr, 0, nullptr),
                      cudaSuccess);
            // Four times that scale: the largest values saturate at the format's largest.
            auto scale4 = stored(scale * 4), o4 = guarded({rows, cols}, at::kByte);
            EXPECT_EQ(k::float8_cast(t, format, x.data_ptr(), rows, cols, nullptr,
                                     scale4.data_ptr<float>(), o4.data_ptr(), nullptr, 0, nullptr),
                      cudaSuccess);
            return std::vector<at::Tensor>{amax, scale, o, ot, o2, o4};
          });
          const auto amax = x.to(at::kFloat).abs().max().reshape({1});
          EXPECT_TRUE(out[0].equal(amax)) << where;
          const auto scale = scale_of(amax, format);
          EXPECT_TRUE(out[1].equal(scale)) << where;
          const auto bytes = cast_bytes(x, scale, format);
          EXPECT_TRUE(out[2].equal(bytes)) << where;
          EXPECT_TRUE(out[3].narrow(1, 0, rows).equal(bytes.t())) << where;
          EXPECT_TRUE((out[3].narrow(1, rows, 3) == 0x55).all().item<bool>()) << where;
          EXPECT_TRUE(out[4].equal(bytes)) << where;
          EXPECT_TRUE(out[5].equal(cast_bytes(x, scale * 4, format))) << where;
        }
      }
    }
  });
  // A NaN anywhere makes the amax NaN (the largest bits).
  auto x = stored(at::randn({100}));
  x[37] = NAN;
  auto amax = guarded({1}, at::kFloat);
  EXPECT_EQ(k::abs_max(k::DType::kFloat, x.data_ptr(), 100, amax.data_ptr<float>(), nullptr),
            cudaSuccess);
  EXPECT_TRUE(std::isnan(amax.item<float>()));
}

// The rowwise recipe's casts: a power-of-2 scale per row (axis 1) or per column (axis 0),
// exp2(floor(log2(scale))) in float32; a NaN in a slice makes its scale and its elements NaN.
TEST_F(CudaKernelsEmulated, Float8AxiswiseCastEqualsTheRowwiseRecipe) {
  in_each_grid([&](int64_t) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (int axis : {0, 1}) {
        const auto where = ::testing::Message() << c10::toString(dtype) << " axis " << axis;
        const auto format = k::Float8Format::kE4M3;
        at::manual_seed(10);
        const int64_t rows = 70, cols = 300;
        auto x = stored(at::randn({rows, cols}) * at::rand({rows, 1}) * 50, dtype);
        x[3][5] = NAN;
        x[7].zero_();  // an all-zero row: its amax is 0, the scale torchao's of 1e-12
        x.select(1, 11).zero_();
        const auto out = in_every_order([&] {
          auto scale = guarded({axis == 1 ? rows : cols}, at::kFloat);
          auto o = guarded({rows, cols}, at::kByte);
          EXPECT_EQ(k::float8_cast_axiswise(kernel_dtype(dtype), format, x.data_ptr(), rows, cols,
                                            axis, scale.data_ptr<float>(), o.data_ptr(), nullptr),
                    cudaSuccess);
          return std::vector<at::Tensor>{scale, o};
        });
        const auto amax = std::get<0>(x.to(at::kFloat).abs().max(axis, true));
        auto scale = scale_of(amax, format);
        scale = at::exp2(at::floor(at::log2(scale)));
        EXPECT_TRUE(at::allclose(out[0], scale.flatten(), 0, 0, /*equal_nan=*/true)) << where;
        EXPECT_TRUE(out[1].equal(cast_bytes(x, scale, format))) << where;
      }
    }
  });
}

// The cross-entropy rows: loss = logsumexp - the target's logit, the gradient (softmax - the
// one-hot where the target is here) * inv_count in place of the logits; rows not counted get 0
// and zeros; with lse and target given (the vocabulary split over ranks), the same.
TEST_F(CudaKernelsEmulated, CrossEntropyRowsEqualLogSoftmax) {
  in_each_grid([&](int64_t) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t vocab : {1000, 1001}) {
        for (bool given : {false, true}) {
          const auto where = ::testing::Message() << c10::toString(dtype) << " vocab " << vocab
                                                  << " lse given " << given;
          at::manual_seed(11);
          const int64_t rows = 6;
          const auto logits = stored(at::randn({rows, vocab}) * 4, dtype);
          const auto index = stored(at::randint(vocab, {rows}, at::kLong));
          const auto counted = stored(at::tensor({1, 1, 0, 1, 1, 1}, at::kInt).to(at::kBool));
          const auto here = stored(at::tensor({1, 1, 1, 0, 1, 1}, at::kInt).to(at::kBool));
          const auto inv_count = stored(at::full({1}, 0.2f, at::kFloat));
          const auto f = logits.to(at::kFloat);
          const auto lse = stored(at::logsumexp(f, 1));
          const auto target = stored(f.gather(1, index.unsqueeze(1)).squeeze(1));
          // The rows' losses, on a copy of the logits that the gradient (with `grad`) overwrites.
          const auto rows_of = [&](bool grad) {
            auto g = stored(logits);
            auto loss = guarded({rows}, at::kFloat);
            EXPECT_EQ(k::cross_entropy_rows(kernel_dtype(dtype), g.data_ptr(), rows, vocab,
                                            index.data_ptr<int64_t>(), here.data_ptr<bool>(),
                                            counted.data_ptr<bool>(), inv_count.data_ptr<float>(),
                                            given ? lse.data_ptr<float>() : nullptr,
                                            given ? target.data_ptr<float>() : nullptr,
                                            loss.data_ptr<float>(), grad, nullptr),
                      cudaSuccess);
            return std::pair{loss, g};
          };
          const auto out = in_every_order([&] {
            const auto [loss, g] = rows_of(true);
            // The loss alone: the logits are left as they are.
            const auto [loss_only, kept] = rows_of(false);
            EXPECT_TRUE(kept.equal(logits));
            return std::vector<at::Tensor>{loss, g, loss_only};
          });
          const auto one_hot = at::one_hot(index, vocab).to(at::kFloat) * here.unsqueeze(1);
          const auto keep = counted.to(at::kFloat);
          const auto grad = ((at::softmax(f, 1) - one_hot) * 0.2 * keep.unsqueeze(1)).to(dtype);
          EXPECT_LT(rel_diff(out[0], (lse - target) * keep), 1e-6) << where;
          EXPECT_LT(rel_diff(out[1], grad), tolerance(dtype)) << where;
          EXPECT_TRUE((out[1][2] == 0).all().item<bool>()) << where;
          EXPECT_TRUE(out[2].equal(out[0])) << where;
        }
      }
    }
  });
}

// The emulator itself: what it refuses, and a race it shows. Toy kernels.

// Thread i writes its slot, then reads its neighbour's: without the barrier between (`synced`
// false) a race; with it, every order gives the neighbour's index.
__global__ void neighbour_kernel(int* out, bool synced) {
  int* slots = cuda_emulator::dynamic_shared<int>();
  slots[threadIdx.x] = static_cast<int>(threadIdx.x);
  if (synced) __syncthreads();
  out[threadIdx.x] = slots[(threadIdx.x + 1) % blockDim.x];
}

// Block b writes out[b] from out[b - 1], block b - 1's result: no order between blocks
// guarantees that on a GPU.
__global__ void chained_blocks_kernel(int* out) {
  if (threadIdx.x == 0) out[blockIdx.x] = blockIdx.x == 0 ? 1 : out[blockIdx.x - 1] + 1;
}

// Each thread copies its element: launched with one thread more than `in` has elements.
__global__ void copy_kernel(const int* in, int* out) { out[threadIdx.x] = in[threadIdx.x]; }

// Thread i reads slot i of a static shared array that thread 0 writes at its first slot only.
__global__ void static_shared_kernel(unsigned* out) {
  __shared__ unsigned slots[4];
  if (threadIdx.x == 0) slots[0] = 7;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = slots[threadIdx.x];
}

// A warp's sum by shuffles, as the kernels' reductions do.
__global__ void warp_sum_kernel(int* out, int lane_mask_limit) {
  int v = static_cast<int>(threadIdx.x);
  for (int o = lane_mask_limit; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x] = v;
}

// Half of a warp at a shuffle, the other half at __syncthreads: a hang on a GPU.
__global__ void split_warp_kernel(int* out) {
  if (threadIdx.x % 32 < 16) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
  } else {
    __syncthreads();
  }
}

// Odd lanes end before the warp's shuffle.
__global__ void ended_lanes_kernel(int* out) {
  if (threadIdx.x % 2 == 1) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 2);
}

TEST(CudaEmulator, ShowsARaceAndNotItsFix) {
  auto run = [](bool synced, cuda_emulator::Order order) {
    cuda_emulator::set_order(order);
    auto out = at::empty({64}, at::kInt);
    cuda_emulator::launch(neighbour_kernel, 1, 64, 64 * sizeof(int), nullptr, out.data_ptr<int>(),
                          synced);
    cuda_emulator::set_order(cuda_emulator::Order::in_index_order);
    return out;
  };
  using cuda_emulator::Order;
  EXPECT_FALSE(run(false, Order::in_index_order).equal(run(false, Order::reversed)));
  const auto expected = (at::arange(64, at::kInt) + 1) % 64;
  for (auto order : {Order::in_index_order, Order::reversed, Order::warp_by_warp}) {
    EXPECT_TRUE(run(true, order).equal(expected));
  }
}

// The reversed orders run the blocks from the last: a block that reads another's result shows.
TEST(CudaEmulator, ShowsABlockReadingAnotherBlocksWrite) {
  auto run = [](cuda_emulator::Order order) {
    cuda_emulator::set_order(order);
    auto out = at::zeros({4}, at::kInt);
    cuda_emulator::launch(chained_blocks_kernel, 4, 32, 0, nullptr, out.data_ptr<int>());
    cuda_emulator::set_order(cuda_emulator::Order::in_index_order);
    return out;
  };
  using cuda_emulator::Order;
  EXPECT_TRUE(run(Order::in_index_order).equal(at::arange(1, 5, at::kInt)));
  for (auto order : {Order::reversed, Order::warps_reversed}) {
    EXPECT_FALSE(run(order).equal(run(Order::in_index_order)));
  }
}

// A read one element past a guarded buffer's end stops the program, naming it.
TEST(CudaEmulatorDeathTest, StopsAtAReadPastABuffersEnd) {
  const auto in = stored(at::arange(32, at::kInt));
  auto out = guarded({64}, at::kInt);
  cuda_emulator::launch(copy_kernel, 1, 32, 0, nullptr, in.data_ptr<int>(), out.data_ptr<int>());
  EXPECT_TRUE(out.narrow(0, 0, 32).equal(in));
  EXPECT_DEATH(cuda_emulator::launch(copy_kernel, 1, 33, 0, nullptr, in.data_ptr<int>(),
                                     out.data_ptr<int>()),
               "byte 0 past the end of a buffer of 128 bytes");
}

// Static shared memory starts as 0xff bytes in every block, as the dynamic part does: what the
// previous block left there does not show through.
TEST(CudaEmulator, StaticSharedMemoryStartsUnwrittenInEveryBlock) {
  auto out = at::zeros({8}, at::kInt);
  auto* p = reinterpret_cast<unsigned*>(out.data_ptr<int>());
  cuda_emulator::launch(static_shared_kernel, 2, 4, 0, nullptr, p);
  for (int block = 0; block < 2; ++block) {
    EXPECT_EQ(p[block * 4], 7u);
    for (int i = 1; i < 4; ++i) EXPECT_EQ(p[block * 4 + i], 0xffffffffu) << block << " " << i;
  }
}

TEST(CudaEmulator, ShufflesExchangeWithinTheWarp) {
  auto out = at::empty({64}, at::kInt);
  cuda_emulator::launch(warp_sum_kernel, 1, 64, 0, nullptr, out.data_ptr<int>(), 16);
  // Each warp's lanes all hold the sum of its indices: 0..31 and 32..63.
  EXPECT_TRUE(out.narrow(0, 0, 32).eq(496).all().item<bool>());
  EXPECT_TRUE(out.narrow(0, 32, 32).eq(1520).all().item<bool>());
  EXPECT_THROW(cuda_emulator::launch(warp_sum_kernel, 1, 32, 0, nullptr, out.data_ptr<int>(), 32),
               std::runtime_error);  // a lane mask past the warp
}

TEST(CudaEmulator, RefusesWhatHangsOrFailsOnAGpu) {
  auto out = at::zeros({1024}, at::kInt);
  EXPECT_THROW(cuda_emulator::launch(split_warp_kernel, 1, 64, 0, nullptr, out.data_ptr<int>()),
               std::runtime_error);
  EXPECT_THROW(cuda_emulator::launch(ended_lanes_kernel, 1, 32, 0, nullptr, out.data_ptr<int>()),
               std::runtime_error);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cuda_emulator::launch(neighbour_kernel, 1, 1025, 0, nullptr, out.data_ptr<int>(), true);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  cuda_emulator::launch(neighbour_kernel, 1, 32, 48 * 1024 + 1, nullptr, out.data_ptr<int>(), true);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once
}

}  // namespace
}  // namespace fsdp::testing::cuda_emulated_test
