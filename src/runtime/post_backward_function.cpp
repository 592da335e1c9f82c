#include "runtime/post_backward_function.h"

#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace fsdp::detail {
namespace {

// Callbacks by id: AutogradContext stores IValues, and an int64 id is the portable way to
// reach a C++ callback from backward in libtorch.
class CallbackTable {
 public:
  int64_t add(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t id = next_++;
    table_.emplace(id, std::move(fn));
    return id;
  }
  std::function<void()> take(int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = table_.find(id);
    if (it == table_.end()) return nullptr;
    auto fn = std::move(it->second);
    table_.erase(it);
    return fn;
  }

 private:
  std::mutex mu_;
  int64_t next_ = 0;
  std::unordered_map<int64_t, std::function<void()>> table_;
};

CallbackTable& callbacks() {
  static CallbackTable t;
  return t;
}

struct PostBackward : public torch::autograd::Function<PostBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            int64_t id) {
    ctx->saved_data["id"] = id;
    return input;  // identity: the output keeps this node as its grad_fn
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (auto fn = callbacks().take(ctx->saved_data["id"].toInt())) fn();
    return {grads[0], at::Tensor()};
  }
};

}  // namespace

at::Tensor attach_post_backward(const at::Tensor& input, std::function<void()> on_backward) {
  // A graph that is never run backward leaves its entry here; entries are a few bytes and the
  // owning unit state is held weakly by the callback.
  int64_t id = callbacks().add(std::move(on_backward));
  return PostBackward::apply(input, id);
}

}  // namespace fsdp::detail
