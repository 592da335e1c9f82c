// The identity of the frozen weights a LoRA run trains its adapters on. Its checkpoints hold the
// adapters alone (fsdp::SaveOptions::filter), so a resume reads the frozen weights again from
// --hf-dir (or builds them again from --config/--preset and --seed): the checkpoint records
// this fingerprint, and a resume whose base model gives another is refused by name instead of
// pairing the adapters with weights they were not trained on.
#pragma once

#include <string>

#include "llama_options.h"

namespace llama {

struct BaseModel {
  std::string fingerprint;  // what is compared: "crc32:xxxxxxxx" of what names the weights
  std::string what;         // for messages: the directory, preset or config, and the seed
};

// --hf-dir: CRC-32 of config.json and, for each *.safetensors file in name order, its name,
// size and first and last MiB (local, no communication; the same at every world size).
// --config: of the file and --seed; --preset: of the name and --seed. IoError when a file
// cannot be read.
BaseModel base_model(const Options& o);

}  // namespace llama
