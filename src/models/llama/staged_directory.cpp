#include "llama/staged_directory.h"

#include <fmt/format.h>

#include "fsdp/errors.h"
#include "fsdp/io/files.h"

namespace fsdp::models::llama::detail {

void check_export_dtype(c10::ScalarType t) {
  if (t != c10::kFloat && t != c10::kBFloat16 && t != c10::kHalf) {
    throw CheckpointError(
        fmt::format("dtype {} is not one of float32, bfloat16, float16", c10::toString(t)));
  }
}

void check_new_directory(const std::string& dir) {
  if (io::path_exists(dir) && (!io::is_directory(dir) || !io::list_directory(dir).empty())) {
    throw CheckpointError(fmt::format(
        "{} exists and is not an empty directory: nothing a user saved is overwritten", dir));
  }
}

std::string make_staging_directory(const std::string& dir) {
  io::make_directories(io::parent_directory(dir));
  std::string staged = io::staging_path(dir);
  io::remove_tree(staged);
  io::make_directories(staged);
  return staged;
}

void discard_staged(const std::string& staged) noexcept {
  if (staged.empty()) return;
  try {
    io::remove_tree(staged);
  } catch (const std::exception&) {
    // The caller's error is the one to report.
  }
}

void publish_staged(const std::string& staged, const std::string& dir,
                    const std::function<void()>& write) {
  try {
    write();
    io::publish(staged, dir);
  } catch (const std::exception& e) {
    std::string message = e.what();
    try {
      io::remove_tree(staged);
    } catch (const std::exception& removing) {
      message += fmt::format(" (and removing {} failed: {})", staged, removing.what());
    }
    throw CheckpointError(message);
  }
}

}  // namespace fsdp::models::llama::detail
