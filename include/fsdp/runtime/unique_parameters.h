// A module's parameters with each tensor once.
#pragma once

#include <torch/nn/module.h>

#include <vector>

namespace fsdp {

// The module's parameters, each tensor once, in first-registration order. libtorch's
// Module::parameters() lists a tensor registered under several names (a tied embedding and
// output head) once per name, and an optimizer given that list steps it once per name.
std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module);

}  // namespace fsdp
