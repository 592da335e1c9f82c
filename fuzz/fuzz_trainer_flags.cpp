// Fuzz target: the MiniLLM trainer's command line (minillm::parse_options). The input is the
// arguments separated by NUL bytes, the first byte picking the world size (1-8); the parser
// must return options or an exit code with a message, never crash or throw.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "minillm_options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int world = 1 + data[0] % 8;
  std::vector<std::string> args{"train_minillm"};
  std::string current;
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (!current.empty()) args.push_back(current);
  if (args.size() > 64) return 0;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto result = minillm::parse_options(static_cast<int>(args.size()), argv.data(), world);
  if (result.options) {
    const auto& o = *result.options;
    const auto& t = o.train;
    // Accepted options must be runnable: a batch that splits over the ranks, positive sizes.
    if (t.batch <= 0 || t.batch % world != 0 || t.seq <= 0 || t.steps < 0 || o.model.dim <= 0 ||
        o.model.layers <= 0 || o.model.heads <= 0 || o.model.dim % o.model.heads != 0) {
      std::abort();
    }
  } else if (result.exit_code != 0 && result.message.empty()) {
    std::abort();  // an error without a message
  }
  return 0;
}
