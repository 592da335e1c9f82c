// Fuzz target: the launch environment parser (fsdp::detect_launch). The input is lines of
// NAME=VALUE; the parser must either return a LaunchInfo that satisfies its invariants or
// throw LaunchError, never crash or throw anything else.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "fsdp/errors.h"
#include "fsdp/launch/launch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> env;
  std::string text(reinterpret_cast<const char*>(data), size);
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    at = end + 1;
  }
  auto lookup = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  try {
    const auto info = fsdp::detect_launch(lookup);
    if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size ||
        info.local_rank < 0 || info.master_port < 0 || info.master_port > 65535 ||
        info.restart_count < 0) {
      std::abort();  // accepted an impossible launch
    }
  } catch (const fsdp::LaunchError&) {
  }
  return 0;
}
