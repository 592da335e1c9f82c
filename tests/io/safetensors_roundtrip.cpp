// safetensors_roundtrip IN OUT: reads IN with fsdp's reader and writes it to OUT with fsdp's
// writer (metadata kept); tests/io/safetensors_interop.py drives it against Python's library.
#include <iostream>

#include "fsdp/io/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: safetensors_roundtrip IN OUT\n";
    return 2;
  }
  try {
    std::map<std::string, std::string> metadata;
    auto tensors = fsdp::read_safetensors(argv[1], &metadata);
    fsdp::write_safetensors(argv[2], tensors, metadata);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
