// The part of libtorch's C++ API the tests use: tensors, autograd, the optimizers, the
// functional ops, init, the modules they build models from, CUDA's queries. Instead of the
// umbrella <torch/torch.h>, whose every module header costs a test file about 3.5 s more of
// compilation (template instantiation, which the precompiled header does not save).
#pragma once

#include <torch/cuda.h>
#include <torch/nn/functional.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/utils.h>
#include <torch/optim.h>
#include <torch/types.h>
#include <torch/utils.h>
