// Internal: an identity autograd function placed on a unit's forward inputs. Its backward runs
// once the gradient has flowed through the whole unit, which is when the unit's full
// parameters (frozen ones included) are no longer needed: FSDP2's RegisterPostBackwardFunction.
#pragma once

#include <ATen/ATen.h>

#include <functional>

namespace fsdp::detail {

// Returns `input` routed through the function; `on_backward` runs in its backward (on the
// thread running backward). Only for inputs that require grad, with grad mode on.
at::Tensor attach_post_backward(const at::Tensor& input, std::function<void()> on_backward);

}  // namespace fsdp::detail
