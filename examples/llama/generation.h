// llama_generate's job: generation after prompt ids, or after a text (with --chat, through the
// model's chat template), on every rank (the units gather as in training, every rank draws the
// same tokens); rank 0 prints the new ids, their text, and the time.
#pragma once

#include <cstdint>
#include <vector>

#include "llama_build.h"
#include "llama_options.h"

namespace llama {

// Generates as `o` says with the built model; returns the exit code. Collective.
int generate(const Options& o, Built& b, const fsdp::Distributed& dist);

}  // namespace llama
