#include "runtime/post_backward_function.h"

#include <torch/csrc/autograd/custom_function.h>

namespace fsdp::detail {
namespace {

// The callback lives in the node's context (a capsule), so it goes with its graph: a graph
// that never runs backward leaves nothing behind.
struct Callback : torch::CustomClassHolder {
  explicit Callback(std::function<void()> f) : fn(std::move(f)) {}
  std::function<void()> fn;
};

struct PostBackward : public torch::autograd::Function<PostBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            c10::intrusive_ptr<Callback> callback) {
    ctx->saved_data["callback"] = c10::IValue::make_capsule(std::move(callback));
    return input;  // identity: the output keeps this node as its grad_fn
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto callback =
        c10::static_intrusive_pointer_cast<Callback>(ctx->saved_data["callback"].toCapsule());
    // Once per graph: a graph kept (retain_graph) and run again must not run it twice.
    if (auto fn = std::move(callback->fn)) {
      callback->fn = nullptr;
      fn();
    }
    return {grads[0], at::Tensor()};
  }
};

}  // namespace

at::Tensor attach_post_backward(const at::Tensor& input, std::function<void()> on_backward) {
  return PostBackward::apply(input, c10::make_intrusive<Callback>(std::move(on_backward)));
}

}  // namespace fsdp::detail
