// Internal: small formatting helpers shared by error messages.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::detail {

// "[4, 16]": a shape as error messages print it.
inline std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace fsdp::detail
