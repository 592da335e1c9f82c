#include "fsdp/errors.h"

#include <fmt/format.h>

namespace fsdp {

CommError::CommError(std::string backend, std::string op, int rank, int world_size,
                     std::string cause)
    : Error(fmt::format("[{} rank {}/{}] {} failed: {}", backend, rank, world_size, op, cause)),
      backend_(std::move(backend)),
      op_(std::move(op)),
      rank_(rank),
      world_size_(world_size),
      cause_(std::move(cause)) {}

}  // namespace fsdp
