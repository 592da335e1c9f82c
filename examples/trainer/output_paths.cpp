#include "output_paths.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/errors.h"
#include "fsdp/io/files.h"

namespace trainer {
namespace {

// Whether this process writes the files rank 0 alone writes (set_output_rank).
bool writer_rank = true;

// POSIX, not std::filesystem: libtorch.so exports its own copies of some of its functions
// (fsdp/io/files.h).
bool stat_of(const std::string& path, struct stat& st) { return ::stat(path.c_str(), &st) == 0; }

// The error for writing entries into the directory `dir` (made if missing, as the run will):
// its nearest existing ancestor must be a directory this process can write.
std::string check_directory_writable(const char* flag, const std::string& shown,
                                     const std::string& dir) {
  std::string at = dir.empty() ? "." : fsdp::io::without_trailing_slash(dir);
  struct stat st {};
  while (!stat_of(at, st)) {
    if (errno != ENOENT) {
      return fmt::format("{} {}: cannot use {}: {}", flag, shown, at, std::strerror(errno));
    }
    const std::string up = fsdp::io::parent_directory(at);
    if (up == at) break;
    at = up;
  }
  if (!S_ISDIR(st.st_mode)) {
    return fmt::format("{} {}: {} is not a directory", flag, shown, at);
  }
  // access(2) also says EROFS for a read-only mount, to root too.
  if (::access(at.c_str(), W_OK | X_OK) != 0) {
    return fmt::format("{} {}: cannot write in {}: {}", flag, shown, at, std::strerror(errno));
  }
  return "";
}

}  // namespace

void set_output_rank(int rank) { writer_rank = rank == 0; }

std::string check_writable_file(const char* flag, const std::string& path) {
  if (!writer_rank) return "";
  struct stat st {};
  if (stat_of(path, st)) {
    if (S_ISDIR(st.st_mode)) {
      return fmt::format("{} {}: is a directory; give the path of a file", flag, path);
    }
    // The file itself (/dev/stdout, a pipe): its directory need not be writable.
    if (::access(path.c_str(), W_OK) != 0) {
      return fmt::format("{} {}: cannot write it: {}", flag, path, std::strerror(errno));
    }
    return "";
  }
  return check_directory_writable(flag, path, fsdp::io::parent_directory(path));
}

std::string check_new_file(const char* flag, const std::string& path) {
  if (!writer_rank) return "";
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    return fmt::format(
        "{} {}: exists already; give a new path (nothing a user saved is "
        "overwritten)",
        flag, path);
  }
  return check_writable_file(flag, path);
}

std::string check_new_directory(const char* flag, const std::string& path) {
  if (!writer_rank) return "";
  return check_directory_writable(
      flag, path, fsdp::io::parent_directory(fsdp::io::without_trailing_slash(path)));
}

std::string check_save_dir(const TrainOptions& o) {
  if (o.save_dir.empty()) return "";
  struct stat st {};
  if (stat_of(o.save_dir, st) && !S_ISDIR(st.st_mode)) {
    return fmt::format("--save-dir {}: is not a directory", o.save_dir);
  }
  if (auto err = check_directory_writable("--save-dir", o.save_dir, o.save_dir); !err.empty()) {
    return err;
  }
  if (o.eval_only) return "";
  try {
    const auto latest = fsdp::latest_checkpoint(o.save_dir);  // a damaged newest one: an error
    if (latest && !o.resume) {
      return fmt::format(
          "--save-dir {} holds checkpoints already (the newest: {}): add --resume to go on "
          "from it, or give another --save-dir (this run's checkpoints would mix with those)",
          o.save_dir, *latest);
    }
  } catch (const fsdp::CheckpointError& e) {
    return fmt::format("--save-dir {}: {}", o.save_dir, e.what());
  }
  return "";
}

}  // namespace trainer
