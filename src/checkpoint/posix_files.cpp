#include "checkpoint/posix_files.h"

#include <dirent.h>
#include <fmt/format.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "fsdp/checkpoint/checkpoint.h"

namespace fsdp::detail {
namespace {

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path) == 0 ? 0 : -1;
}

}  // namespace

std::string os_error() { return std::strerror(errno); }

bool path_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_directories(const std::string& path) {
  if (path.empty() || is_directory(path)) return;
  const auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) make_directories(path.substr(0, slash));
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    throw CheckpointError(fmt::format("cannot create directory {}: {}", path, os_error()));
  }
}

void remove_tree(const std::string& path) {
  if (!path_exists(path)) return;
  if (::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    throw CheckpointError(fmt::format("cannot remove {}: {}", path, os_error()));
  }
}

std::vector<std::string> list_directory(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(path.c_str());
  if (!dir) return names;
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  return names;
}

void rename_path(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    throw CheckpointError(fmt::format("cannot rename {} to {}: {}", from, to, os_error()));
  }
}

}  // namespace fsdp::detail
