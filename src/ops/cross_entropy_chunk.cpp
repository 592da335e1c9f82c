#include "ops/cross_entropy_chunk.h"

#include <fmt/format.h>

#include <limits>

#include "fsdp/errors.h"

#ifdef FSDP_HAVE_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>  // getCurrentCUDABlasHandle
#include <c10/cuda/CUDAGuard.h>
#include <cublas_v2.h>

#include "ops/cuda/cross_entropy_kernels.h"
#include "ops/cuda_dispatch.h"
#endif

namespace fsdp::ops::detail {
namespace {

ChunkLoss chunk_cross_entropy_twin(const at::Tensor& logits_in, const ChunkRows& r,
                                   bool want_grad) {
  const auto logits = logits_in.to(at::kFloat);
  at::Tensor lse = r.lse, target = r.target;
  if (!lse.defined()) {
    lse = at::logsumexp(logits, 1);
    target = logits.gather(1, r.index.unsqueeze(1)).squeeze(1);
  }
  const auto counted = r.counted.to(at::kFloat);
  ChunkLoss out{((lse - target) * counted).sum(), {}};
  if (!want_grad) return out;
  // d loss / d logits: (softmax - one-hot) / count on counted rows, zero elsewhere; the one-hot
  // only where this rank holds the target's column.
  auto g = (logits - lse.unsqueeze(1)).exp_();
  if (logits.size(1) > 0) {
    g.scatter_add_(1, r.index.unsqueeze(1), -r.here.to(at::kFloat).unsqueeze(1));
  }
  g.mul_((counted * r.inv_count).unsqueeze(1));
  out.grad = g.to(logits_in.scalar_type());
  return out;
}

#ifdef FSDP_HAVE_CUDA_KERNELS
ChunkLoss chunk_cross_entropy_kernel(const at::Tensor& logits_in, const ChunkRows& r,
                                     bool want_grad) {
  auto logits = logits_in.contiguous();  // the GEMM's output already is
  const auto index = r.index.contiguous(), here = r.here.contiguous();
  const auto counted = r.counted.contiguous();
  at::Tensor lse, target;
  if (r.lse.defined()) {
    lse = r.lse.contiguous();
    target = r.target.contiguous();
  }
  auto loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  const c10::cuda::CUDAGuard guard(logits.device());
  check_launch(cuda::cross_entropy_rows(*kernel_dtype(logits.scalar_type()), logits.data_ptr(),
                                        logits.size(0), logits.size(1), index.data_ptr<int64_t>(),
                                        here.data_ptr<bool>(), counted.data_ptr<bool>(),
                                        r.inv_count.data_ptr<float>(),
                                        lse.defined() ? lse.data_ptr<float>() : nullptr,
                                        target.defined() ? target.data_ptr<float>() : nullptr,
                                        loss.data_ptr<float>(), want_grad, stream_of(logits)),
               "linear_cross_entropy");
  return {loss.sum(), want_grad ? logits : at::Tensor()};
}

// Row-major grad_w [V, d] += g^T [V, k] @ h [k, d], seen by column-major cuBLAS as
// grad_w^T [d, V] += h^T [d, k] @ g [k, V]: h as stored (d x k, leading dimension d), g as
// stored and transposed (stored V x k, leading dimension V), both 16-bit, summed in float32.
void gemm_accumulate_float32(at::Tensor& grad_w, const at::Tensor& g_in, const at::Tensor& h_in) {
  const auto g = g_in.contiguous(), h = h_in.contiguous();
  const int64_t d = h.size(1), v = g.size(1), k = g.size(0);
  // A rank of a split vocabulary may hold no rows: nothing to add (and cuBLAS refuses a
  // leading dimension of 0).
  if (d == 0 || v == 0 || k == 0) return;
  TORCH_INTERNAL_ASSERT(grad_w.is_contiguous() && grad_w.scalar_type() == at::kFloat &&
                        grad_w.device() == g.device() && grad_w.size(0) == v &&
                        grad_w.size(1) == d);
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (d > kMax || v > kMax || k > kMax) {  // cuBLAS takes int sizes
    grad_w.add_(at::mm(g.t(), h));
    return;
  }
  const auto type = g.scalar_type() == at::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  const float one = 1.0f;
  const c10::cuda::CUDAGuard guard(grad_w.device());
  // The current stream's handle, with PyTorch's workspace (getCurrentCUDABlasHandle sets both).
  const auto status = cublasGemmEx(at::cuda::getCurrentCUDABlasHandle(), CUBLAS_OP_N, CUBLAS_OP_T,
                                   static_cast<int>(d), static_cast<int>(v), static_cast<int>(k),
                                   &one, h.data_ptr(), type, static_cast<int>(d), g.data_ptr(),
                                   type, static_cast<int>(v), &one, grad_w.data_ptr(), CUDA_R_32F,
                                   static_cast<int>(d), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw fsdp::Error(fmt::format(
        "fsdp::ops::linear_cross_entropy: cuBLAS failed to add the weight's gradient ([{}, {}] "
        "+= [{}, {}]^T [{}, {}]): {} ({})",
        v, d, k, v, k, d, cublasGetStatusName(status), cublasGetStatusString(status)));
  }
}
#endif

}  // namespace

bool chunk_kernel_runs_on(const at::Tensor& logits) {
#ifdef FSDP_HAVE_CUDA_KERNELS
  return logits.size(1) > 0 && kernels_run_on(logits);
#else
  (void)logits;
  return false;
#endif
}

ChunkLoss chunk_cross_entropy(const at::Tensor& logits, const ChunkRows& rows, bool want_grad) {
#ifdef FSDP_HAVE_CUDA_KERNELS
  if (chunk_kernel_runs_on(logits)) return chunk_cross_entropy_kernel(logits, rows, want_grad);
#endif
  return chunk_cross_entropy_twin(logits, rows, want_grad);
}

void accumulate_weight_grad(at::Tensor& grad_w, const at::Tensor& grad, const at::Tensor& hidden) {
  if (hidden.scalar_type() == at::kFloat) {
    grad_w.addmm_(grad.t(), hidden);
    return;
  }
#ifdef FSDP_HAVE_CUDA_KERNELS
  if (kernels_run_on(hidden)) {  // a kernel dtype that is not float32: bf16 or half
    gemm_accumulate_float32(grad_w, grad, hidden);
    return;
  }
#endif
  grad_w.add_(at::mm(grad.t(), hidden));
}

}  // namespace fsdp::ops::detail
