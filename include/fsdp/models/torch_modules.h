// The libtorch headers the models' public headers need: the module base and the modules the
// models hold (Linear, Embedding, Sequential). Not libtorch's umbrella <torch/torch.h>: its
// every module, optimizer and data header costs about 7.5 s of compilation (template
// instantiation, which a precompiled header does not save) in each source that includes it.
//
// The models' headers of 0.2.0 included <torch/torch.h>, and a program may use what it
// brought without including it itself: the umbrella stays for such programs, unless they define
// FSDP_LEAN_HEADERS. This project's own sources define it and include what they use.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#ifndef FSDP_LEAN_HEADERS
#include <torch/torch.h>
#endif
